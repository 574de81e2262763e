"""Learning evidence: held-out success before and after StarPO training, per algorithm and training seed.

    python scripts/bench_learning.py [algorithms=grpo,starpo_s] [seeds=0,1,2] [eval_episodes=256] [jobs=1]
                                     [paired_samples=4] [out=outputs/bench_learning]
                                     [hydra overrides for scripts/train.py ...]

Each (algorithm, seed) is one `scripts/train.py` run in `out/<algorithm>-seed<seed>` with the trainer's
own held-out validation (`trainer.eval_every`, fixed evaluation seeds 1e9 + k that no run trains on,
temperature `trainer.eval_temperature`): "before" is its validation at iteration 0, "after" its last.
`jobs` runs that many trainings side by side, each on `cpu_threads / jobs` torch threads. Prints a
before/after table with 95% Wilson intervals, writes it to `out/summary.md`, and draws every run's
held-out curve into `out/val_curves.png`.

That first table compares one sampled draw per seed before and after. Every run shares the same "before" draw
(validation is deterministic), so its luck moves every run's change the same way: "every seed positive" can be
that draw's doing. With `paired_samples=k` (0: skip), `scripts/evaluate.py` then plays the warm start and each
run's last checkpoint k times on each of the same `eval_episodes` seeds (the runs' env, model and validation
sampling) into `out/paired/`, and a second table gives each run's change paired by level with its 95% interval,
and each algorithm's mean change over its training seeds, with its interval (`vagen.eval.paired_change`).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from vagen.eval import CellStore, evaluate, outcomes_by_seed, paired_change
from vagen.eval.runner import episode_seeds
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


def paired_config(runs: dict[tuple[str, int], Path], samples: int, seeds: int, out_dir: Path) -> DictConfig:
    """The scripts/evaluate.py config that plays the runs' warm start (their `model` config, entry first) and each
    run's last checkpoint `samples` times on each of the validation's first `seeds` seeds, with the runs' env and
    the validation's sampling (`trainer.eval_temperature`, `rollout.max_new_tokens`)."""
    run_configs = {run_dir: OmegaConf.load(run_dir / "config.yaml") for run_dir in runs.values()}
    first = next(iter(run_configs.values()))
    for run_dir, run_config in run_configs.items():
        if run_config.env != first.env or run_config.model != first.model:
            raise ValueError(f"{run_dir} trained another env or model than the other runs; they share one warm start.")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("evaluate", overrides=[f"out_dir={out_dir}", "plot=false", f"samples_per_seed={samples}"])
    temperature = float(first.trainer.eval_temperature)
    cfg.models = [str(first.model.name), *(str(run_dir) for run_dir in runs.values())]
    cfg.model_overrides = first.model  # the warm start exactly as trained (model.path=..., dtype, ...)
    cfg.envs = [str(first.env.name)]
    cfg.env_overrides = first.env.kwargs
    cfg.episodes = seeds * samples
    cfg.episodes_per_batch = max(int(cfg.episodes_per_batch), samples)  # a seed's samples never share a stream
    cfg.temperature, cfg.greedy = temperature, temperature == 0.0  # validation's 0 means greedy
    cfg.max_new_tokens = first.rollout.max_new_tokens
    cfg.max_context_tokens = first.rollout.max_context_tokens
    return cfg


def success_by_seed(cfg: DictConfig, label: str) -> dict[int, float]:
    """Each evaluation seed's success rate over its samples in the evaluate cell (label, the only env)."""
    env = str(cfg.envs[0])
    store = CellStore(Path(cfg.out_dir) / label / env, label, env)
    records = [store.load(index, seed) for index, seed in enumerate(episode_seeds(cfg))]
    return {seed: sum(wins) / len(wins) for seed, wins in outcomes_by_seed(records).items()}


def interval(mean: float, low: float, high: float) -> str:
    return f"{mean * 100:+.1f} pts [{low * 100:+.1f}, {high * 100:+.1f}]"


def paired_summary(runs: dict[tuple[str, int], Path], samples: int, seeds: int, out_dir: Path) -> str:
    """Evaluate the warm start and every run `samples` times per seed; the table of changes paired by level."""
    shutil.rmtree(out_dir, ignore_errors=True)  # the runs were just retrained: old episodes are not theirs
    cfg = paired_config(runs, samples, seeds, out_dir)
    base_row, *run_rows = evaluate(cfg, ROOT / "configs").rows
    before = success_by_seed(cfg, base_row["model"])
    lines = [
        f"Paired re-measurement: {seeds} held-out seeds x {samples} samples each, warm start "
        f"{base_row['success']:.1%} ({base_row['model']}, `{out_dir}`).",
        "",
        "| algorithm | seed | after | paired change [95% CI] |",
        "|---|---|---|---|",
    ]
    after_by_algorithm: dict[str, list[dict[int, float]]] = {}
    lows: dict[str, list[float]] = {}
    for (algorithm, seed), row in zip(runs, run_rows, strict=True):
        after = success_by_seed(cfg, row["model"])
        mean, low, high, _ = paired_change(before, after)
        after_by_algorithm.setdefault(algorithm, []).append(after)
        lows.setdefault(algorithm, []).append(low)
        lines.append(f"| {algorithm} | {seed} | {row['success']:.1%} | {interval(mean, low, high)} |")
    lines += [
        "",
        "| algorithm | training seeds | mean change [95% CI] | measurable gain | every run's interval above 0 |",
        "|---|---|---|---|---|",
    ]
    for algorithm, afters in after_by_algorithm.items():
        # The mean run's per-level success against the one shared warm start, so its noise is counted once.
        mean_after = {seed: statistics.mean(after[seed] for after in afters) for seed in afters[0]}
        mean, low, high, _ = paired_change(before, mean_after)
        lines.append(
            f"| {algorithm} | {len(afters)} | {interval(mean, low, high)} | {'yes' if low > 0 else 'no'} | "
            f"{'yes' if all(v > 0 for v in lows[algorithm]) else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    algorithms = option(argv, "algorithms", "grpo,starpo_s").split(",")
    seeds = [int(s) for s in option(argv, "seeds", "0,1,2").split(",")]
    episodes = int(option(argv, "eval_episodes", "256"))
    jobs = int(option(argv, "jobs", "1"))
    paired_samples = int(option(argv, "paired_samples", "4"))
    if paired_samples < 0:
        raise SystemExit(f"paired_samples={paired_samples} must be >= 0 (0 skips the paired re-measurement).")
    out = Path(option(argv, "out", "outputs/bench_learning")).resolve()
    own = ("algorithms", "seeds", "eval_episodes", "jobs", "paired_samples", "out")
    overrides = [a for a in argv if a.split("=", 1)[0] not in own]
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
    if paired_samples > 0:
        paired = paired_summary(runs, paired_samples, episodes, out / "paired")
        (out / "summary.md").write_text(f"{table}\n\n{paired}\n")
        print(f"\n{paired}")


if __name__ == "__main__":
    main(sys.argv[1:])
