"""MI proxies from cross-scoring matrices, the regime classifier and the Echo Trap monitor."""

from __future__ import annotations

import io
import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vagen.diagnostics import (
    REGIMES,
    classify_regime,
    default_mi_threshold,
    echo_trap_init,
    echo_trap_update,
    mi_metrics,
)
from vagen.diagnostics.mi import EMA_KEY, expected_hit_at_k, miss_probability
from vagen.trainer.monitor import DiagnosticsMonitor


def softplus_log(x: float) -> float:
    return math.log1p(math.exp(x))


# ----------------------------------------------------------------------------- hand-worked examples


def test_two_by_two_example_every_key():
    # Summed scores; z0 has 2 tokens, z1 has 1: per-token rows are z0 [0, -1], z1 [-3, -1].
    scores = torch.tensor([[0.0, -2.0], [-3.0, -1.0]])
    metrics, state = mi_metrics(scores, torch.tensor([2, 1]), torch.tensor([0, 1]))
    log2 = math.log(2)
    marginal = [softplus_log(-1) - log2, -1 + softplus_log(-2) - log2]  # logsumexp − log B per row
    matched = [0.0, -1.0]
    mi = ((matched[0] - marginal[0]) + (matched[1] - marginal[1])) / 2
    seq_marginal = [softplus_log(-2) - log2, -1 + softplus_log(-2) - log2]
    mi_seq = ((0.0 - seq_marginal[0]) + (-1.0 - seq_marginal[1])) / 2
    marginal_std = abs(marginal[0] - marginal[1]) / 2  # population std of two values
    expected = {
        "retrieval_acc": 1.0,  # both rows peak on their own prompt
        "retrieval_chance": 0.5,
        "mi_est": mi,
        "mi_seq_est": mi_seq,
        "mi_upper_bound": log2,
        "mi_zscore": mi / (marginal_std + 1e-3),
        "mi_zscore_ema": mi / (marginal_std + 1e-3),  # the first call initialises the EMA with this std
        "h_cond_est": 0.5,
        "h_marg_est": -(marginal[0] + marginal[1]) / 2,
    }
    assert set(metrics) == set(expected)  # recall@2/4/8 skipped: k >= B = 2
    for name, value in expected.items():
        assert metrics[name].item() == pytest.approx(value, rel=1e-6), name
        assert metrics[name].dtype == torch.float32 and metrics[name].shape == ()
    assert metrics["mi_est"].item() == pytest.approx(metrics["h_marg_est"].item() - metrics["h_cond_est"].item())
    assert state[EMA_KEY].item() == pytest.approx(marginal_std) and state["num_updates"].item() == 1


def test_three_by_three_retrieval_and_recall():
    row = [-1.0, -2.0, -3.0]  # every sample prefers prompt 0, then 1, then 2
    scores = torch.tensor([row, row, row])
    metrics, _ = mi_metrics(scores, torch.ones(3), torch.tensor([0, 1, 2]), recall_ks=(2, 4, 8))
    assert metrics["retrieval_acc"].item() == pytest.approx(1 / 3)  # only z0 ranks its source first
    assert metrics["recall@2"].item() == pytest.approx(2 / 3)  # z0 and z1 within the top two
    assert metrics["retrieval_chance"].item() == pytest.approx(1 / 3)
    assert metrics["recall@2_chance"].item() == pytest.approx(2 / 3)
    assert "recall@4" not in metrics and "recall@8" not in metrics
    assert metrics["mi_upper_bound"].item() == pytest.approx(math.log(3))
    # Every row has the same marginal m; matched is −1, −2, −3. MI is negative: two of the three samples
    # are likelier under another prompt than under their own.
    marginal = -1 + math.log(1 + math.exp(-1) + math.exp(-2)) - math.log(3)
    assert metrics["mi_est"].item() == pytest.approx(-2 - marginal, rel=1e-6)
    assert metrics["mi_zscore"].item() == pytest.approx((-2 - marginal) / 1e-3, rel=1e-5)  # std of marginal is 0


def test_exact_ties_count_as_random_tie_breaking():
    scores = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -5.0, -5.0]])
    correct = torch.tensor([[False, False, True, False], [True, False, False, False]])
    hit1 = expected_hit_at_k(scores, correct, 1)
    hit2 = expected_hit_at_k(scores, correct, 2)
    assert hit1.tolist() == pytest.approx([1 / 4, 1 / 2])  # four-way tie; two-way tie holding the source
    assert hit2.tolist() == pytest.approx([1 / 2, 1.0])


