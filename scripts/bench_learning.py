"""Learning evidence: held-out success before and after StarPO training, per algorithm and training seed.

    python scripts/bench_learning.py [algorithms=grpo,starpo_s] [seeds=0,1,2] [eval_episodes=256] [jobs=1]
                                     [out=outputs/bench_learning] [hydra overrides for scripts/train.py ...]

Each (algorithm, seed) is one `scripts/train.py` run in `out/<algorithm>-seed<seed>` with the trainer's
own held-out validation (`trainer.eval_every`, fixed evaluation seeds 1e9 + k that no run trains on,
temperature `trainer.eval_temperature`): "before" is its validation at iteration 0, "after" its last.
`jobs` runs that many trainings side by side, each on `cpu_threads / jobs` torch threads. Prints a
before/after table with 95% Wilson intervals, writes it to `out/summary.md`, and draws every run's
held-out curve into `out/val_curves.png`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vagen.logging import read_metrics
from vagen.viz.plots import draw_held_out, new_figure, save_figure

ROOT = Path(__file__).resolve().parent.parent
COLOURS = ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown")
LINESTYLES = ("-", "--", ":", "-.")


def option(argv: list[str], name: str, default: str) -> str:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")), default)


BENCH_ONLY_OVERRIDES = ("trainer.eval_episodes", "trainer.resume", "logger.wandb_mode", "logger.progress", "run_dir")


def training_overrides(algorithm: str, seed: int, run_dir: Path, episodes: int, extra: list[str]) -> list[str]:
    """The `scripts/train.py` overrides of one run: the algorithm preset and seed, plus only what a benchmark
    must set (validation size, a fresh run folder, quiet logging); every training setting is the default's."""
    return [
        f"algorithm={algorithm}",
        f"seed={seed}",
        f"trainer.eval_episodes={episodes}",
        "trainer.resume=never",
        "logger.wandb_mode=disabled",
        "logger.progress=false",
        f"run_dir={run_dir}",
        *extra,
    ]


def train_run(algorithm: str, seed: int, run_dir: Path, episodes: int, threads: int, extra: list[str]) -> Path:
    """One training run in a subprocess (its own torch threads), logging to run_dir/train.out."""
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(ROOT / "scripts" / "train.py")]
    command += training_overrides(algorithm, seed, run_dir, episodes, extra)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(run_dir / "train.out", "w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=True, cwd=ROOT)
    return run_dir


def validations(records: list[dict], run_dir: Path) -> list[dict]:
    """The records of a run that hold a validation, iteration 0 first."""
    validated = [r for r in records if "val/success" in r]
    if len(validated) < 2:
        raise ValueError(f"{run_dir} has fewer than two validations; set trainer.eval_every > 0.")
    return validated


def cell(record: dict) -> str:
    """Held-out success with the 95% interval the trainer logged beside it."""
    return f"{record['val/success']:.1%} [{record['val/success_ci_low']:.1%}, {record['val/success_ci_high']:.1%}]"


def summary(runs: dict[tuple[str, int], Path]) -> str:
    lines = [
        "| algorithm | seed | held-out before | held-out after | change | training minutes |",
        "|---|---|---|---|---|---|",
    ]
    gains: dict[str, list[float]] = {}
    for (algorithm, seed), run_dir in runs.items():
        records = read_metrics(run_dir)
        validated = validations(records, run_dir)
        first, last = validated[0], validated[-1]
        gain = last["val/success"] - first["val/success"]
        gains.setdefault(algorithm, []).append(gain)
        minutes = sum(r.get("perf/iteration_s", 0.0) for r in records) / 60  # training only, validation excluded
        lines.append(f"| {algorithm} | {seed} | {cell(first)} | {cell(last)} | {gain * 100:+.1f} pts | {minutes:.1f} |")
    lines += ["", "| algorithm | seeds | mean change | std over seeds | every seed positive |", "|---|---|---|---|---|"]
    for algorithm, values in gains.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        lines.append(
            f"| {algorithm} | {len(values)} | {statistics.mean(values) * 100:+.1f} pts | {spread * 100:.1f} pts | "
            f"{'yes' if all(v > 0 for v in values) else 'no'} |"
        )
    return "\n".join(lines)


def plot_curves(runs: dict[tuple[str, int], Path], path: Path) -> Path:
    figure = new_figure(9, 5)
    ax = figure.subplots()
    algorithms = sorted({algorithm for algorithm, _ in runs})
    seeds = sorted({seed for _, seed in runs})
    for (algorithm, seed), run_dir in runs.items():
        colour = COLOURS[algorithms.index(algorithm) % len(COLOURS)]
        line = draw_held_out(ax, read_metrics(run_dir), label=f"{algorithm} seed {seed}", colour=colour)
        line.set_linestyle(LINESTYLES[seeds.index(seed) % len(LINESTYLES)])  # one colour per algorithm, a dash per seed
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("iteration")
    ax.set_ylabel("held-out success (95% CI band)")
    ax.legend(fontsize=8, ncols=2)
    ax.set_title("Held-out success during training", loc="left")
    return save_figure(figure, path)


def main(argv: list[str]) -> None:
    algorithms = option(argv, "algorithms", "grpo,starpo_s").split(",")
    seeds = [int(s) for s in option(argv, "seeds", "0,1,2").split(",")]
    episodes = int(option(argv, "eval_episodes", "256"))
    jobs = int(option(argv, "jobs", "1"))
    out = Path(option(argv, "out", "outputs/bench_learning")).resolve()
    overrides = [a for a in argv if a.split("=", 1)[0] not in ("algorithms", "seeds", "eval_episodes", "jobs", "out")]
    threads = max(1, (os.cpu_count() or 1) // jobs)
    keys = [(algorithm, seed) for algorithm in algorithms for seed in seeds]
    with ThreadPoolExecutor(jobs) as pool:
        futures = {
            key: pool.submit(train_run, key[0], key[1], out / f"{key[0]}-seed{key[1]}", episodes, threads, overrides)
            for key in keys
        }
        runs = {key: future.result() for key, future in futures.items()}
    table = summary(runs)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    print(f"\nval curves: {plot_curves(runs, out / 'val_curves.png')}")


if __name__ == "__main__":
    main(sys.argv[1:])
