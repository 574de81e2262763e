"""Two sets of training runs compared level by level: `python research/compare_runs.py a=<runs> b=<runs> [at=N]`.

Every validation of a run plays the same fixed held-out levels (seeds 1e9 + k), and its checkpoints keep each level's
success (`val_history`, by iteration), so two runs' validations pair by level: the between-level variance, most of
an unpaired interval's width, cancels. This prints, for each pair of runs, the change b − a paired by level with its
95% interval, and the same for the mean run (each level's success averaged over the pairs, so a shared start's noise
is counted once).

Options:
  b=DIR,DIR,...   the runs to measure (run folders of scripts/train.py or research/bench_learning.py, or a file that
                  save= wrote, which stands for all the runs it holds, in order; or cells of scripts/evaluate.py,
                  `<out_dir>/<model>/<env>`, each one validation at iteration 0: its levels' success averaged over
                  their samples, as it was played, so a cell needs a= and is never read greedily)
  a=DIR,DIR,...   the runs to compare them with, paired in order (the same training seed on both sides, as a rule);
                  empty (the default): each b run against its own validation at iteration 0, the warm start
  at=N            the iteration of b's validations (-1, the default: the latest that every b run validated)
  at_a=N          the iteration of a's validations (-1, the default: as at; 0 where a is empty)
  greedy=true     compare the runs' greedy validations (each level played once, greedily: `trainer.eval_greedy`)
                  instead of the sampled ones; run folders, and files that save= wrote from runs that had them
  by_distance=ENV also break the mean run's change down by each level's solver distance (the fewest moves from its
                  start, from configs/env/ENV.yaml's game): bins of neighbouring distances, each of at least
                  `min_levels` levels (16): is a gain one of the easy, the middle or the hard levels?
  save=FILE.json  also write the b runs' validations per level, every iteration of them, to FILE.json (a few tens of
                  kB), and their greedy ones where every b run has them: a later comparison can then pair against
                  these runs after their folders and checkpoints are gone (docs/runs/ keeps the ones docs/learning.md
                  reports)

Examples:
  two arms at their budget:   a=out/armA-seed0,out/armA-seed1 b=out/armB-seed0,out/armB-seed1
  a run against itself:       a=out/arm-seed0 at_a=117 b=out/arm-seed0 at=156
  a fork against its source:  a=runs/constant b=runs/annealed
  where the levels gained:    a=docs/runs/<arm>.json b=out/armB-seed0,... by_distance=sokoban_visual
  against runs kept as a file: a=docs/runs/<arm>.json b=out/armB-seed0,out/armB-seed1,out/armB-seed2
  on levels never validated on (evaluate.py seed_offset=256 of the start and of three runs' last checkpoints):
                              a=ev/tiny_vl/sokoban_visual,ev/tiny_vl/sokoban_visual,ev/tiny_vl/sokoban_visual
                              b=ev/run-seed0/sokoban_visual,ev/run-seed1/sokoban_visual,ev/run-seed2/sokoban_visual

Each run's latest checkpoint is read (verified, nothing restored). Checkpoints saved before 2026-11-30 hold only
the validation at iteration 0 and the last one (its iteration read from the run's metrics.jsonl).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

from vagen.cli import script_options
from vagen.env import make_env
from vagen.env.policies import solver_distance
from vagen.eval import CellStore, success_by_seed
from vagen.eval.runner import load_env_config
from vagen.logging import read_metrics
from vagen.rollout.validation import change_text, distance_bins, paired_change
from vagen.trainer.checkpoint import latest_checkpoint, read_state

DEFAULTS = {"a": "", "b": "", "at": -1, "at_a": -1, "greedy": False, "save": "", "by_distance": "", "min_levels": 16}
ROOT = Path(__file__).resolve().parent.parent
SAVED_FORMAT = "vagen.compare_runs/1"


class Run(NamedTuple):
    """One run's validations: its name (the run folder's) and each validation's success per level, by iteration."""

    name: str
    history: dict[int, dict[int, float]]