def test_miss_probability_matches_combinatorics():
    for pool in range(1, 9):
        for marked in range(pool + 1):
            for draws in range(pool + 1):
                expected = math.comb(pool - marked, draws) / math.comb(pool, draws)
                got = miss_probability(torch.tensor(pool), torch.tensor(marked), torch.tensor(draws)).item()
                assert got == pytest.approx(expected, abs=1e-12)


def test_identical_prompts_count_as_the_source():
    # Prompts 0 and 1 are the same state; z0 (from prompt 0) peaks on prompt 1: correct.
    scores = torch.tensor([[-2.0, -1.0, -3.0], [-3.0, -2.0, -1.0]])
    source = torch.tensor([0, 2])
    with_ids, _ = mi_metrics(scores, torch.ones(2), source, prompt_ids=torch.tensor([5, 5, 7]))
    without_ids, _ = mi_metrics(scores, torch.ones(2), source)
    assert without_ids["retrieval_acc"].item() == pytest.approx(0.5)
    assert with_ids["retrieval_acc"].item() == pytest.approx(1.0)
    # Chance: z0 has 2 of 3 prompts correct, z1 has 1 of 3. Recall@2: z0 can't miss; z1 1 − C(2,2)/C(3,2).
    assert with_ids["retrieval_chance"].item() == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert with_ids["recall@2_chance"].item() == pytest.approx((1 + 2 / 3) / 2)
    assert with_ids["mi_upper_bound"].item() == pytest.approx((math.log(3 / 2) + math.log(3)) / 2)
    assert with_ids["mi_est"] == without_ids["mi_est"]  # MI itself is defined on columns, not ids


# ----------------------------------------------------------------------------- synthetic policies


