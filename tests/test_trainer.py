"""End-to-end StarPO runs on the tiny random models: every preset, resume exactness, config errors."""

import dataclasses
import importlib.util
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from vagen.rollout import reasoning_mask
from vagen.trainer import learner as learner_module
from vagen.trainer import starpo
from vagen.trainer.checkpoint import latest_checkpoint
from vagen.trainer.learner import Learner
from vagen.trainer.run import train, trained
from vagen.trainer.starpo import StarPOTrainer

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
FAST = [
    "trainer.groups=2",
    "trainer.group_size=2",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2",
    "rollout.max_new_tokens=12",
    "logger.wandb_mode=disabled",
    "logger.progress=false",
    "trainer.viz_every=0",
    "trainer.eval_every=0",
]
TEXT = ["env=bandit_text", "model=tiny_text_test", *FAST]
VISUAL = ["env=sokoban_visual", "model=tiny_vl_test", "env.kwargs.max_turns=2", *FAST]


def repo_module(relative: str):
    """A script of the repository (`research/bench_learning.py`, `scripts/viz.py`, `dev.py`, ...) loaded as a module:
    scripts/ and research/ are not packages."""
    path = CONFIG_DIR.parent / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config(overrides, tmp_path=None):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("train", overrides=list(overrides))
    if tmp_path is not None:
        cfg.run_dir = str(tmp_path / "run")
    return cfg


def snapshot(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def record_step_gradients(monkeypatch) -> list[dict[str, torch.Tensor]]:
    """Make `Learner.step` record the gradients of every trained module (`policy.…`, `critic.…`) instead of stepping:
    one dict per optimizer step, in order."""
    grads = []

    def record(self, stats, iteration):
        named = [(f"{m}.{n}", q) for m, module in self.modules.items() for n, q in module.named_parameters()]
        grads.append({name: q.grad.clone() for name, q in named if q.grad is not None})

    monkeypatch.setattr(Learner, "step", record)
    return grads


def assert_same_steps(grads: list[dict[str, torch.Tensor]], atol: float, rtol: float) -> int:
    """Two updates recorded one after the other: every step of the second has the first's gradients. Returns the
    number of steps per update."""
    steps = len(grads) // 2
    assert steps and len(grads) == 2 * steps
    for want, got in zip(grads[:steps], grads[steps:], strict=True):
        assert want.keys() == got.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=atol, rtol=rtol, msg=name)
    return steps


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "dapo", "ppo", "starpo_s"])
def test_each_preset_updates_every_parameter_with_finite_metrics(algorithm):
    cfg = config([*TEXT, f"algorithm={algorithm}", "filter.empty_policy=keep_all"])
    trainer = StarPOTrainer(cfg)
    before = snapshot(trainer.learner.model)
    metrics = trainer.train_iteration()
    # Explained variance is undefined (NaN, logged as such) when every return is equal.
    undefined = {"critic/explained_variance"} if metrics["filter/reward_std_mean"] == 0 else set()
    assert all(math.isfinite(v) for k, v in metrics.items() if k not in undefined), metrics
    changed = [name for name, p in trainer.learner.model.named_parameters() if not torch.equal(p, before[name])]
    assert len(changed) == len(before), f"unchanged: {set(before) - set(changed)}"
    assert {"policy/approx_kl", "policy/clipfrac", "policy/entropy", "policy/grad_norm"} <= metrics.keys()
    if cfg.algorithm.critic:
        assert {"critic/explained_variance", "critic/grad_norm", "loss/value"} <= metrics.keys()
    assert ("loss/kl" in metrics) == (cfg.algorithm.kl_coef > 0)


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "dapo", "ppo", "starpo_s"])
def test_each_preset_runs_with_its_own_empty_group_policy(algorithm):
    """The preset as a user gets it (DAPO rerolls, StarPO-S skips): the random model's rollouts may leave no group
    with reward spread, and then the update is skipped after the rerolls, with nothing changed."""
    trainer = StarPOTrainer(config([*TEXT, f"algorithm={algorithm}"]))
    before = snapshot(trainer.learner.model)
    metrics = trainer.train_iteration()
    filt = trainer.cfg.filter
    changed = {name for name, p in trainer.learner.model.named_parameters() if not torch.equal(p, before[name])}
    if metrics["filter/skipped_update"]:
        assert not changed and metrics["filter/kept_count"] == 0
        assert metrics["filter/rerolls"] == (filt.max_rerolls if filt.empty_policy == "reroll" else 0)
    else:
        assert changed == set(before) and metrics["filter/kept_count"] > 0
    finite = {k: v for k, v in metrics.items() if k.startswith(("env/", "filter/", "perf/", "rollout/"))}
    assert all(math.isfinite(v) for v in finite.values()), finite


def test_starpo_s_is_one_preset():
    cfg = config([*TEXT, "algorithm=starpo_s"])
    assert (cfg.filter.strategy, cfg.algorithm.kl_coef, cfg.algorithm.clip_low, cfg.algorithm.clip_high) == (
        "top_p",
        0.0,
        0.2,
        0.28,
    )
    assert cfg.algorithm.critic and cfg.algorithm.advantage == "gae"
    assert config([*TEXT, "algorithm=starpo_s", "filter=none"]).filter.strategy == "none"


@pytest.mark.parametrize("overrides", [TEXT, VISUAL], ids=["text", "visual"])
def test_two_iteration_run_writes_its_folder(overrides, tmp_path):
    cfg = config([*overrides, "trainer.iterations=2", "trainer.save_every=1", "trainer.viz_every=2"], tmp_path)
    run_dir = train(cfg)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for line in lines for v in line.values())
    assert (run_dir / "config.yaml").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_000001", "iter_000002"]
    assert list((run_dir / "gifs" / "iter_000002").glob("*.gif"))