def validations(run_dir: Path, greedy: bool = False) -> dict[int, dict[int, float]]:
    """Each validation's success per held-out level, by iteration, from the run's latest checkpoint (with `greedy`,
    its greedy validations')."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ValueError(f"{run_dir} holds no complete checkpoint; name a run folder of scripts/train.py.")
    state = read_state(checkpoint)
    kept = state.get("greedy_history" if greedy else "val_history")
    if kept:
        return {int(k): dict(v) for k, v in kept.items()}
    if greedy:
        raise ValueError(f"{run_dir} has no greedy validations (trainer.eval_greedy, since 2026-12-04); compare "
                         "its sampled ones, without greedy=true.")  # fmt: skip
    history = {0: dict(state.get("initial_outcomes", {}))} if state.get("initial_outcomes") else {}
    validated = [
        int(r["step"]) for r in read_metrics(run_dir) if "val/success" in r and r["step"] <= state["iteration"]
    ]
    if state.get("val_outcomes") and validated:
        history[max(validated)] = dict(state["val_outcomes"])
    return history


def is_cell(path: Path) -> bool:
    """Whether `path` is a cell of scripts/evaluate.py (`<out_dir>/<model>/<env>`, holding episodes/)."""
    return (path / "episodes").is_dir()


def cell_validation(cell: Path) -> dict[int, dict[int, float]]:
    """An evaluate.py cell as one validation at iteration 0: each level's success averaged over its samples."""
    by_seed = success_by_seed(CellStore(cell, cell.parent.name, cell.name).records())
    if not by_seed:
        raise ValueError(f"{cell} holds no played episode; evaluate into it first (scripts/evaluate.py).")
    return {0: by_seed}