def _batch(num_prompts: int, per_prompt: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    generator = torch.Generator().manual_seed(seed)
    source = torch.arange(num_prompts).repeat_interleave(per_prompt)  # (Z,)
    lengths = torch.randint(5, 40, (source.numel(),), generator=generator)
    return source, lengths, generator


def test_input_ignoring_policy_reads_at_chance_with_zero_mi():
    source, lengths, generator = _batch(num_prompts=16, per_prompt=8, seed=0)
    per_token_base = -2.0 + 0.5 * torch.randn(source.numel(), 1, generator=generator)  # z's own likelihood
    noise = 1e-3 * torch.randn(source.numel(), 16, generator=generator)  # the prompt barely matters
    scores = (per_token_base + noise) * lengths[:, None]
    metrics, _ = mi_metrics(scores, lengths, source)
    assert abs(metrics["retrieval_acc"].item() - 1 / 16) < 0.08
    assert abs(metrics["recall@8"].item() - 0.5) < 0.15
    assert abs(metrics["mi_est"].item()) < 1e-4
    assert abs(metrics["mi_seq_est"].item()) < 0.05 * math.log(16)
    # With no noise at all the estimates are exact: chance retrieval, zero MI.
    exact, _ = mi_metrics(per_token_base.expand(-1, 16) * lengths[:, None], lengths, source)
    assert exact["retrieval_acc"].item() == pytest.approx(1 / 16)
    assert exact["recall@4"].item() == pytest.approx(4 / 16)
    assert exact["mi_est"].item() == pytest.approx(0.0, abs=1e-6)


def test_input_dependent_policy_retrieves_perfectly_and_reaches_log_b():
    source, lengths, generator = _batch(num_prompts=16, per_prompt=4, seed=1)
    per_token = -2.0 + 0.1 * torch.randn(source.numel(), 16, generator=generator)
    per_token[torch.arange(source.numel()), source] += 30.0  # the source prompt explains z far better
    metrics, _ = mi_metrics(per_token * lengths[:, None], lengths, source)
    assert metrics["retrieval_acc"] == 1 and metrics["recall@2"] == 1
    assert metrics["retrieval_chance"].item() == pytest.approx(1 / 16)
    assert metrics["mi_est"].item() == pytest.approx(math.log(16), rel=1e-6)
    assert metrics["mi_seq_est"].item() == pytest.approx(math.log(16), rel=1e-6)
    assert metrics["mi_zscore"].item() > 0


def test_ema_state_evolves_across_calls_and_checkpoints():
    generator = torch.Generator().manual_seed(3)
    source, lengths = torch.tensor([0, 1, 2, 3]), torch.tensor([3, 4, 5, 6])
    state = None
    expected_ema = None
    for step in range(4):
        scores = torch.randn(4, 4, generator=generator) * (step + 1)
        before = None if state is None else {name: value.clone() for name, value in state.items()}
        metrics, new_state = mi_metrics(scores, lengths, source, ema_state=state, ema_decay=0.9)
        if state is not None:  # the caller's state is not modified in place
            assert all(torch.equal(state[name], before[name]) for name in state)
        per_token = scores.double() / lengths.double()[:, None]
        batch_std = (per_token.logsumexp(dim=1) - math.log(4)).std(correction=0).item()
        expected_ema = batch_std if expected_ema is None else 0.9 * expected_ema + 0.1 * batch_std
        assert new_state[EMA_KEY].item() == pytest.approx(expected_ema, rel=1e-9)
        assert new_state["num_updates"].item() == step + 1
        assert metrics["mi_zscore_ema"].item() == pytest.approx(
            metrics["mi_est"].item() / (expected_ema + 1e-3), rel=1e-5
        )
        buffer = io.BytesIO()
        torch.save(new_state, buffer)
        buffer.seek(0)
        state = torch.load(buffer)
    assert metrics["mi_zscore_ema"] != metrics["mi_zscore"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scores": torch.zeros(4)}, "float tensor \\[num_reasoning Z, num_prompts B\\]"),
        ({"scores": torch.zeros(2, 2, dtype=torch.long)}, "float tensor"),
        ({"scores": torch.zeros(2, 1), "source": torch.tensor([0, 0])}, "B >= 2 prompts"),
        ({"scores": torch.tensor([[0.0, math.nan], [0.0, 0.0]])}, "NaN or inf"),
        ({"lengths": torch.ones(3)}, "lengths must be a tensor \\[Z=2\\]"),
        ({"lengths": torch.tensor([1, 0])}, "lengths must be > 0"),
        ({"source": torch.tensor([0.0, 1.0])}, "source must be a long tensor"),
        ({"source": torch.tensor([0, 2])}, "source indices must lie in \\[0, B=2\\)"),
        ({"prompt_ids": torch.tensor([1, 2, 3])}, "prompt_ids must be a long tensor \\[B=2\\]"),
        ({"ema_decay": 1.0}, "ema_decay must be in \\[0, 1\\)"),
        ({"recall_ks": (0, 2)}, "recall_ks must be positive integers"),
        ({"ema_state": {"std": torch.tensor(1.0)}}, "pass None to start a new EMA"),
    ],
)
def test_malformed_inputs_raise_clear_value_errors(kwargs, message):
    arguments = {"scores": torch.zeros(2, 2), "lengths": torch.ones(2), "source": torch.tensor([0, 1])}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        mi_metrics(**arguments)


@st.composite
def score_matrices(draw):
    num_z = draw(st.integers(1, 8))
    num_prompts = draw(st.integers(2, 9))
    values = draw(
        st.lists(st.floats(-50, 0, allow_nan=False), min_size=num_z * num_prompts, max_size=num_z * num_prompts)
    )
    source = draw(st.lists(st.integers(0, num_prompts - 1), min_size=num_z, max_size=num_z))
    lengths = draw(st.lists(st.integers(1, 30), min_size=num_z, max_size=num_z))
    scores = torch.tensor(values, dtype=torch.float32).reshape(num_z, num_prompts)
    return scores, torch.tensor(lengths), torch.tensor(source)


@settings(max_examples=100, deadline=None)
@given(batch=score_matrices())
def test_properties_hold_for_any_score_matrix(batch):
    scores, lengths, source = batch
    metrics, _ = mi_metrics(scores, lengths, source)
    log_b = math.log(scores.shape[1])
    assert metrics["mi_est"].item() <= log_b + 1e-5 and metrics["mi_seq_est"].item() <= log_b + 1e-5
    assert metrics["mi_upper_bound"].item() == pytest.approx(log_b)
    assert metrics["mi_est"].item() == pytest.approx(
        metrics["h_marg_est"].item() - metrics["h_cond_est"].item(), abs=1e-4
    )
    recalls = [
        metrics[name].item() for name in ("retrieval_acc", "recall@2", "recall@4", "recall@8") if name in metrics
    ]
    assert all(0 <= value <= 1 + 1e-6 for value in recalls)
    assert recalls == sorted(recalls)  # a larger k can only find more
    assert all(bool(torch.isfinite(value)) for value in metrics.values())


