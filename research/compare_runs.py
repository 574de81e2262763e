"""Two sets of training runs compared level by level: `python research/compare_runs.py a=<runs> b=<runs> [at=N]`.

Every validation of a run plays the same fixed held-out levels (seeds 1e9 + k), and its checkpoints keep each level's
success (`val_history`, by iteration), so two runs' validations pair by level: the between-level variance, most of
an unpaired interval's width, cancels. This prints, for each pair of runs, the change b − a paired by level with its
95% interval, and the same for the mean run (each level's success averaged over the pairs, so a shared start's noise
is counted once).

Options:
  b=DIR,DIR,...   the runs to measure (run folders of scripts/train.py or research/bench_learning.py)
  a=DIR,DIR,...   the runs to compare them with, paired in order (the same training seed on both sides, as a rule);
                  empty (the default): each b run against its own validation at iteration 0, the warm start
  at=N            the iteration of b's validations (-1, the default: the latest that every b run validated)
  at_a=N          the iteration of a's validations (-1, the default: as at; 0 where a is empty)

Examples:
  two arms at their budget:   a=out/armA-seed0,out/armA-seed1 b=out/armB-seed0,out/armB-seed1
  a run against itself:       a=out/arm-seed0 at_a=117 b=out/arm-seed0 at=156
  a fork against its source:  a=runs/constant b=runs/annealed

Each run's latest checkpoint is read (verified, nothing restored). Checkpoints saved before 2026-11-30 hold only
the validation at iteration 0 and the last one (its iteration read from the run's metrics.jsonl).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from vagen.cli import script_options
from vagen.logging import read_metrics
from vagen.rollout.validation import paired_change
from vagen.trainer.checkpoint import latest_checkpoint, read_state

DEFAULTS = {"a": "", "b": "", "at": -1, "at_a": -1}


def validations(run_dir: Path) -> dict[int, dict[int, float]]:
    """Each validation's success per held-out level, by iteration, from the run's latest checkpoint."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ValueError(f"{run_dir} holds no complete checkpoint; name a run folder of scripts/train.py.")
    state = read_state(checkpoint)
    if state.get("val_history"):
        return {int(k): dict(v) for k, v in state["val_history"].items()}
    history = {0: dict(state.get("initial_outcomes", {}))} if state.get("initial_outcomes") else {}
    validated = [
        int(r["step"]) for r in read_metrics(run_dir) if "val/success" in r and r["step"] <= state["iteration"]
    ]
    if state.get("val_outcomes") and validated:
        history[max(validated)] = dict(state["val_outcomes"])
    return history


def pick(history: dict[int, dict[int, float]], iteration: int, run_dir: Path) -> dict[int, float]:
    if iteration not in history:
        raise ValueError(
            f"{run_dir} has no validation at iteration {iteration} in its latest checkpoint (it has "
            f"{sorted(history) or 'none'}); choose one of those with at= / at_a=."
        )
    return history[iteration]


def pct(value: float) -> str:
    return f"{value:.1%}"


def change(before: dict[int, float], after: dict[int, float]) -> str:
    mean, low, high, levels = paired_change(before, after)
    return f"{mean * 100:+.1f} pts [{low * 100:+.1f}, {high * 100:+.1f}] over {levels} levels"


def compare(a: list[Path], b: list[Path], at: int, at_a: int) -> str:
    """The markdown table of the pairs' changes b − a by level and the mean run's."""
    if not b:
        raise ValueError("b= names no runs; give the run folders to measure, comma-separated.")
    if a and len(a) != len(b):
        raise ValueError(f"a= names {len(a)} runs and b= {len(b)}; they pair in order, so give as many of each.")
    b_histories = [validations(run) for run in b]
    if at < 0:
        at = max(set.intersection(*(set(h) for h in b_histories)), default=-1)
        if at < 0:
            raise ValueError("the b runs share no validated iteration; pick one with at=.")
    a_histories = [validations(run) for run in a] if a else b_histories
    at_a = (at if a else 0) if at_a < 0 else at_a
    a_runs = a or b
    lines = [
        f"b at iteration {at} against a at iteration {at_a} ({'the b runs themselves' if not a else 'a'}).",
        "",
        "| pair | a | b | a success | b success | b − a, paired by level [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    befores, afters = [], []
    for index, (run_a, run_b, history_a, history_b) in enumerate(zip(a_runs, b, a_histories, b_histories, strict=True)):
        before, after = pick(history_a, at_a, run_a), pick(history_b, at, run_b)
        befores.append(before)
        afters.append(after)
        lines.append(
            f"| {index} | {run_a.name} | {run_b.name} | {pct(statistics.mean(before.values()))} | "
            f"{pct(statistics.mean(after.values()))} | {change(before, after)} |"
        )
    levels = sorted(set.intersection(*(set(o) for o in befores + afters)))
    mean_before = {k: statistics.mean(o[k] for o in befores) for k in levels}
    mean_after = {k: statistics.mean(o[k] for o in afters) for k in levels}
    lines += ["", f"The mean run: {pct(statistics.mean(mean_before.values()))} -> "]
    lines[-1] += f"{pct(statistics.mean(mean_after.values()))}, {change(mean_before, mean_after)}."
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    options, _ = script_options(argv, DEFAULTS, overrides=False, required={"b": "outputs/runs/<run>"})

    def runs(text: str) -> list[Path]:
        return [Path(part) for part in text.split(",") if part]

    try:
        print(compare(runs(options.a), runs(options.b), int(options.at), int(options.at_a)))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main(sys.argv[1:])