def save_runs(runs: list[Run], path: Path, greedy: list[Run] | None = None) -> None:
    """Write `runs` to `path` as JSON: per run, the held-out levels once and each validation's outcomes in their
    order; with `greedy` (the same runs' greedy validations, in the same order), those too. Two runs of one name would
    be told apart by nothing, so that is refused."""
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"save= would hold two runs of one name ({names}); save them to separate files.")
    saved = {}
    for index, run in enumerate(runs):
        histories = {"history": run.history} | ({"greedy_history": greedy[index].history} if greedy else {})
        levels = sorted(set().union(*(set().union(*h.values()) for h in histories.values())))
        saved[run.name] = {"levels": levels} | {
            key: {str(i): [history[i].get(k) for k in levels] for i in sorted(history)}
            for key, history in histories.items()
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": SAVED_FORMAT, "runs": saved}, separators=(",", ":")) + "\n")


def read_saved(path: Path, greedy: bool = False) -> list[Run]:
    """The runs a `save_runs` file holds, in their saved order (with `greedy`, their greedy validations)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} cannot be read as runs saved by compare_runs.py save= ({error}).") from None
    if not isinstance(data, dict) or data.get("format") != SAVED_FORMAT:
        raise ValueError(f"{path} is not a file of compare_runs.py save= (no format {SAVED_FORMAT!r}).")
    key = "greedy_history" if greedy else "history"
    runs = data.get("runs")
    if greedy and isinstance(runs, dict) and not all(isinstance(run, dict) and key in run for run in runs.values()):
        raise ValueError(f"{path} keeps no greedy validations (its runs had none, or it was saved before save= "
                         "kept them, 2026-12-06); compare its sampled ones, without greedy=true.")  # fmt: skip
    try:
        return [
            Run(name, {int(i): level_outcomes(run["levels"], outcomes) for i, outcomes in run[key].items()})
            for name, run in runs.items()
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"{path} is damaged: {error!r}; save it again from the run folders.") from None


def level_outcomes(levels: list[int], outcomes: list[float | None]) -> dict[int, float]:
    """One saved validation as {level: success}; None marks a level that validation did not play."""
    return {int(k): float(v) for k, v in zip(levels, outcomes, strict=True) if v is not None}


def load_runs(text: str, greedy: bool = False) -> list[Run]:
    """The runs of a comma-separated list of run folders, saved files and evaluate.py cells (with `greedy`, their greedy
    validations: run folders and saved files only)."""
    runs = []
    for part in filter(None, text.split(",")):
        path = Path(part)
        if is_cell(path):
            if greedy:
                raise ValueError(f"{path}: an evaluate.py cell is compared as it was played; evaluate greedily "
                                 "(greedy=true there) and compare without greedy=true.")  # fmt: skip
            runs.append(Run(f"{path.parent.name}/{path.name}", cell_validation(path)))
        elif path.suffix == ".json":
            runs += read_saved(path, greedy)
        else:
            runs.append(Run(path.name, validations(path, greedy)))
    return runs


def kept_greedy(text: str) -> list[Run] | None:
    """The greedy validations of `load_runs(text)`'s runs, or None where one of them has none (save= keeps them)."""
    try:
        return load_runs(text, greedy=True)
    except ValueError:
        return None


def pick(run: Run, iteration: int) -> dict[int, float]:
    if iteration not in run.history:
        raise ValueError(
            f"{run.name} has no validation at iteration {iteration} (it has {sorted(run.history) or 'none'}); "
            "choose one of those with at= / at_a=."
        )
    return run.history[iteration]


def pct(value: float) -> str:
    return f"{value:.1%}"


def change(before: dict[int, float], after: dict[int, float]) -> str:
    mean, low, high, levels = paired_change(before, after)
    return f"{change_text(mean, low, high)} over {levels} levels"


def compare(
    a: list[Run], b: list[Run], at: int, at_a: int, distances: dict[int, int] | None = None, min_levels: int = 16
) -> str:
    """The markdown table of the pairs' changes b − a by level and the mean run's; with `distances` (each level's
    solver distance), also the mean run's change per bin of distances (`by_distance`)."""
    if not b:
        raise ValueError("b= names no runs; give the run folders to measure, comma-separated.")
    if a and len(a) != len(b):
        raise ValueError(f"a= names {len(a)} runs and b= {len(b)}; they pair in order, so give as many of each.")
    if at < 0:
        at = max(set.intersection(*(set(run.history) for run in b)), default=-1)
        if at < 0:
            raise ValueError("the b runs share no validated iteration; pick one with at=.")
    at_a = (at if a else 0) if at_a < 0 else at_a
    a_runs = a or b
    lines = [
        f"b at iteration {at} against a at iteration {at_a} ({'the b runs themselves' if not a else 'a'}).",
        "",
        "| pair | a | b | a success | b success | b − a, paired by level [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    befores, afters = [], []
    for index, (run_a, run_b) in enumerate(zip(a_runs, b, strict=True)):
        before, after = pick(run_a, at_a), pick(run_b, at)
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
    if distances is not None:
        lines += ["", by_distance(mean_before, mean_after, distances, min_levels)]
    return "\n".join(lines)


def by_distance(before: dict[int, float], after: dict[int, float], distances: dict[int, int], min_levels: int) -> str:
    """The markdown table of the change after − before per bin of solver distances (0: no plan from the start)."""
    levels = sorted(before.keys() & after.keys())
    missing = [k for k in levels if k not in distances]
    if missing:
        raise ValueError(f"no solver distance for levels {missing[:5]}; measure every compared level.")
    lines = [
        "| solver distance | levels | a success | b success | b − a, paired by level [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for low, high in distance_bins([distances[k] for k in levels], min_levels):
        inside = [k for k in levels if low <= distances[k] <= high]
        a_bin, b_bin = {k: before[k] for k in inside}, {k: after[k] for k in inside}
        span = f"{low}" if low == high else f"{low}–{high}"
        success = f"{pct(statistics.mean(a_bin.values()))} | {pct(statistics.mean(b_bin.values()))}"
        lines.append(
            f"| {span} | {len(inside)} | {success} | {change(a_bin, b_bin) if len(inside) > 1 else 'one level'} |"
        )
    return "The mean run by the levels' solver distance:\n\n" + "\n".join(lines)


def solver_distances(env_name: str, levels: list[int]) -> dict[int, int]:
    """Each level's solver distance in configs/env/`env_name`.yaml's game: the fewest moves from `reset(seed=level)`
    (0 where the solver finds no plan)."""
    env_cfg = load_env_config(env_name, ROOT / "configs", overrides={})
    env = make_env(env_cfg["id"], **env_cfg["kwargs"])
    distances = {level: solver_distance(env, level) for level in levels}
    env.close()
    return distances


def main(argv: list[str]) -> None:
    options, _ = script_options(argv, DEFAULTS, overrides=False, required={"b": "outputs/runs/<run>"})

    try:
        greedy = bool(options.greedy)
        b = load_runs(options.b, greedy)
        if not options.a and any(is_cell(Path(part)) for part in options.b.split(",")):
            raise ValueError("an evaluate.py cell has no start of its own to compare with; give a= (e.g. the start's "
                             "cell on the same levels, once per b).")  # fmt: skip
        a = load_runs(options.a, greedy)
        distances = None
        if options.by_distance:
            levels = sorted(set().union(*(set().union(*run.history.values()) for run in a + b)))
            distances = solver_distances(str(options.by_distance), levels)
        print(compare(a, b, int(options.at), int(options.at_a), distances, int(options.min_levels)))
        if options.save:
            greedy_runs = b if greedy else kept_greedy(options.b)  # the mode already loaded is not read again
            save_runs(load_runs(options.b) if greedy else b, Path(options.save), greedy_runs)
            kept = "validations and their greedy ones" if greedy_runs else "validations (they have no greedy ones)"
            print(f"\nsaved the b runs' {kept} to {options.save}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main(sys.argv[1:])