# ----------------------------------------------------------------------------- regimes


def test_classify_regime_quadrants_and_boundaries():
    assert classify_regime(1.0, 2.0, mi_threshold=0.5, h_threshold=1.0) == "diverse"
    assert classify_regime(1.0, 0.2, mi_threshold=0.5, h_threshold=1.0) == "compressed"
    assert classify_regime(0.1, 2.0, mi_threshold=0.5, h_threshold=1.0) == "template_collapse"
    assert classify_regime(0.1, 0.2, mi_threshold=0.5, h_threshold=1.0) == "low_entropy_collapse"
    assert classify_regime(0.5, 1.0, mi_threshold=0.5, h_threshold=1.0) == "diverse"  # "high" includes equality
    assert classify_regime(torch.tensor(0.1), torch.tensor(3.0), 0.5, 1.0) == "template_collapse"
    assert set(REGIMES) == {"diverse", "compressed", "template_collapse", "low_entropy_collapse"}


def test_default_mi_threshold_is_a_fraction_of_log_b():
    assert default_mi_threshold(64) == pytest.approx(0.1 * math.log(64))
    assert default_mi_threshold(8, fraction=0.5) == pytest.approx(0.5 * math.log(8))
    with pytest.raises(ValueError, match="num_prompts >= 2"):
        default_mi_threshold(1)


# ----------------------------------------------------------------------------- echo trap


def _run_monitor(reward_std, entropy, grad_norm, success=None, **kwargs) -> list[dict[str, float]]:
    state, history = None, []
    success = [math.nan] * len(grad_norm) if success is None else success
    for *values, rate in zip(reward_std, entropy, grad_norm, success, strict=True):
        state, signals = echo_trap_update(state, *values, success=rate, **kwargs)
        history.append({name: value.item() for name, value in signals.items()})
    return history


def _noisy(level: float, steps: int, seed: int, scale: float = 0.03) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    return (level * (1 + scale * torch.randn(steps, generator=generator))).tolist()


def test_collapsing_run_triggers_at_the_gradient_spike():
    healthy, collapse = 30, 10
    reward_std = _noisy(1.0, healthy, 0) + torch.linspace(1.0, 0.3, collapse).tolist()
    entropy = _noisy(2.0, healthy, 1) + torch.linspace(2.0, 0.8, collapse).tolist()
    grad_norm = [*_noisy(1.0, healthy + collapse - 1, 2, scale=0.2), 8.0]
    history = _run_monitor(reward_std, entropy, grad_norm)
    fired = [step for step, signals in enumerate(history) if signals["echo_trap"] == 1]
    assert fired == [healthy + collapse - 1]
    last = history[-1]
    assert last["reward_std_falling"] == last["entropy_falling"] == last["grad_norm_spike"] == 1
    assert last["grad_norm_ratio"] > 3 and last["reward_std_change"] < -0.1 and last["entropy_change"] < -0.1


def test_healthy_run_with_isolated_spikes_never_triggers():
    steps = 60
    grad_norm = _noisy(1.0, steps, 3, scale=0.2)
    grad_norm[20] = grad_norm[40] = 10.0  # spikes alone are not the Echo Trap
    grad_norm[23] = 5.0  # 5x the typical norm; the spike at step 20 must not raise the bar (median, not mean)
    history = _run_monitor(_noisy(1.0, steps, 4), _noisy(2.0, steps, 5), grad_norm)
    assert all(signals["echo_trap"] == 0 for signals in history)
    assert [step for step, signals in enumerate(history) if signals["grad_norm_spike"]] == [20, 23, 40]


def test_falling_signals_without_a_spike_do_not_trigger():
    steps = 40
    falling = torch.linspace(1.0, 0.1, steps).tolist()
    history = _run_monitor(falling, falling, _noisy(1.0, steps, 6, scale=0.1))
    assert history[-1]["reward_std_falling"] == 1 and history[-1]["entropy_falling"] == 1
    assert all(signals["echo_trap"] == 0 for signals in history)


