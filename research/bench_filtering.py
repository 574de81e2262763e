"""Cost of SNR-aware filtering and of the MI diagnostics, measured side by side in one run.

    python research/bench_filtering.py [hydra overrides, e.g. model=tiny_vl env=sokoban_visual] [repeats=3]

One rollout batch is collected once (a fixed rollout budget). On copies of the same starting
weights, the update is then timed on the whole batch (filter=none) and on the groups top_p keeps,
alternating the two `repeats` times; MI scoring of the same batch is timed against a full
iteration (rollout + update). Figures are ratios of medians, as the papers report step time.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from vagen.cli import script_options
from vagen.filtering import select_groups
from vagen.rollout import trajectories_to_batch
from vagen.trainer.starpo import StarPOTrainer, group_returns

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    options, overrides = script_options(argv, {"repeats": 3})
    repeats = options.repeats
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("train", overrides=["logger.wandb_mode=disabled", "diagnostics.compute_freq=1", *overrides])
    trainer = StarPOTrainer(cfg)
    learner = trainer.learner
    start_state = copy.deepcopy(learner.model.state_dict())
    start = time.perf_counter()
    trajectories = trainer.rollout()
    rollout_s = time.perf_counter() - start
    rewards = group_returns(trajectories, cfg.trainer.groups, cfg.trainer.group_size)
    kept, metrics = select_groups(
        rewards, strategy="top_p", value=cfg.filter.value if cfg.filter.strategy == "top_p" else 0.9
    )
    keep = set(kept.tolist())
    pad = learner.tokenizer.pad_token_id or 0
    batches = {
        "none": trajectories_to_batch(trajectories, pad),
        "top_p": trajectories_to_batch([t for t in trajectories if t.group_id in keep], pad) if keep else None,
    }
    times: dict[str, list[float]] = {"none": [], "top_p": [], "mi": []}
    for _ in range(repeats):
        for name, batch in batches.items():
            if batch is None:
                continue
            learner.model.load_state_dict(start_state)
            times[name].append(timed(lambda batch=batch: learner.update(batch, 0)))
        learner.model.load_state_dict(start_state)
        times["mi"].append(timed(lambda: trainer.monitor.mi(learner, trajectories, 0)))
    median = {name: statistics.median(values) for name, values in times.items() if values}
    step = rollout_s + median["none"]
    print(
        f"batch: {cfg.trainer.groups} groups x {cfg.trainer.group_size} rollouts, model={cfg.model.name}, "
        f"env={cfg.env.name}; top_p kept {len(keep)}/{cfg.trainer.groups} groups "
        f"(Std(RV)/Mean(RV) = {float(metrics['reward_std_ratio']):.2f})"
    )
    print(f"rollout: {rollout_s:.2f} s (once)")
    print(f"update, filter=none : {median['none']:.2f} s (median of {repeats})")
    if "top_p" in median:
        saved = 1 - (rollout_s + median["top_p"]) / step
        print(
            f"update, filter=top_p: {median['top_p']:.2f} s -> update time x{median['top_p'] / median['none']:.2f}, "
            f"step time (rollout + update) {saved:.0%} less"
        )
    else:
        print("update, filter=top_p: no group has reward variance in this batch; nothing to train on")
    print(
        f"MI scoring: {median['mi']:.2f} s = {median['mi'] / step:.2f} x a training step "
        f"({rollout_s + median['none']:.2f} s)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
