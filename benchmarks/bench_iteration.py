"""One training iteration of two commits side by side, at equal work: seconds per phase, the ratio, and FLOP/s.

    python benchmarks/bench_iteration.py before=<git ref> [after=.] [iterations=3] [rounds=2] [threads=2] [overrides...]

Each side runs in its own process from its own checkout (a temporary `git worktree` of the ref; `.` is this
working tree) with the same config: by default the default run (`env=sokoban_visual`, tiny_vl, 8 × 8 episodes), MI
diagnostics and validation off; anything else is a train.py override. A side builds its trainer, plays one
untimed warm-up iteration, then `iterations` timed ones from the same seed, so both sides play the same levels.
The sides alternate `rounds` times (A B A B) so that machine noise falls on both. Equal work is checked, not
assumed: every timed iteration's rollout (all token ids of all dialogues) must hash the same on both sides.

Prints, per phase (rollout, old/ref log-probs, the rest of the update, iteration), the median seconds over all
timed iterations and rounds, each side's share of its iteration, and before/after; then each side's achieved FLOP/s
for the rollout and the update: the FLOPs of each iteration (torch.utils.flop_counter around the loop's phases, through
`StarPOTrainer.train_iteration(around=...)`, in one more untimed run of the same iterations per side, whose rollouts
are hashed too; a commit without that hook gets no FLOP row) over that iteration's seconds, the median over
iterations, against this machine's measured matmul rate (1024² and tiny_vl's MLP shape, the better of the two). The
counter counts causal attention at its full L². Run it with nothing else on the cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig

from vagen.cli import script_options

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = {"before": "", "after": ".", "iterations": 3, "rounds": 2, "threads": 2}
BASE_OVERRIDES = [
    "env=sokoban_visual",
    "algorithm=grpo",  # the settings of the table in docs/learning.md (the defaults until 2026-11-27)
    "trainer.lr=2e-5",
    "diagnostics.compute_freq=0",
    "trainer.eval_every=0",
    "trainer.viz_every=0",
    "logger.wandb_mode=disabled",
    "logger.progress=false",
]
PHASES = ("rollout", "logprobs", "update_rest", "iteration")


def rollout_hash(trajectories) -> str:
    digest = hashlib.sha256()
    for trajectory in trajectories:
        ids, mask = trajectory.token_ids_and_mask()
        digest.update(json.dumps([ids, mask]).encode())
    return digest.hexdigest()[:16]


def phases(metrics: dict[str, float]) -> dict[str, float]:
    logprobs = metrics.get("perf/logprobs_s", 0.0)
    return {
        "rollout": metrics["perf/rollout_s"],
        "logprobs": logprobs,
        "update_rest": metrics["perf/update_s"] - logprobs,
        "iteration": metrics["perf/iteration_s"],
    }


def matmul_rate(threads: int) -> float:
    """FLOP/s of fp32 matrix products on this CPU: the better of 1024² and tiny_vl's MLP shape."""
    import torch

    torch.set_num_threads(threads)
    best = 0.0
    for m, k, n in ((1024, 1024, 1024), (8192, 256, 768)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        a @ b
        start, repeats = time.perf_counter(), 20
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * m * k * n * repeats / (time.perf_counter() - start))
    return best


def child(options: DictConfig, overrides: list[str]) -> None:
    """One side: one JSON line per timed iteration (phases, rollout hash). With count_flops, the same iterations
    instead run under torch's FLOP counter, per phase through the loop's `around` hook (FLOPs per phase, rollout
    hash; a commit whose loop has no such hook gives the hash alone)."""
    import torch
    from hydra import compose, initialize_config_dir

    from vagen.trainer.starpo import StarPOTrainer

    torch.set_num_threads(options.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        with initialize_config_dir(config_dir=str(Path.cwd() / "configs"), version_base=None):
            untuned = ["~tuned"] if Path("configs/tuned").is_dir() else []  # both sides: train.yaml's base settings
            cfg = compose("train", overrides=[*untuned, *BASE_OVERRIDES, f"run_dir={run_dir}/run", *overrides])
        trainer = StarPOTrainer(cfg)
        trainer.train_iteration()  # warm-up: allocator, thread pools, lazy imports
        for _ in range(options.iterations):
            if options.count_flops:
                print(json.dumps(counted_iteration(trainer)), flush=True)
                continue
            metrics = trainer.train_iteration()
            print(json.dumps({"phases": phases(metrics), "hash": rollout_hash(trainer.last_trajectories)}), flush=True)
        if options.count_flops:
            print(json.dumps({"matmul": matmul_rate(options.threads)}), flush=True)


def counted_iteration(trainer) -> dict:
    """One `train_iteration` with its rollout and update phases each under torch's FLOP counter."""
    from torch.utils.flop_counter import FlopCounterMode

    if "around" not in inspect.signature(trainer.train_iteration).parameters:
        trainer.train_iteration()
        return {"hash": rollout_hash(trainer.last_trajectories)}
    counters = {"rollout": FlopCounterMode(display=False), "update": FlopCounterMode(display=False)}
    trainer.train_iteration(around=lambda phase: counters.get(phase, contextlib.nullcontext()))
    flops = {phase: counter.get_total_flops() for phase, counter in counters.items()}
    return {"flops": flops, "hash": rollout_hash(trainer.last_trajectories)}


def checkout(ref: str, scratch: Path) -> Path:
    """`.` is this working tree; any other ref becomes a detached worktree under `scratch`."""
    if ref == ".":
        return ROOT
    folder = scratch / ref.replace("/", "_").replace("~", "-")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref], check=True)
    return folder