def test_nothing_fires_before_the_window_is_full():
    history = _run_monitor([1.0, 0.5, 0.2, 0.1], [2.0, 1.0, 0.5, 0.2], [1.0, 1.0, 1.0, 50.0], window=4)
    assert [signals["warmed_up"] for signals in history] == [0, 0, 0, 0]
    assert all(signals["echo_trap"] == 0 for signals in history)
    history = _run_monitor([1.0] * 4 + [0.1], [2.0] * 4 + [0.2], [1.0] * 4 + [50.0], window=4)
    assert history[-1]["warmed_up"] == 1 and history[-1]["echo_trap"] == 1


def test_monitor_state_is_pure_checkpointable_and_validated():
    state = echo_trap_init(window=4)
    snapshot = {name: value.clone() for name, value in state.items()}
    new_state, _ = echo_trap_update(state, torch.tensor(1.0), torch.tensor(2.0), torch.tensor(0.5), window=4)
    for name in state:
        assert torch.allclose(state[name].double(), snapshot[name].double(), equal_nan=True)
    assert new_state["grad_norm"][-1].item() == 0.5 and new_state["num_updates"].item() == 1
    buffer = io.BytesIO()
    torch.save(new_state, buffer)
    buffer.seek(0)
    restored = torch.load(buffer)
    _, signals = echo_trap_update(restored, 1.0, 2.0, math.nan, window=4)
    assert signals["grad_norm_spike"] == 0  # NaN never counts as a spike
    with pytest.raises(ValueError, match="window of 4 steps but window=6"):
        echo_trap_update(new_state, 1.0, 2.0, 1.0, window=6)
    with pytest.raises(ValueError, match="even number >= 2"):
        echo_trap_init(window=5)
    with pytest.raises(ValueError, match="spike_factor > 1"):
        echo_trap_update(None, 1.0, 2.0, 1.0, spike_factor=0.5)


# ----------------------------------------------------------------------------- policy collapse


def _measured_runs() -> dict:
    """Per-iteration [reward std, entropy, grad norm, success] of the three vision-fixed sokoban_visual runs."""
    return json.loads((Path(__file__).parent / "data" / "echo_fv_runs.json").read_text())["runs"]


def test_degenerating_run_triggers_policy_collapse_not_the_echo_trap():
    healthy, collapse = 30, 8
    success = _noisy(0.7, healthy, 7) + torch.linspace(0.7, 0.3, collapse).tolist()
    entropy = _noisy(0.05, healthy, 8) + torch.linspace(0.05, 0.09, collapse).tolist()
    grad_norm = [*_noisy(0.5, healthy + collapse - 1, 9, scale=0.2), 3.0]
    history = _run_monitor(_noisy(1.0, healthy + collapse, 10), entropy, grad_norm, success)
    assert [step for step, signals in enumerate(history) if signals["policy_collapse"]] == [healthy + collapse - 1]
    last = history[-1]
    assert last["success_falling"] == last["entropy_rising"] == last["grad_norm_spike"] == 1
    assert last["success_change"] < -0.1 and last["entropy_change"] > 0.1
    assert all(signals["echo_trap"] == 0 for signals in history)  # entropy rose: not RAGEN's Echo Trap


def test_policy_collapse_needs_all_three_and_never_fires_without_success():
    steps = 40
    falling, rising = torch.linspace(0.8, 0.2, steps).tolist(), torch.linspace(0.05, 0.1, steps).tolist()
    spiky = [1.0] * (steps - 1) + [10.0]
    for success, entropy, grad_norm in [
        (falling, rising, [1.0] * steps),  # no spike
        (falling, _noisy(0.05, steps, 11), spiky),  # entropy flat
        ([0.7] * steps, rising, spiky),  # success flat
        (None, rising, spiky),  # success not monitored (NaN)
    ]:
        history = _run_monitor([1.0] * steps, entropy, grad_norm, success)
        assert all(signals["policy_collapse"] == 0 for signals in history)


def test_a_state_saved_before_success_was_monitored_still_loads():
    state = echo_trap_init(window=4)
    del state["success"]
    for _ in range(4):
        state, signals = echo_trap_update(state, 1.0, 2.0, 1.0, window=4, success=0.5)
    assert state["success"].tolist() == [0.5] * 4 and signals["policy_collapse"] == 0