def test_resume_is_exact(tmp_path):
    """4 iterations straight == 2 iterations, a fresh process state, resume, 2 more (within 1e-6)."""
    straight = config([*VISUAL, "algorithm=ppo", "trainer.iterations=4", "trainer.save_every=2"], tmp_path / "a")
    train(straight)
    reference = trained(straight)
    first = config([*VISUAL, "algorithm=ppo", "trainer.iterations=2", "trainer.save_every=2"], tmp_path / "b")
    train(first)
    torch.manual_seed(12345)  # disturb global RNG state: resume must restore it
    resumed_cfg = config([*VISUAL, "algorithm=ppo", "trainer.iterations=4", "trainer.save_every=2"], tmp_path / "b")
    train(resumed_cfg)
    resumed = trained(resumed_cfg)
    for name, module in reference.learner.modules.items():
        for (key, a), (_, b) in zip(
            module.state_dict().items(), resumed.learner.modules[name].state_dict().items(), strict=True
        ):
            assert torch.allclose(a, b, atol=1e-6), f"{name}.{key} differs after resume"
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*TEXT, "algorithm.advantage=gae", "algorithm.critic=false"], "needs a value model"),
        ([*TEXT, "trainer.group_size=1"], "group_size=1 must be >= 2"),
        ([*TEXT, "rollout.max_context_tokens=40"], "Raise rollout.max_context_tokens"),
        (["env=sokoban_visual", "model=tiny_text_test", *FAST], "reads text only"),
        ([*TEXT, "algorithm.loss_agg=mean"], "Unknown algorithm.loss_agg"),
        ([*TEXT, "trainer.micro_batch_size=8"], "micro_batch_size"),
        ([*TEXT, "trainer.micro_batch_size=0"], "trainer.micro_batch_size=0 must be a whole number >= 1"),
        ([*TEXT, "trainer.iterations=0"], "trainer.iterations=0 must be a whole number >= 1"),
        ([*TEXT, "trainer.lr=0"], "must be > 0"),
        ([*TEXT, "trainer.adam_eps=0"], "trainer.adam_eps=0 must be > 0"),
        ([*TEXT, "trainer.save_every=0"], "trainer.save_every=0"),
        ([*TEXT, "trainer.keep_checkpoints=0"], "trainer.keep_checkpoints=0"),
        ([*TEXT, "rollout.temperature=-1"], "rollout.temperature=-1"),
        ([*TEXT, "rollout.top_p=0"], "rollout.top_p=0"),
        ([*TEXT, "device=tpu"], "Unknown device='tpu'"),
        ([*TEXT, "logger.wandb_mode=cloud"], "Unknown logger.wandb_mode"),
        ([*TEXT, "filter=top_p", "filter.value=1.5"], "top_p needs value in"),
        ([*TEXT, "rollout.engine=api"], "rollout.engine=api cannot train"),
        ([*TEXT, "trainer.lora.enabled=true", "trainer.lora.dropout=0.05"], "Set trainer.lora.dropout=0"),
        ([*TEXT, "algorithm.advantage_min=0.5"], "algorithm.advantage_min=0.5 must be a number <= 0"),
        ([*TEXT, "trainer.level_pool=1"], "trainer.level_pool=1 must be 0 .* from trainer.groups=2"),
        ([*TEXT, "trainer.level_pool=-2"], "trainer.level_pool=-2"),
        ([*TEXT, "algorithm.sft_coef=1"], "sft_coef=1 trains on solver demonstrations of env=bandit_text.*sft_coef=0"),
        ([*TEXT, "algorithm.sft_source=visited"], "sft_source=visited says .* but algorithm.sft_coef=0 turns"),
        ([*TEXT, "algorithm.sft_tokens=think"], "sft_tokens=think says .* but algorithm.sft_coef=0 turns"),
        (
            ["env=cards_text", "model=tiny_text_test", *FAST, "algorithm.sft_coef=1", "algorithm.sft_source=visited"],
            "sft_source=visited replays .* by state_key\\(\\), which CardsEnv does not give",
        ),
    ],
)
def test_incompatible_configs_fail_before_any_model_loads(overrides, message, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was validated")

    monkeypatch.setattr(learner_module, "load_policy", no_model)
    with pytest.raises(ValueError, match=message):
        StarPOTrainer(config(overrides))


def test_level_pool_cycles_through_a_fixed_set_of_levels(monkeypatch):
    """trainer.level_pool=L: the groups' env seeds run through run_seed·SEED_STRIDE + 0..L−1 and start over."""
    trainer = StarPOTrainer(config([*TEXT, "seed=3", "trainer.level_pool=3"]))
    played = []
    monkeypatch.setattr(trainer.learner, "collect", lambda seeds, sampling: played.append(seeds) or [])
    for _ in range(3):
        trainer.rollout()
    first = 3 * starpo.SEED_STRIDE
    assert played == [[first, first + 1], [first + 2, first], [first + 1, first + 2]]
    fresh = StarPOTrainer(config([*TEXT, "seed=3"]))
    monkeypatch.setattr(fresh.learner, "collect", lambda seeds, sampling: played.append(seeds) or [])
    fresh.rollout(), fresh.rollout()
    assert played[-2:] == [[first, first + 1], [first + 2, first + 3]]


def test_incompatible_checkpoint_is_a_clear_error(tmp_path):
    train(config([*TEXT, "trainer.iterations=1", "trainer.save_every=1"], tmp_path))
    with pytest.raises(ValueError, match="algorithm"):
        train(config([*TEXT, "algorithm=ppo", "trainer.iterations=2"], tmp_path))


def test_lora_trains_only_adapters():
    cfg = config([*TEXT, "trainer.lora.enabled=true", "trainer.lora.target_modules=[q_proj,v_proj]"])
    trainer = StarPOTrainer(cfg)
    before = snapshot(trainer.learner.model)
    # LoRA's B starts at zero, so A only receives gradient from the second step on.
    for _ in range(2):
        assert math.isfinite(trainer.train_iteration()["policy/grad_norm"])
    changed = {name for name, p in trainer.learner.model.named_parameters() if not torch.equal(p, before[name])}
    adapters = {name for name in before if "lora_" in name}
    assert adapters and changed == adapters


def test_lora_with_the_vision_tower_fixed_adapts_the_language_model_only_and_its_run_evaluates(tmp_path):
    """gate_proj names an MLP of the vision tower as well as of the language model: with `trainer.freeze_vision` no
    adapter goes into the vision tower (without it one does), and the evaluator rebuilds the run's model exactly."""
    from omegaconf import OmegaConf

    from vagen.eval.models import load_local_policy, resolve_models
    from vagen.trainer.learner import is_vision_weight

    lora = ["trainer.lora.enabled=true", "trainer.lora.target_modules=[q_proj,gate_proj]", "algorithm.kl_coef=0"]
    adapted = StarPOTrainer(config([*VISUAL, *lora])).learner.model
    assert any("lora_" in name and is_vision_weight(name) for name, _ in adapted.named_parameters())
    cfg = config([*VISUAL, *lora, "trainer.freeze_vision=true", "trainer.iterations=2"], tmp_path)
    run_dir = train(cfg)
    model = trained(cfg).learner.model
    adapters = [name for name, _ in model.named_parameters() if "lora_" in name]
    assert adapters and not any(is_vision_weight(name) for name in adapters)
    assert any(".mlp.gate_proj.lora_" in name for name in adapters)
    (spec,) = resolve_models([str(run_dir)], OmegaConf.create({"name": "hf"}), CONFIG_DIR, {})
    loaded = load_local_policy(spec, "cpu").model.state_dict()  # loads the checkpoint strictly
    for name, value in model.state_dict().items():
        assert torch.equal(value, loaded[name]), name


def test_merged_lora_weights_are_the_adapted_model_under_plain_names():
    """What a vLLM engine receives with LoRA: loaded into a plain copy of the base model, it gives the adapted
    model's logits exactly (W + scale·B·A), with no peft parameter names."""
    from vagen.models.lora import add_lora, merged_state_dict
    from vagen.models.registry import load_policy

    cfg = config(TEXT)
    adapted = load_policy(cfg.model.name, cfg.model.source, cfg.model.modality, size=cfg.model.size).model
    plain = load_policy(cfg.model.name, cfg.model.source, cfg.model.modality, size=cfg.model.size).model
    add_lora(adapted, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_" in name:
                parameter.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    merged = merged_state_dict(adapted)
    assert merged.keys() == plain.state_dict().keys()
    plain.load_state_dict(merged)
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = adapted(ids).logits, plain(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, load_policy(cfg.model.name, cfg.model.source, "text", size="test").model(ids).logits)


def test_ctrl_c_mid_run_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    cfg = config([*TEXT, "trainer.iterations=4", "trainer.save_every=1"], tmp_path)
    original = StarPOTrainer.train_iteration

    def interrupted_on_third(self):
        if self.iteration == 2:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(StarPOTrainer, "train_iteration", interrupted_on_third)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    from vagen.trainer.checkpoint import latest_checkpoint

    assert latest_checkpoint(tmp_path / "run").name == "iter_000002"
    monkeypatch.setattr(StarPOTrainer, "train_iteration", original)
    train(cfg)  # rerunning the command resumes at iteration 2 and finishes
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_equals_the_whole_mini_batch(agg, monkeypatch):
    """Micro-batches of 3 (uneven lengths, a ragged last one) give the gradients of one batch of 8 (1e-5)."""
    grads = []

    def record_gradients(self, stats, iteration):
        grads.append(
            {f"{name}.{p}": q.grad.clone() for name, m in self.modules.items() for p, q in m.named_parameters()}
        )

    monkeypatch.setattr(Learner, "step", record_gradients)
    common = [*TEXT, "algorithm=ppo", f"algorithm.loss_agg={agg}", "trainer.groups=2", "trainer.group_size=4"]
    whole = StarPOTrainer(config([*common, "trainer.mini_batch_size=8", "trainer.micro_batch_size=8"]))
    parts = StarPOTrainer(config([*common, "trainer.mini_batch_size=8", "trainer.micro_batch_size=3"]))
    batch = starpo.trajectories_to_batch(whole.rollout(), pad_token_id=whole.learner.policy.tokenizer.pad_token_id or 0)
    for row in range(len(batch)):  # the random test model always writes max_new_tokens: vary the lengths
        sampled = batch.response_mask[row].nonzero().flatten()
        batch.response_mask[row, sampled[:row]] = 0.0
    assert len(set(batch.response_mask.sum(dim=1).tolist())) == len(batch)
    whole.learner.update(batch, 0)
    parts.learner.update(batch, 0)
    assert grads[0].keys() == grads[1].keys()
    for name, expected in grads[0].items():
        assert torch.allclose(grads[1][name], expected, atol=1e-5, rtol=1e-4), name


def test_a_second_run_into_a_busy_run_dir_refuses_and_a_stale_lock_is_taken_over(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    from vagen.trainer.lock import LOCK_FILENAME

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded although the run folder is busy")

    cfg = config([*TEXT, "trainer.iterations=1"], tmp_path)
    lock = tmp_path / "run" / LOCK_FILENAME
    lock.parent.mkdir(parents=True)
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a live run on this host
    try:
        lock.write_text(json.dumps({"pid": busy.pid, "host": os.uname().nodename}))
        with monkeypatch.context() as patch:
            patch.setattr(learner_module, "load_policy", no_model)
            with pytest.raises(ValueError, match=f"in use by another run \\(pid {busy.pid}"):
                train(cfg)
    finally:
        busy.kill()
        busy.wait()
    assert lock.exists()  # the refused run left the owner's lock alone
    with pytest.warns(UserWarning, match="stale lock"):
        train(cfg)  # the owner is gone: the lock is stale, the run proceeds and releases it at the end
    assert not lock.exists() and (tmp_path / "run" / "checkpoints").exists()


def test_resume_accepts_a_run_folder(tmp_path):
    from vagen.trainer.run import resume_point

    first = config([*TEXT, "trainer.iterations=2", "trainer.save_every=1"], tmp_path / "a")
    train(first)
    cfg = config([*TEXT, "trainer.iterations=3", f"trainer.resume={first.run_dir}"], tmp_path / "b")
    assert resume_point(cfg).name == "iter_000002"
    with pytest.raises(ValueError, match="is not a folder"):
        resume_point(config([*TEXT, f"trainer.resume={tmp_path / 'missing'}"]))


def test_lr_factor_worked_values():
    from vagen.trainer.learner import lr_factor

    linear = [lr_factor(i, 0, "linear", 10, 20) for i in (0, 10, 11, 15, 19, 20, 30)]
    assert linear == pytest.approx([1, 1, 0.9, 0.5, 0.1, 0, 0])
    assert lr_factor(15, 0, "cosine", 10, 20) == pytest.approx(0.5)
    assert lr_factor(12, 0, "cosine", 10, 20) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))
    assert [lr_factor(i, 4, "constant", 0, 20) for i in (0, 1, 3, 50)] == [0.25, 0.5, 1, 1]
    assert lr_factor(1, 4, "linear", 0, 2) == pytest.approx(0.5 * 0.5)  # warm-up and decay multiply


def test_lr_decay_start_is_an_iteration_or_a_fraction_of_the_end():
    from types import SimpleNamespace

    from vagen.trainer.config import lr_decay_start, validate_config

    def start(value, end=156, iterations=40):
        return lr_decay_start(SimpleNamespace(lr_decay_start=value, lr_decay_end=end, iterations=iterations))

    assert [start(0), start(117), start(117.0), start(0.75), start(0.5, None)] == [0, 117, 117, 117, 20]
    # A fraction stays below the end however short the run (2 * 0.75 rounds to 2): never the empty-decay error.
    assert [start(0.75, None, 2), start(0.75, None, 1), start(0.75, 4), start(0.1, None, 1)] == [1, 0, 3, 0]
    validate_config(
        config([*TEXT, "trainer.lr_schedule=linear", "trainer.lr_decay_start=0.75", "trainer.iterations=2"])
    )
    with pytest.raises(ValueError, match="an empty decay"):  # an iteration given as such is taken at its word
        validate_config(
            config([*TEXT, "trainer.lr_schedule=linear", "trainer.lr_decay_start=2", "trainer.iterations=2"])
        )
    with pytest.raises(ValueError, match="neither an iteration"):
        validate_config(config([*TEXT, "trainer.lr_schedule=linear", "trainer.lr_decay_start=1.5"]))


def logged_lrs(run_dir) -> dict[int, float]:
    from vagen.logging import read_metrics

    return {int(r["step"]): r["optim/lr"] for r in read_metrics(run_dir) if "optim/lr" in r}


def test_lr_schedule_decays_each_iteration_and_a_fork_decays_from_its_checkpoint(tmp_path):
    """A linear decay over 4 iterations trains at lr·(1, 3/4, 1/2, 1/4). A run resumed from another's checkpoint at
    iteration 2 with `lr_decay_start=2`, `lr_decay_end=4` keeps lr for iteration 2 and halves it for iteration 3."""
    decayed = config([*TEXT, "trainer.iterations=4", "trainer.lr=1e-4", "trainer.lr_schedule=linear"], tmp_path / "a")
    train(decayed)
    assert list(logged_lrs(decayed.run_dir).values()) == pytest.approx([1e-4, 0.75e-4, 0.5e-4, 0.25e-4])
    constant = config([*TEXT, "trainer.iterations=2", "trainer.save_every=1"], tmp_path / "b")
    train(constant)
    checkpoint = Path(constant.run_dir) / "checkpoints" / "iter_000002"
    fork = [f"trainer.resume={checkpoint}", "trainer.lr_schedule=cosine", "trainer.lr_decay_start=2"]
    forked = config([*TEXT, "trainer.iterations=4", *fork, "trainer.lr_decay_end=4"], tmp_path / "c")
    train(forked)
    lrs = logged_lrs(forked.run_dir)
    assert [lrs[step] for step in sorted(lrs)[-2:]] == pytest.approx([1e-4, 0.5e-4])
    with pytest.raises(ValueError, match="an empty decay"):
        train(config([*TEXT, "trainer.iterations=4", *fork, "trainer.lr_decay_end=2"], tmp_path / "d"))


def test_explained_variance_is_one_number_from_rollout_time_values(monkeypatch):
    """critic/explained_variance = 1 − Var[G − V_old]/Var[G] over the whole batch's sampled tokens, once."""
    from vagen.algos.losses import explained_variance

    seen = {}
    original = Learner.score

    def recording(self, batch, *args):
        out = original(self, batch, *args)
        seen["expected"] = explained_variance(out.old_values, out.value_targets, batch.response_mask)
        return out

    monkeypatch.setattr(Learner, "score", recording)
    trainer = StarPOTrainer(config([*TEXT, "algorithm=ppo", "trainer.groups=2", "trainer.group_size=4"]))
    metrics = trainer.train_iteration()
    assert metrics["critic/explained_variance"] == pytest.approx(float(seen["expected"]), nan_ok=True)


def test_the_critic_starts_at_its_first_batchs_mean_return_and_a_resumed_run_does_not_restart_it(tmp_path, monkeypatch):
    """Before its first update the zero-initialised critic says V = 0; the first batch's values are its mean return at
    V = 0 on every sampled token (the head's bias, its weight still 0). Later iterations, and a run resumed from a
    checkpoint, keep the trained critic."""
    scored = []
    original = Learner.score

    def recording(self, batch, *args):
        out = original(self, batch, *args)
        scored.append(out)
        return out

    monkeypatch.setattr(Learner, "score", recording)
    overrides = [*TEXT, "algorithm=ppo", "trainer.groups=2", "trainer.group_size=4", "trainer.save_every=1"]
    trainer = StarPOTrainer(config([*overrides, "trainer.iterations=2"], tmp_path))
    assert trainer.learner.critic.untrained()
    trainer.train_iteration()
    (first,) = scored
    mask = first.response_mask.bool()
    # algorithm=ppo is token-level GAE with γ = λ = 1: at V = 0 each sampled token's return is its reward-to-go
    rewards = first.token_rewards * mask
    reward_to_go = rewards.flip(1).cumsum(1).flip(1)
    mean_return = float(reward_to_go[mask].mean())
    assert mean_return != 0
    assert first.old_values[mask] == pytest.approx(torch.full((int(mask.sum()),), mean_return), abs=1e-6)
    assert (first.old_values[~mask] == 0).all() and not trainer.learner.critic.untrained()
    trainer.train_iteration()
    assert not torch.allclose(scored[1].old_values[scored[1].response_mask.bool()], torch.tensor(mean_return))
    trainer.save(keep_last=1)
    resumed = StarPOTrainer(config([*overrides, "trainer.iterations=3"], tmp_path))
    resumed.restore(latest_checkpoint(resumed.run_dir))
    assert not resumed.learner.critic.untrained()


@pytest.mark.parametrize("overrides", [TEXT, VISUAL], ids=["text", "visual"])
def test_the_trainer_scores_the_distribution_it_sampled_from(overrides):
    """At rollout.temperature=0.7 the PPO log-probs are log softmax(logits / 0.7) of the sampled ids, not the
    model's T = 1 distribution, and they equal the log-probs the engine reported while sampling."""
    from vagen.forward import batched_logprobs

    trainer = StarPOTrainer(config([*overrides, "rollout.temperature=0.7"]))
    batch = starpo.trajectories_to_batch(
        trainer.rollout(), pad_token_id=trainer.learner.policy.tokenizer.pad_token_id or 0
    )
    scored = batched_logprobs(
        trainer.learner.model, batch, trainer.learner.policy.processor, micro_batch=4, temperature=0.7
    )
    mask = batch.response_mask.bool()
    torch.testing.assert_close(scored[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=0)
    at_one = batched_logprobs(
        trainer.learner.model, batch, trainer.learner.policy.processor, micro_batch=4, temperature=1.0
    )
    assert not torch.allclose(scored[mask], at_one[mask], atol=1e-3)
    if overrides is TEXT:  # right-padded text rows: default positions 0..T-1 are the real positions
        with torch.no_grad():
            logits = trainer.learner.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        direct = torch.log_softmax(logits[:, :-1].float() / 0.7, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
        torch.testing.assert_close(scored[:, 1:][mask[:, 1:]], direct[mask[:, 1:]], atol=1e-5, rtol=0)


def test_resume_keeps_each_segments_config_and_refuses_a_changed_task(tmp_path):
    train(config([*TEXT, "trainer.iterations=1", "trainer.save_every=1"], tmp_path))
    train(config([*TEXT, "trainer.iterations=2", "trainer.save_every=1", "trainer.lr=3e-5"], tmp_path))
    run_dir = tmp_path / "run"
    assert "lr: 3.0e-05" in (run_dir / "config.yaml").read_text()
    first_segment = (run_dir / "config.until_iter_000001.yaml").read_text()
    assert "iterations: 1" in first_segment and "lr: 0.0001" in first_segment  # the default
    with pytest.raises(ValueError, match="env_kwargs"):
        train(config([*TEXT, "trainer.iterations=3", "env.kwargs.format_penalty=-0.5"], tmp_path))


def test_train_script_reports_a_config_error_in_one_line_without_a_traceback(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "scripts" / "train.py"
    overrides = [*TEXT, "trainer.iterations=0", f"run_dir={tmp_path / 'run'}"]
    result = subprocess.run([sys.executable, str(script), *overrides], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "error: trainer.iterations=0 must be a whole number >= 1." in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    typo = subprocess.run([sys.executable, str(script), "trainer.iteratons=3"], capture_output=True, text=True)
    assert (
        typo.returncode == 2 and "Unknown option 'trainer.iteratons'. Did you mean trainer.iterations?" in typo.stderr
    )
    assert "+trainer" not in typo.stderr and "Traceback" not in typo.stderr


def test_ctrl_c_prints_the_last_checkpoint_without_a_traceback(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    script = Path(__file__).resolve().parent.parent / "scripts" / "train.py"
    run_dir = tmp_path / "run"
    overrides = [*TEXT, "trainer.iterations=100000", "trainer.save_every=1", f"run_dir={run_dir}"]
    process = subprocess.Popen(
        [sys.executable, str(script), *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    deadline = time.monotonic() + 240
    while not list(run_dir.glob("checkpoints/iter_*")) and time.monotonic() < deadline:
        time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 130, out  # the run's own output, so that a rare failure under load says why
    assert "Interrupted. Last complete checkpoint: " in out and "rerun the command to resume" in out
    assert "Traceback" not in out and not (run_dir / ".run.lock").exists()


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("overrides", [TEXT, VISUAL], ids=["text", "visual"])
def test_the_first_on_policy_step_has_ratio_one(overrides, bf16):
    # One mini-batch (so the update's metrics are the first step's), two micro-batches of it.
    cfg = config([*overrides, f"trainer.bf16={str(bf16).lower()}", "rollout.temperature=0.7"])
    metrics = StarPOTrainer(cfg).train_iteration()
    # Also under bf16: old and new log-probs come from the same autocast and mode (before the fix: 0.998..1.0014).
    assert abs(metrics["policy/ratio_max"] - 1) < 1e-5 and abs(metrics["policy/ratio_min"] - 1) < 1e-5
    assert metrics["policy/clipfrac"] == 0


@pytest.mark.parametrize("native", [True, False], ids=["avx512-bf16-cpu", "avx2-only-cpu"])
def test_bf16_on_a_cpu_that_emulates_it_warns_with_the_fix(native, monkeypatch):
    """trainer.bf16=true is honoured (it is also the memory plan's fix), but on a CPU without native bf16 the run says
    that autocast is emulated there (17x slower per step, measured) and how to compute in float32."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = StarPOTrainer(config([*TEXT, "trainer.bf16=true", "device=cpu"]))
    emulated = [str(w.message) for w in caught if "without native bf16" in str(w.message)]
    assert trainer.cfg.trainer.bf16 is True
    assert len(emulated) == (0 if native else 1) and all("Set trainer.bf16=false" in m for m in emulated)


def test_after_a_reroll_everything_describes_the_batch_trained_on(monkeypatch):
    """DAPO rerolls when no group is kept. The first rollout here is made to keep nothing (and the filter keeps all
    of the next, whatever the random model's rewards): the metrics, the sample trajectories and the Echo Trap's
    group std must come from the second rollout."""
    trainer = StarPOTrainer(config([*TEXT, "algorithm=dapo", "filter=none", "filter.empty_policy=reroll"]))
    assert trainer.cfg.filter.empty_policy == "reroll"
    rollouts, real_rollout, real_filter = [], trainer.rollout, trainer.filter_hook
    monkeypatch.setattr(trainer, "rollout", lambda: rollouts.append(real_rollout()) or rollouts[-1])
    monkeypatch.setattr(
        trainer, "filter_hook", lambda t: ([], {"filter/kept_count": 0.0}) if len(rollouts) == 1 else real_filter(t)
    )
    echoed = []
    real_echo = trainer.monitor.echo
    monkeypatch.setattr(trainer.monitor, "echo", lambda std, metrics: echoed.append(std) or real_echo(std, metrics))
    metrics = trainer.train_iteration()
    assert len(rollouts) == 2 and metrics["filter/rerolls"] == 1 and metrics["filter/skipped_update"] == 0
    final = rollouts[1]
    assert trainer.last_trajectories is final
    for name, value in starpo.rollout_metrics(final).items():
        assert metrics[name] == value, name
    assert metrics["filter/kept_count"] == real_filter(final)[1]["filter/kept_count"]
    groups = starpo.group_returns(final, trainer.cfg.trainer.groups, trainer.cfg.trainer.group_size)
    assert echoed == [pytest.approx(float(groups.std(dim=1, unbiased=False).mean()))]


def test_self_imitation_keeps_the_positive_part_of_the_same_advantages():
    """advantage_min=0 changes nothing but the floor: the same rollout gets max(A, 0) of the plain estimator."""
    overrides = [*TEXT, "algorithm=drgrpo", "trainer.groups=2", "trainer.group_size=4"]
    plain, imitating = (
        StarPOTrainer(config(overrides)),
        StarPOTrainer(config([*overrides, "algorithm.advantage_min=0"])),
    )
    batch = starpo.trajectories_to_batch(plain.rollout(), pad_token_id=plain.learner.policy.tokenizer.pad_token_id or 0)
    # The random test model earns the same reward everywhere; give each rollout a different one.
    rewards = torch.arange(8, dtype=torch.float32)[:, None] * batch.response_mask
    batch = dataclasses.replace(batch, token_rewards=rewards)
    expected = plain.learner.score(batch).advantages
    assert (expected < 0).any() and (expected > 0).any(), "the rollout should have mixed advantages"
    assert torch.equal(imitating.learner.score(batch).advantages, expected.clamp(min=0))


def test_answer_tokens_keep_their_advantages_and_the_reasoning_gets_none():
    """advantage_tokens=answer changes nothing but the reasoning's tokens: each turn's tokens through its `</think>`
    (`reasoning_mask`) get 0, every other sampled token the plain estimator's advantage. The update logs their share;
    a response format without reasoning is refused."""
    from vagen.trainer.config import validate_config

    overrides = [*TEXT, "algorithm=drgrpo", "trainer.groups=2", "trainer.group_size=4"]
    plain, answer = (
        StarPOTrainer(config(overrides)),
        StarPOTrainer(config([*overrides, "algorithm.advantage_tokens=answer"])),
    )
    tokenizer = plain.learner.policy.tokenizer
    batch = starpo.trajectories_to_batch(plain.rollout(), pad_token_id=tokenizer.pad_token_id or 0)
    # The random test model never closes a reasoning: let each first turn's response open with one.
    closed = torch.tensor(tokenizer.encode("<think>a</think>", add_special_tokens=False))
    ids = batch.input_ids.clone()
    for row in range(len(batch)):
        first_turn = (batch.turn_ids[row] == 0).nonzero().flatten()
        if len(first_turn) > len(closed):
            ids[row, first_turn[: len(closed)]] = closed
    rewards = torch.arange(8, dtype=torch.float32)[:, None] * batch.response_mask  # a different reward per rollout
    batch = dataclasses.replace(batch, input_ids=ids, token_rewards=rewards)
    expected = plain.learner.score(batch).advantages
    reasoning = reasoning_mask(batch.input_ids, batch.turn_ids, tokenizer.decode)
    answer_tokens = (batch.response_mask > 0) & ~reasoning
    assert (expected[reasoning] != 0).any() and (expected[answer_tokens] != 0).any()
    assert torch.equal(answer.learner.score(batch).advantages, expected.masked_fill(reasoning, 0.0))
    share = answer.learner.update(batch, iteration=1).means()["rollout/reasoning_token_share"]
    assert share == pytest.approx(float(reasoning.sum() / (batch.response_mask > 0).sum()))
    no_reasoning = [*overrides, "algorithm.advantage_tokens=answer", "env.kwargs.response_format=no_think"]
    with pytest.raises(ValueError, match="response_format=no_think writes none"):
        validate_config(config(no_reasoning))


def test_the_demonstration_loss_adds_its_weighted_gradient_to_each_step(monkeypatch):
    """algorithm.sft_coef=c adds to every optimizer step c times the gradient of the mean log-loss of sft_batch_size
    demonstrations, drawn from the noisy solver's play of levels 0..sft_episodes-1 (as scripts/sft.py plays them), and
    logs that loss; a replica's rows of it add up to the whole; a run whose levels leave no demonstration is refused."""
    from vagen.bootstrap.demos import demonstrations, sft_batch
    from vagen.bootstrap.warmstart import WarmStartRecipe, backward_sft_batch, sft_loss
    from vagen.engines.base import derive_seed

    grads = record_step_gradients(monkeypatch)
    overrides = [*GRID_TEXT, "trainer.groups=2", "trainer.group_size=4", "algorithm.sft_episodes=6"]
    plain = StarPOTrainer(config(overrides))
    mixed = StarPOTrainer(config([*overrides, "algorithm.sft_coef=2.5", "algorithm.sft_batch_size=3"]))
    learner = mixed.learner
    assert plain.learner.demos == [] and [demo.trajectory.seed for demo in learner.demos] == list(range(6))
    expected_demos = demonstrations(learner._make_env, learner.formatter, range(6), WarmStartRecipe.noise_eps, 0)
    assert [d.trajectory.turns[0].response_ids for d in learner.demos] == [
        d.trajectory.turns[0].response_ids for d in expected_demos
    ]
    batch = starpo.trajectories_to_batch(plain.rollout(), pad_token_id=learner.policy.tokenizer.pad_token_id or 0)
    plain.learner.update(batch, iteration=3)
    stats = learner.update(batch, iteration=3).means()
    steps = len(grads) // 2
    assert steps == 2 and len(grads) == 4
    draws = torch.Generator().manual_seed(derive_seed(0, 3, learner_module.DEMO_STREAM))
    losses = []
    for step in range(steps):
        picks = torch.randperm(6, generator=draws)[:3].tolist()
        demo_batch = sft_batch([learner.demos[i] for i in picks], learner.tokenizer.pad_token_id)
        learner.model.zero_grad(set_to_none=True)
        loss = sft_loss(learner.model, demo_batch, learner.policy.processor)
        loss.backward()
        losses.append(float(loss.detach()))
        for name, p in learner.model.named_parameters():
            added = grads[steps + step][f"policy.{name}"] - grads[step][f"policy.{name}"]
            torch.testing.assert_close(added, 2.5 * p.grad, atol=1e-6, rtol=1e-4, msg=name)
    assert stats["loss/sft"] == pytest.approx(sum(losses) / steps, rel=1e-5)
    assert "loss/sft" not in plain.learner.update(batch, iteration=3).means()

    # Two replicas' rows of the demonstration batch (backward_sft_batch's rows) accumulate the whole batch's gradient.
    def gradient(rows_list):
        learner.model.zero_grad(set_to_none=True)
        for rows in rows_list:
            backward_sft_batch(learner.model, demo_batch, learner.policy.processor, 2, False, 2.5, rows)
        return [p.grad.clone() for p in learner.model.parameters()]

    whole, halves = gradient([torch.arange(3)]), gradient([torch.tensor([0, 2]), torch.tensor([1])])
    for want, got in zip(whole, halves, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)

    # Run seed 3's noise makes level 0's only demonstration all noise: no loss to add, which is said, not skipped.
    nothing = r"levels 0\.\.0 left no demonstration to train on; raise algorithm\.sft_episodes"
    with pytest.raises(ValueError, match=nothing):
        StarPOTrainer(config([*overrides, "seed=3", "algorithm.sft_coef=1", "algorithm.sft_episodes=1"]))


def test_the_think_only_demonstration_loss_imitates_each_turns_reasoning_alone(monkeypatch):
    """algorithm.sft_tokens=think: the demonstration loss covers each demonstration turn's tokens through its
    </think> and none of its answer; the same demonstrations are drawn as with the whole responses."""
    from vagen.bootstrap.demos import sft_batch
    from vagen.bootstrap.warmstart import sft_loss
    from vagen.engines.base import derive_seed
    from vagen.rollout.batch import reasoning_mask
    from vagen.trainer.config import validate_config

    grads = record_step_gradients(monkeypatch)
    overrides = [*GRID_TEXT, "trainer.groups=2", "trainer.group_size=4", "algorithm.sft_episodes=6"]
    overrides += ["algorithm.sft_coef=1", "algorithm.sft_batch_size=3"]
    whole = StarPOTrainer(config(overrides))
    think = StarPOTrainer(config([*overrides, "algorithm.sft_tokens=think"]))
    learner = think.learner
    batch = starpo.trajectories_to_batch(whole.rollout(), pad_token_id=learner.tokenizer.pad_token_id or 0)
    stats = {
        name: trainer.learner.update(batch, iteration=3).means()
        for name, trainer in [("whole", whole), ("think", think)]
    }
    draws = torch.Generator().manual_seed(derive_seed(0, 3, learner_module.DEMO_STREAM))
    losses = {"whole": [], "think": []}
    for _ in range(len(grads) // 2):
        picks = torch.randperm(6, generator=draws)[:3].tolist()
        demo_batch = sft_batch([learner.demos[i] for i in picks], learner.tokenizer.pad_token_id)
        reasoning = reasoning_mask(demo_batch.input_ids, demo_batch.turn_ids, learner.tokenizer.decode)
        answers = (demo_batch.response_mask > 0) & ~reasoning
        assert reasoning.any() and answers.any()  # every demonstration turn writes both parts
        for row in range(len(demo_batch)):  # each turn's reasoning is its first sampled tokens, the answer the rest
            for turn in demo_batch.turn_ids[row][demo_batch.turn_ids[row] >= 0].unique():
                marks = reasoning[row][demo_batch.turn_ids[row] == turn].tolist()
                assert marks == sorted(marks, reverse=True) and True in marks and False in marks
        think_batch = dataclasses.replace(demo_batch, response_mask=demo_batch.response_mask * reasoning)
        for name, tokens in [("whole", demo_batch), ("think", think_batch)]:
            losses[name].append(float(sft_loss(learner.model, tokens, learner.policy.processor).detach()))
    assert len(grads) == 4
    for name in losses:
        assert stats[name]["loss/sft"] == pytest.approx(sum(losses[name]) / 2, rel=1e-5)
    # (an untrained model's two losses are close, but far apart against the tolerance above: it tells them apart)
    assert abs(stats["think"]["loss/sft"] - stats["whole"]["loss/sft"]) > 1e-4 * stats["whole"]["loss/sft"]
    no_reasoning = [*overrides, "algorithm.sft_tokens=think", "env.kwargs.response_format=no_think"]
    with pytest.raises(ValueError, match=r"sft_tokens=think imitates only .*=no_think writes none"):
        validate_config(config(no_reasoning))


def test_visited_states_are_labelled_by_the_solver_after_the_policys_own_dialogue(monkeypatch):
    """algorithm.sft_source=visited: each turn of the iteration's rollouts whose state the solver can still solve
    becomes a demonstration: the policy's own earlier turns as context (out of the loss), then the solver's turn for the
    prompt the policy saw there; a replay that leaves the recorded states labels nothing after. The update's
    demonstration loss is drawn from those labels (and the run plays no demonstrations when it starts)."""
    from vagen.bootstrap.demos import demo_response, sft_batch, visited_demos
    from vagen.bootstrap.warmstart import sft_loss
    from vagen.engines.base import derive_seed

    overrides = [*GRID_TEXT, "trainer.groups=2", "trainer.group_size=4", "env.kwargs.max_turns=3"]
    trainer = StarPOTrainer(config([*overrides, "algorithm.sft_coef=1", "algorithm.sft_source=visited"]))
    learner = trainer.learner
    assert learner.demos == []
    trajectories = trainer.rollout()
    demos = visited_demos(learner._make_env, learner.formatter, trajectories)

    expected, env = [], learner._make_env()  # by hand: replay each episode, ask the solver at every turn
    for trajectory in trajectories:
        env.reset(seed=trajectory.seed)
        for index, turn in enumerate(trajectory.turns):
            assert env.unwrapped.state_key() == turn.state_key  # a text grid game replays exactly
            plan = env.unwrapped.solver_actions()
            if plan:
                expected.append((trajectory, index, demo_response(env, plan[: env.unwrapped.max_actions_per_turn])))
            env.step(turn.response_text)
    assert len(demos) == len(expected) > len(trajectories)  # later turns are labelled too
    for demo, (trajectory, index, text) in zip(demos, expected, strict=True):
        turns = demo.trajectory.turns
        assert turns[:index] == trajectory.turns[:index] and demo.noisy_turns == [True] * index + [False]
        assert turns[-1].response_text == text and turns[-1].prompt_ids == trajectory.turns[index].prompt_ids
        batch = sft_batch([demo], learner.tokenizer.pad_token_id)
        start, end = demo.trajectory.response_spans()[-1]
        assert batch.response_mask[0].nonzero().flatten().tolist() == list(range(start, end))  # only the label

    # A replay that leaves the recorded states (here: a recorded key changed) labels no turn from there on.
    first = trajectories[0]
    assert len(first.turns) >= 2
    moved = dataclasses.replace(first, turns=[first.turns[0], dataclasses.replace(first.turns[1], state_key="x")])
    labelled_first = [1] if any(t is first and index == 0 for t, index, _ in expected) else []
    relabelled = visited_demos(learner._make_env, learner.formatter, [moved])
    assert [len(demo.trajectory.turns) for demo in relabelled] == labelled_first

    # The update draws its demonstration batches from these labels, as from the solver's demonstrations.
    grads = record_step_gradients(monkeypatch)  # steps record instead of stepping: every draw sees the same weights
    batch = starpo.trajectories_to_batch(trajectories, pad_token_id=learner.tokenizer.pad_token_id or 0)
    loss = learner.update(batch, iteration=3, visited=trajectories).means()["loss/sft"]
    draws = torch.Generator().manual_seed(derive_seed(0, 3, learner_module.DEMO_STREAM))
    losses = []
    for _ in grads:
        picks = torch.randperm(len(demos), generator=draws)[: learner.cfg.algorithm.sft_batch_size].tolist()
        demo_batch = sft_batch([demos[i] for i in picks], learner.tokenizer.pad_token_id)
        losses.append(float(sft_loss(learner.model, demo_batch, learner.policy.processor).detach()))
    assert len(grads) >= 1 and loss == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_select_slices_the_training_tensors_with_their_dialogues():
    trainer = StarPOTrainer(config([*TEXT, "algorithm=ppo", "trainer.groups=2", "trainer.group_size=2"]))
    batch = trainer.learner.score(
        starpo.trajectories_to_batch(trainer.rollout(), pad_token_id=trainer.learner.policy.tokenizer.pad_token_id or 0)
    )
    rows = [2, 0]
    part = batch.select(rows)
    length = part.input_ids.shape[1]
    for name in ("old_logprobs", "old_values", "advantages", "value_targets", "response_mask"):
        assert torch.equal(getattr(part, name), getattr(batch, name)[rows, :length]), name
    assert part.ref_logprobs is not None and torch.equal(part.ref_logprobs, batch.ref_logprobs[rows, :length])
    assert torch.equal(part.group_index, batch.group_index[rows]) and len(part.images) == 2


@pytest.mark.parametrize(
    "overrides",
    [
        TEXT,  # one mini-batch: no separate old-log-prob pass at all
        [*TEXT, "trainer.groups=2", "trainer.group_size=4", "trainer.ppo_epochs=2"],  # 2 mini-batches, 2 epochs
        [*VISUAL, "algorithm=ppo", "trainer.bf16=true"],
    ],
    ids=["one-mini-batch", "two-mini-batches-two-epochs", "visual-ppo-bf16"],
)
def test_reusing_the_first_forward_gives_the_plain_paths_gradients(overrides, monkeypatch):
    """trainer.reuse_first_forward skips the no-grad pass for the first mini-batch's old log-probs; every optimizer
    step must see the gradients and the loss metrics of the plain path (old log-probs all precomputed)."""
    grads = record_step_gradients(monkeypatch)
    overrides = [*overrides, "trainer.old_logprobs=recompute"]  # the other rows scored by a pass in both
    plain = StarPOTrainer(config([*overrides, "trainer.reuse_first_forward=false"]))
    fast = StarPOTrainer(config([*overrides, "trainer.reuse_first_forward=true"]))
    batch = starpo.trajectories_to_batch(plain.rollout(), pad_token_id=plain.learner.policy.tokenizer.pad_token_id or 0)
    plain_metrics, fast_metrics = plain.learner.update(batch, 0).means(), fast.learner.update(batch, 0).means()
    assert_same_steps(grads, atol=1e-6, rtol=1e-5)
    for name in ("loss/policy", "policy/ratio_mean", "policy/clipfrac", "rollout/logprob_gap_mean"):
        assert fast_metrics[name] == pytest.approx(plain_metrics[name], abs=1e-6), name


@pytest.mark.parametrize(
    "overrides",
    [
        [*TEXT, "trainer.groups=2", "trainer.group_size=4", "trainer.ppo_epochs=2"],  # 2 mini-batches, 2 epochs
        [*VISUAL, "algorithm=ppo", "trainer.mini_batch_size=2"],
    ],
    ids=["text-two-mini-batches-two-epochs", "visual-ppo-two-mini-batches"],
)
def test_old_logprobs_from_the_rollout_give_the_recomputed_gradients(overrides, monkeypatch):
    """trainer.old_logprobs=rollout takes the old log-probs of the rows not scored by the first mini-batch from the
    hf engine instead of a no-grad pass: the engine sampled the very function the update scores (fp32), so every
    optimizer step's gradients equal the recomputed path's to float rounding; the gap is measured on the exact rows."""
    grads = record_step_gradients(monkeypatch)
    plain = StarPOTrainer(config([*overrides, "trainer.old_logprobs=recompute"]))
    fast = StarPOTrainer(config([*overrides, "trainer.old_logprobs=rollout"]))
    assert not plain.learner.old_logprobs_from_rollout and fast.learner.old_logprobs_from_rollout
    batch = starpo.trajectories_to_batch(plain.rollout(), pad_token_id=plain.learner.policy.tokenizer.pad_token_id or 0)
    calls = {"plain": 0, "fast": 0}
    for name, trainer in (("plain", plain), ("fast", fast)):
        hook = lambda *args, name=name: calls.__setitem__(name, calls[name] + (not torch.is_grad_enabled()))
        trainer.learner.model.get_decoder().layers[0].register_forward_pre_hook(hook)
    plain_metrics, fast_metrics = plain.learner.update(batch, 0).means(), fast.learner.update(batch, 0).means()
    assert calls["plain"] > 0 and calls["fast"] == 0  # no no-grad pass of the policy (the KL reference is a copy)
    assert assert_same_steps(grads, atol=1e-5, rtol=1e-4) > 1
    for name in ("loss/policy", "policy/ratio_mean", "policy/clipfrac"):
        assert fast_metrics[name] == pytest.approx(plain_metrics[name], abs=1e-5), name
    assert 0 < fast_metrics["rollout/logprob_gap_mean"] < 1e-5 and fast_metrics["rollout/logprob_gap_max"] < 1e-3


def test_old_logprobs_auto_takes_the_rollouts_only_where_the_engine_samples_the_trained_function():
    resolve = lambda *extra: learner_module.old_logprobs_from_rollout(config([*TEXT, *extra]))
    assert resolve() and resolve("trainer.old_logprobs=rollout", "trainer.bf16=true")
    assert not resolve("trainer.bf16=true") and not resolve("rollout.top_p=0.9")
    assert not resolve("trainer.old_logprobs=recompute")
    vllm = config(TEXT)
    vllm.rollout.engine = "vllm"
    assert not learner_module.old_logprobs_from_rollout(vllm)


@pytest.mark.parametrize("overrides", [[*TEXT, "algorithm=ppo"], VISUAL], ids=["text-ppo", "visual"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(overrides, monkeypatch):
    """trainer.gradient_checkpointing recomputes each layer in backward (its forward runs twice) and changes no
    number: losses and gradients of the update equal those without it (fp32, 1e-5); rollout is untouched. Both run
    every row whole: a checkpointed layer keeps no cache, so shared first prompts are not run once there."""
    grads = record_step_gradients(monkeypatch)
    monkeypatch.setattr("vagen.forward.shared_prefix", lambda model, batch: None)
    plain = StarPOTrainer(config(overrides))
    recomputed = StarPOTrainer(config([*overrides, "trainer.gradient_checkpointing=true"]))
    batch = starpo.trajectories_to_batch(plain.rollout(), pad_token_id=plain.learner.policy.tokenizer.pad_token_id or 0)
    calls = {"plain": [], "recomputed": []}
    for name, trainer in (("plain", plain), ("recomputed", recomputed)):  # a pre-hook: recomputation stops early
        hook = lambda *args, name=name: calls[name].append(torch.is_grad_enabled())
        trainer.learner.model.get_decoder().layers[0].register_forward_pre_hook(hook)
    plain_metrics, recomputed_metrics = (
        plain.learner.update(batch, 0).means(),
        recomputed.learner.update(batch, 0).means(),
    )
    assert calls["recomputed"].count(True) == 2 * calls["plain"].count(True) > 0  # forward + recomputation
    assert not recomputed.learner.model.get_decoder().layers[0].training  # eval mode again after the update
    assert_same_steps(grads, atol=1e-5, rtol=1e-5)
    for name in ("loss/policy", "loss/total"):
        assert recomputed_metrics[name] == pytest.approx(plain_metrics[name], abs=1e-5), name
    monkeypatch.undo()  # a whole iteration with real optimizer steps
    metrics = recomputed.train_iteration()
    assert math.isfinite(metrics["policy/grad_norm"]) and metrics["policy/update_norm"] > 0


@pytest.mark.parametrize("overrides", [TEXT, VISUAL], ids=["text", "visual"])
def test_a_right_padded_batch_is_scored_without_a_mask_to_the_same_numbers(overrides):
    """The trainer's batches pad at the ends of rows, where causal attention never looks back: the forward drops the
    mask (so the kernel skips the masked half) and real positions get the masked path's hidden states and
    gradients."""
    from vagen.forward import model_inputs

    trainer = StarPOTrainer(config(overrides))
    batch = starpo.trajectories_to_batch(
        trainer.rollout(), pad_token_id=trainer.learner.policy.tokenizer.pad_token_id or 0
    )
    batch.attention_mask[0, -5:] = 0  # the first dialogue ends 5 tokens earlier (text tokens, after its images)
    real = batch.attention_mask.bool()
    inputs = model_inputs(trainer.learner.model, batch, trainer.learner.policy.processor)
    assert inputs["attention_mask"] is None
    left_padded = dataclasses.replace(batch, attention_mask=batch.attention_mask.clone())
    left_padded.attention_mask[1, 0] = 0
    assert (
        model_inputs(trainer.learner.model, left_padded, trainer.learner.policy.processor)["attention_mask"] is not None
    )
    results = []
    for mask in (None, batch.attention_mask):
        trainer.learner.model.zero_grad()
        hidden = trainer.learner.model.model(**{**inputs, "attention_mask": mask}).last_hidden_state
        (hidden[real].square().sum()).backward()
        grads = [p.grad.clone() for p in trainer.learner.model.parameters() if p.grad is not None]
        results.append((hidden[real].detach(), grads))
    assert torch.equal(results[0][0], results[1][0])
    for got, want in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_lora_reference_is_the_base_model_with_adapters_off_and_no_second_copy():
    """With LoRA and a KL term the reference is the policy with its adapters disabled: after training it still
    scores exactly as the untouched base model, and the trainer holds no second set of weights."""
    from vagen.models.registry import load_policy

    cfg = config([*TEXT, "trainer.lora.enabled=true", "algorithm.kl_coef=0.1", "filter.empty_policy=keep_all"])
    trainer = StarPOTrainer(cfg)
    assert trainer.learner.reference is trainer.learner.model
    modules = [m for m in vars(trainer.learner).values() if isinstance(m, torch.nn.Module)]
    storages = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
    assert storages == {p.untyped_storage().data_ptr() for p in trainer.learner.model.parameters()}
    for _ in range(2):
        metrics = trainer.train_iteration()
    assert "loss/kl" in metrics
    batch = starpo.trajectories_to_batch(
        trainer.last_trajectories, pad_token_id=trainer.learner.policy.tokenizer.pad_token_id
    )
    scored = trainer.learner.score(batch)
    base = load_policy(cfg.model.name, cfg.model.source, "text", size=cfg.model.size, dtype=cfg.model.dtype).model
    temperature = cfg.rollout.temperature
    want = learner_module.batched_logprobs(base, batch, trainer.learner.policy.processor, 2, temperature)
    torch.testing.assert_close(scored.ref_logprobs, want, atol=1e-5, rtol=1e-5)
    # The adapters are on again after scoring the reference, and trained: the policy has moved away from it.
    assert not torch.allclose(scored.old_logprobs, scored.ref_logprobs, atol=1e-6)
    assert all(p.requires_grad for n, p in trainer.learner.model.named_parameters() if "lora_" in n)


def test_a_non_finite_update_stops_before_the_step_and_names_the_intact_checkpoint(tmp_path):
    """A value model that diverged (NaN weights) makes the advantages, the loss and the gradient NaN: the update must
    stop before any optimizer steps (nothing is written from it), naming the iteration and the last checkpoint."""
    from vagen.trainer.checkpoint import latest_checkpoint

    overrides = [*TEXT, "algorithm=ppo", "filter.empty_policy=keep_all", "trainer.save_every=1"]
    train(config([*overrides, "trainer.iterations=1"], tmp_path))
    run_dir = tmp_path / "run"
    saved = latest_checkpoint(run_dir)
    files = {path: path.read_bytes() for path in saved.rglob("*") if path.is_file()}
    trainer = StarPOTrainer(config([*overrides, "trainer.iterations=2"], tmp_path))
    trainer.restore(saved)
    with torch.no_grad():
        trainer.learner.critic.value_head.weight.fill_(float("nan"))
    policy = snapshot(trainer.learner.model)
    steps = {name: [s["step"].item() for s in opt.state.values()] for name, opt in trainer.learner.optimizers.items()}
    with pytest.raises(ValueError, match=r"iteration 2: .*nan.*iter_000001 .*intact") as error:
        trainer.train_iteration()
    assert type(error.value).__name__ == "NonFiniteTraining"
    assert all(torch.equal(p, policy[name]) for name, p in trainer.learner.model.named_parameters())
    assert steps == {
        name: [s["step"].item() for s in opt.state.values()] for name, opt in trainer.learner.optimizers.items()
    }
    assert latest_checkpoint(run_dir) == saved and all(path.read_bytes() == data for path, data in files.items())


GRID_TEXT = ["env=frozenlake_text", "model=tiny_text_test", *FAST]


@pytest.mark.parametrize(
    "overrides",
    [GRID_TEXT, VISUAL, [*VISUAL, "trainer.group_size=3", "env.kwargs.max_turns=3"]],
    ids=["text", "visual", "turns"],
)
def test_shared_first_prompts_run_once_and_give_the_whole_rows_numbers(overrides):
    """A group's rollouts open with one first prompt (its ids and its image): `backbone_hidden` runs it once per
    group and continues every row from its keys and values. The hidden states of every real position and the gradients
    equal the whole rows' pass to float rounding, and so do the log-probs the update trains on."""
    from vagen.forward import backbone_hidden, policy_forward, shared_prefix

    trainer = StarPOTrainer(config(overrides))
    learner = trainer.learner
    batch = starpo.trajectories_to_batch(trainer.rollout(), pad_token_id=learner.policy.tokenizer.pad_token_id or 0)
    representatives, index, images = shared_prefix(learner.model, batch)
    assert index.tolist() == batch.group_index.tolist()  # one prefix per group: its level's first observation
    assert len(representatives) == trainer.cfg.trainer.groups
    assert images == [1 if "visual" in trainer.cfg.env.name else 0] * len(batch)
    real = batch.attention_mask.bool()
    results = []
    for share in (True, False):
        learner.model.zero_grad()
        hidden = backbone_hidden(learner.model, learner.model.model, batch, learner.policy.processor, share=share)
        (hidden[real].square().sum()).backward()
        grads = [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]
        results.append((hidden[real].detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    assert len(results[0][1]) == len(results[1][1]) > 0
    for got, want in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
    logprobs, _ = policy_forward(learner.model, batch, learner.policy.processor)
    torch.testing.assert_close(logprobs, batch.rollout_logprobs, rtol=0, atol=1e-4)


def test_a_prefix_is_shared_by_the_rows_that_agree_in_it_and_nowhere_else():
    """Rows share a prefix exactly where their ids before the first sampled token agree: one row per group shares
    none (nothing to run once), and a row whose first sampled token comes later has a prefix of its own."""
    from vagen.forward import shared_prefix

    trainer = StarPOTrainer(config(GRID_TEXT))
    batch = starpo.trajectories_to_batch(trainer.rollout(), pad_token_id=0)
    _, index, _ = shared_prefix(trainer.learner.model, batch)
    assert index.tolist() == batch.group_index.tolist()
    one_per_group = batch.select(torch.tensor([batch.group_index.tolist().index(g) for g in range(2)]))
    assert shared_prefix(trainer.learner.model, one_per_group) is None
    shifted = dataclasses.replace(batch, response_mask=batch.response_mask.clone())
    shifted.response_mask[0, int(shifted.response_mask[0].nonzero()[0])] = 0  # row 0 samples from one token later
    _, index, _ = shared_prefix(trainer.learner.model, shifted)
    assert index.tolist() == [0, *[i + 1 for i in batch.group_index.tolist()[1:]]]
