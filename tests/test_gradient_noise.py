"""The gradient noise scale: the estimator against brute force and known distributions, the trainer's per-group
gradients against its whole-batch gradient, and research/grad_noise.py end to end on the tiny test model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from vagen.diagnostics.gradient_noise import gradient_noise
from vagen.rollout import trajectories_to_batch
from vagen.trainer.gradient_noise import measure_gradient_noise, reasoning_mask
from vagen.trainer.starpo import StarPOTrainer

ROOT = Path(__file__).resolve().parent.parent
SMALL = [
    "env=sokoban_visual",
    "model=tiny_vl_test",
    "env.kwargs.max_turns=2",
    "trainer.groups=2",
    "trainer.group_size=2",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2",
    "rollout.max_new_tokens=12",
]


def folded(h: torch.Tensor, folds: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold sums of per-group gradients h [M, D], as `measure_gradient_noise` forms them."""
    index = torch.arange(len(h)) * folds // len(h)
    sums = torch.stack([h[index == k].sum(0) for k in range(folds)])
    sizes = torch.stack([(index == k).sum() for k in range(folds)]).double()
    norms = torch.stack([h[index == k].pow(2).sum() for k in range(folds)])
    return sums @ sums.T, sizes, norms


def test_estimates_equal_their_brute_force_definitions():
    h = torch.randn(12, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.3
    m = len(h)
    cross = sum(float(h[i] @ h[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    result = gradient_noise(*folded(h, 4), batch_groups=8)
    assert result["signal_sq"] == pytest.approx(cross, rel=1e-10)
    assert result["noise_trace"] == pytest.approx(float(h.pow(2).sum(1).mean()) - cross, rel=1e-10)
    assert result["critical_groups"] == pytest.approx(result["noise_trace"] / cross, rel=1e-10)
    signal_at_8 = cross / (cross + result["noise_trace"] / 8)
    assert result["signal_fraction"] == pytest.approx(signal_at_8, rel=1e-10)
    first, second = h[:6].mean(0), h[6:].mean(0)
    assert result["halves_cosine"] == pytest.approx(float(first @ second / (first.norm() * second.norm())), rel=1e-10)
    # Delete-a-fold jackknife, recomputed fold by fold from the remaining groups.
    index = torch.arange(m) * 4 // m
    left_out = []
    for k in range(4):
        rest = h[index != k]
        n = len(rest)
        left_out.append((float(rest.sum(0).pow(2).sum()) - float(rest.pow(2).sum())) / (n * (n - 1)))
    left_out = torch.tensor(left_out, dtype=torch.float64)
    jackknife = float((3 / 4 * (left_out - left_out.mean()).pow(2).sum()).sqrt())
    assert result["signal_sq_se"] == pytest.approx(jackknife, rel=1e-10)


def test_recovers_a_known_signal_and_noise():
    """h = G + noise with |G|^2 = 0.25 and tr Cov = 20 x 1: the critical batch is 80 groups."""
    generator = torch.Generator().manual_seed(1)
    signal = torch.zeros(20, dtype=torch.float64)
    signal[0] = 0.5
    h = signal + torch.randn(4000, 20, generator=generator, dtype=torch.float64)
    result = gradient_noise(*folded(h, 8), batch_groups=8)
    assert abs(result["signal_sq"] - 0.25) < 3 * result["signal_sq_se"]
    assert result["signal_sq_se"] < 0.05
    assert result["noise_trace"] == pytest.approx(20.0, rel=0.03)
    assert 60 < result["critical_groups"] < 110


def test_pure_noise_has_no_measurable_signal():
    h = torch.randn(400, 400, generator=torch.Generator().manual_seed(2), dtype=torch.float64)  # cosines ~ ±0.05
    result = gradient_noise(*folded(h, 8), batch_groups=8)
    assert abs(result["signal_sq"]) < 3 * result["signal_sq_se"]
    assert abs(result["halves_cosine"]) < 0.2


def test_too_few_folds_or_groups_is_a_clear_error():
    h = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="at least 2 folds"):
        gradient_noise(*folded(h, 1), batch_groups=8)


def config(overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose("train", overrides=[*SMALL, "algorithm.entropy_coef=0.01", *overrides])


def test_group_gradients_average_to_the_whole_batch_gradient_and_leave_the_weights():
    """The update's gradient on a batch of equal groups is the mean of its groups' gradients (seq-mean loss), so the
    per-group gradients the noise scale is built from are exactly what a step averages."""
    trainer = StarPOTrainer(config(["trainer.groups=3"]))
    learner = trainer.learner
    before = [p.detach().clone() for p in learner.trainable_parameters()]
    trajectories = learner.collect([0, 1, 2], trainer.sampling())
    batch = learner.score(trajectories_to_batch(trajectories, learner.tokenizer.pad_token_id))
    whole = learner.gradient(batch, torch.arange(len(batch)))
    groups = [learner.gradient(batch, torch.nonzero(batch.group_index == g).flatten()) for g in range(3)]
    assert any(float(g.abs().sum()) > 0 for g in whole)
    for index, expected in enumerate(whole):
        mean = sum(group[index] for group in groups) / 3
        assert torch.allclose(mean, expected, atol=1e-7, rtol=1e-4)
    for parameter, original in zip(learner.trainable_parameters(), before, strict=True):
        assert torch.equal(parameter, original)
        assert parameter.grad is None


def test_measure_reports_every_block_of_a_vision_model():
    trainer = StarPOTrainer(config([]))
    result = measure_gradient_noise(trainer.learner, trainer.sampling(), list(range(6)), folds=3)
    assert result["groups"] == 6 and result["group_size"] == 2 and result["batch_groups"] == 2
    assert set(result["blocks"]) == {"all", "vision", "language"}
    blocks = result["blocks"]
    # The blocks split the weights: their |G|^2 and tr Cov add up to the whole model's.
    for key in ("signal_sq", "noise_trace"):
        parts = blocks["vision"][key] + blocks["language"][key]
        assert parts == pytest.approx(blocks["all"][key], rel=1e-6, abs=1e-30)
    with pytest.raises(ValueError, match="at least 3 groups"):
        measure_gradient_noise(trainer.learner, trainer.sampling(), [0, 1], folds=2)


def test_reasoning_mask_marks_each_response_up_to_its_closing_think_tag():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "vagen/bootstrap/shipped/warm-tiny-vl-default-seed0")
    pieces = [
        ("Board: #_P#", 0),
        ("<think>box is left of me.</think><answer>Left || Up</answer>", 1),
        ("Executed: Left.", 0),
        ("no tags at all", 1),  # a malformed response: all of it is counted as reasoning
        ("ok", 0),
        ("<think>a</think><answer>Down</answer>", 1),
    ]
    spans, ids = [], []
    for text, on in pieces:
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        spans.append((len(ids), len(ids) + len(tokens), text, on))
        ids += tokens
    sampled = torch.tensor([[float(on) for start, end, _, on in spans for _ in range(end - start)]])
    mask = reasoning_mask(torch.tensor([ids]), sampled, tokenizer)[0]
    for start, end, text, on in spans:
        marked = mask[start:end].tolist()
        if not on:
            assert not any(marked)
            continue
        reasoning = [t for t, m in zip(ids[start:end], marked, strict=True) if m]
        rest = [t for t, m in zip(ids[start:end], marked, strict=True) if not m]
        assert marked == sorted(marked, reverse=True)  # one run of reasoning, then the rest
        assert tokenizer.decode(reasoning) + tokenizer.decode(rest) == text
        if "</think>" in text:
            assert text.startswith(tokenizer.decode(reasoning)) and "</think" not in tokenizer.decode(reasoning)
            assert "</think" in tokenizer.decode(reasoning + rest[:1])  # cut at the token that completes it
            assert len(reasoning) >= 3
        else:
            assert not rest


def test_token_classes_split_the_noise_of_a_token_sum_loss():
    """With a token-sum loss the reasoning and answer losses add up to the whole one, so their gradients do: the
    classes' |G|^2 and tr Cov then obey |a + b|^2 = |a|^2 + |b|^2 + 2 a.b, checked through the fold Gram matrices'
    sums (the reported numbers need not add up, the cross term stays)."""
    trainer = StarPOTrainer(config(["algorithm.loss_agg=seq-mean-token-sum-norm"]))
    result = measure_gradient_noise(trainer.learner, trainer.sampling(), list(range(6)), folds=3, split_tokens=True)
    classes = result["token_classes"]
    assert set(classes) == {"reasoning", "answer"}
    tokens = classes["reasoning"]["tokens_per_episode"] + classes["answer"]["tokens_per_episode"]
    assert tokens > 0
    for name in ("reasoning", "answer"):
        assert set(classes[name]) >= {"signal_sq", "noise_trace", "critical_groups", "neg_logprob_mean"}
        assert classes[name]["noise_trace"] >= 0
    # Noise traces of two parts of one sum: |sqrt(a) - sqrt(b)| <= sqrt(a + b + 2ab-cross) <= sqrt(a) + sqrt(b).
    whole, a, b = (x["noise_trace"] ** 0.5 for x in (result["blocks"]["all"], classes["reasoning"], classes["answer"]))
    assert abs(a - b) - 1e-6 <= whole <= a + b + 1e-6


def test_grad_noise_script_end_to_end(tmp_path):
    out = tmp_path / "noise.json"
    command = [sys.executable, "research/grad_noise.py", *SMALL, "noise.groups=4", "noise.folds=2", f"noise.out={out}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "rollouts: 4/4 groups" in done.stdout and "gradients: 4/4 groups" in done.stdout
    assert "4 groups x 2 rollouts" in done.stdout
    assert "critical batch" in done.stdout and "vision" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["groups"] == 4 and set(saved["blocks"]) == {"all", "vision", "language"}
    misspelt = subprocess.run([*command[:2], "noise.grops=4"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert misspelt.returncode == 2 and "noise.groups" in misspelt.stderr