def test_the_measured_collapse_is_flagged_and_the_healthy_seeds_are_not():
    """The vision-fixed sokoban_visual runs to 9,984 episodes (docs/learning.md): seed 1 fell from ~0.8
    training success to ~0.3 at step 148 as its reading degenerated; seeds 0 and 2 gained. Replayed with
    the trainer's defaults (window 10, drop fraction 0.1, spike factor 3)."""
    fired, echo = {}, {}
    for name, run in _measured_runs().items():
        reward_std, entropy, grad_norm, success = zip(*run["rows"], strict=True)
        history = _run_monitor(reward_std, entropy, grad_norm, success)
        steps = [run["first_step"] + i for i in range(len(history))]
        fired[name] = [step for step, signals in zip(steps, history, strict=True) if signals["policy_collapse"]]
        echo[name] = [step for step, signals in zip(steps, history, strict=True) if signals["echo_trap"]]
    assert fired["seed0"] == fired["seed2"] == []
    assert fired["seed1"] and all(148 <= step <= 157 for step in fired["seed1"])
    assert echo == {"seed0": [], "seed1": [60], "seed2": []}  # what the runs' own logs flagged


def test_the_monitor_warns_when_the_measured_reasoning_enters_template_collapse():
    """The demo's MI measurements on a fresh clone (tests/data/mi_regime_fl_demo.json): the monitor reproduces the
    run's logged regime at every measurement and warns each time the first turn's MI-Est falls below 0.1 log B: at
    step 46 (one measurement) and at 151, not again at 156 while it stays there, nor after a checkpoint restored in
    the collapse."""
    cfg = SimpleNamespace(scopes=["first_turn"], mi_threshold_fraction=0.1, h_threshold=None)
    rows = json.loads((Path(__file__).parent / "data" / "mi_regime_fl_demo.json").read_text())["rows"]
    measured = lambda mi, h_cond, upper: {
        "mi/first_turn/mi_est": mi,
        "mi/first_turn/h_cond_est": h_cond,
        "mi/first_turn/mi_upper_bound": upper,
    }
    monitor, warned = DiagnosticsMonitor(cfg, seed=0), []
    for step, mi, h_cond, upper, logged in rows:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = monitor._regime(measured(mi, h_cond, upper), step)
        assert out["mi/regime"] == logged
        warned += [(step, str(w.message)) for w in caught]
    assert [step for step, _ in warned] == [46, 151]
    assert "template_collapse at step 151" in warned[1][1] and "algorithm.kl_coef" in warned[1][1]
    restored = DiagnosticsMonitor(cfg, seed=0)
    restored.load_state_dict(monitor.state_dict())
    step, mi, h_cond, upper, _ = rows[-1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored._regime(measured(mi, h_cond, upper), step)
    assert not caught
    assert restored._regime(measured(1.0, h_cond, upper), step + 5)["mi/regime"] == 0 and restored.regime == "diverse"


def test_the_trainer_monitor_warns_at_the_measured_collapse_from_its_logged_metrics():
    """The trainer's monitor reads `env/success`, `policy/entropy` and `policy/grad_norm` from the iteration's
    metrics; fed the collapsed seed's iterations, it warns once per firing, and the state survives a checkpoint."""
    cfg = SimpleNamespace(echo_window=10, echo_spike_factor=3.0, h_threshold=None)
    rows = _measured_runs()["seed1"]["rows"]
    monitor, restored = DiagnosticsMonitor(cfg, seed=0), DiagnosticsMonitor(cfg, seed=0)
    flagged = []
    for step, (reward_std, entropy, grad_norm, success) in enumerate(rows, start=1):
        metrics = {"policy/entropy": entropy, "policy/grad_norm": grad_norm, "env/success": success}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = monitor.echo(reward_std, metrics)
            if step > 100:
                assert restored.echo(reward_std, metrics) == out
        if step == 100:
            restored.load_state_dict(monitor.state_dict())
        if any("Policy collapse signature" in str(w.message) for w in caught):
            flagged.append(step)
            assert out["echo/policy_collapse"] == 1
    assert flagged and all(148 <= step <= 157 for step in flagged)