def run_side(folder: Path, options: DictConfig, overrides: list[str], count_flops: bool = False) -> list[dict]:
    args = [f"{k}={v}" for k, v in options.items() if k in ("iterations", "threads")]
    env = {**os.environ, "PYTHONPATH": str(folder), "OMP_NUM_THREADS": str(options["threads"])}
    flags = ["count_flops=true"] if count_flops else []
    command = [sys.executable, str(Path(__file__).resolve()), "role=child", *flags, *args, *overrides]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: the side in {folder} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    options, overrides = script_options(sys.argv[1:], {**DEFAULTS, "role": "driver", "count_flops": False})
    if options.role == "child":
        child(options, overrides)
        return
    if not options.before:
        raise SystemExit("error: say which commit to compare against, e.g. before=main~1 (after defaults to .).")
    with tempfile.TemporaryDirectory() as scratch:
        sides = {name: checkout(options[name], Path(scratch)) for name in ("before", "after")}
        try:
            results = {name: [] for name in sides}
            for round_index in range(options.rounds):
                for name, folder in sides.items():
                    print(f"round {round_index + 1}: {name} ({options[name]})", file=sys.stderr, flush=True)
                    results[name] += run_side(folder, options, overrides)
            print("FLOP count: the same iterations on both sides, untimed", file=sys.stderr, flush=True)
            counts = {name: run_side(folder, options, overrides, count_flops=True) for name, folder in sides.items()}
        finally:
            for folder in sides.values():
                if folder != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)
    report(options, results, counts)


def report(options: DictConfig, results: dict[str, list[dict]], counts: dict[str, list[dict]]) -> None:
    iterations, rounds = options.iterations, options.rounds
    runs = [rows[start : start + iterations] for rows in results.values() for start in range(0, len(rows), iterations)]
    runs += [[row for row in rows if "hash" in row] for rows in counts.values()]
    same = all([row["hash"] for row in run] == [row["hash"] for row in runs[0]] for run in runs)
    print(
        f"before={options['before']} after={options['after']}: {iterations} timed iterations x {rounds} rounds a side"
    )
    print(f"equal work: all {len(runs)} runs' rollouts hash alike, iteration by iteration: {'yes' if same else 'NO'}")
    medians = {
        name: {phase: statistics.median(row["phases"][phase] for row in rows) for phase in PHASES}
        for name, rows in results.items()
    }
    print("| phase | before s | share | after s | share | before/after |")
    print("|---|---|---|---|---|---|")
    for phase in PHASES:
        b, a = medians["before"][phase], medians["after"][phase]
        share_b, share_a = b / medians["before"]["iteration"], a / medians["after"]["iteration"]
        print(f"| {phase} | {b:.2f} | {share_b:.0%} | {a:.2f} | {share_a:.0%} | {b / a:.2f}x |")
    rate = max(row["matmul"] for rows in counts.values() for row in rows if "matmul" in row)
    print(f"measured fp32 matmul rate: {rate / 1e9:.0f} GFLOP/s ({options['threads']} threads)")
    print("| side | phase | GFLOP per iteration | achieved GFLOP/s | of the matmul rate |")
    print("|---|---|---|---|---|")
    for name in ("before", "after"):
        flops = [row["flops"] for row in counts[name] if "flops" in row]
        if not flops:
            print(f"| {name} | (its loop has no phase hook to count with) | | | |")
            continue
        for phase in ("rollout", "update"):
            per_iteration = []
            for index, row in enumerate(results[name]):
                times = row["phases"]
                seconds = times["rollout"] if phase == "rollout" else times["logprobs"] + times["update_rest"]
                per_iteration.append(flops[index % iterations][phase] / seconds)
            achieved = statistics.median(per_iteration)
            gflop = statistics.median(f[phase] for f in flops) / 1e9
            print(f"| {name} | {phase} | {gflop:.0f} | {achieved / 1e9:.0f} | {achieved / rate:.0%} |")


if __name__ == "__main__":
    main()
