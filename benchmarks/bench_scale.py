"""One process against `trainer.workers=2` Ray workers on the same run, side by side, iterations interleaved.

    python benchmarks/bench_scale.py [iterations=4] [threads=2] [hydra overrides for scripts/train.py ...]

Both trainers are built first (the default run unless overridden: tiny_vl on sokoban_visual, GRPO, 8 groups × 8
rollouts), then their iterations alternate, so machine noise falls on both. The single process uses `threads`
torch threads; each of the 2 workers gets `threads / 2` (`ray.cpus_per_worker`). With the same seeds both play
the same trajectories (`tests/test_workers.py`), so the work is identical. Prints per-phase medians over
iterations 2..N (the first warms caches): iteration, rollout and update seconds, rollout tokens/s, and the
2-worker / 1-process ratios. On a 2-core CPU expect at most 2 cores' worth for both.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from vagen.cli import script_options
from vagen.trainer.starpo import StarPOTrainer
from vagen.trainer.workers import local_ray_environment

ROOT = Path(__file__).resolve().parent.parent


def config(run_dir: Path, extra: list[str]):
    overrides = [
        "trainer.eval_every=0",
        "trainer.viz_every=0",
        "diagnostics.compute_freq=0",
        "logger.wandb_mode=disabled",
        "logger.progress=false",
        *extra,
    ]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("train", overrides=overrides)
    cfg.run_dir = str(run_dir)
    return cfg


def rollout_tokens(trainer) -> int:
    return sum(len(turn.response_ids) for trajectory in trainer.last_trajectories for turn in trajectory.turns)


def main() -> None:
    options, extra = script_options(sys.argv[1:], {"iterations": 4, "threads": 2})
    iterations, threads = options.iterations, options.threads
    torch.set_num_threads(threads)
    local_ray_environment()  # workers at normal priority, so the race is fair on a shared machine
    import ray

    ray.init(num_cpus=threads, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as scratch:
        single = StarPOTrainer(config(Path(scratch) / "single", extra))
        per_worker = max(1, threads // 2)
        workers = StarPOTrainer(
            config(Path(scratch) / "workers", [*extra, "trainer.workers=2", f"ray.cpus_per_worker={per_worker}"])
        )
        rows: dict[str, list[dict[str, float]]] = {"1 process": [], "2 Ray workers": []}
        try:
            for _ in range(iterations):
                for name, trainer in (("1 process", single), ("2 Ray workers", workers)):
                    metrics = trainer.train_iteration()
                    metrics["tokens"] = rollout_tokens(trainer)
                    rows[name].append(metrics)
        finally:
            workers.close()
            ray.shutdown()
    report(rows, threads)


def report(rows: dict[str, list[dict[str, float]]], threads: int) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(m[key] for m in rows[name][1:] or rows[name])

    def tokens_per_s(name: str) -> float:
        return statistics.median(m["tokens"] / m["perf/rollout_s"] for m in rows[name][1:] or rows[name])

    print(f"threads={threads}; medians over iterations 2..{len(rows['1 process'])}")
    print("| trainer | iteration s | rollout s | update s | rollout tokens/s |")
    print("|---|---|---|---|---|")
    for name in rows:
        print(
            f"| {name} | {median(name, 'perf/iteration_s'):.2f} | {median(name, 'perf/rollout_s'):.2f} | "
            f"{median(name, 'perf/update_s'):.2f} | {tokens_per_s(name):.0f} |"
        )
    one, two = "1 process", "2 Ray workers"
    print(
        f"2 workers / 1 process: iteration time {median(two, 'perf/iteration_s') / median(one, 'perf/iteration_s'):.2f}"
        f"x, rollout tokens/s {tokens_per_s(two) / tokens_per_s(one):.2f}x"
    )


if __name__ == "__main__":
    main()
