"""The benchmark summary: one row per (model, env) from the stored episode records; Markdown, CSV, JSON, a plot.

Definitions (per cell; episodes whose play failed, e.g. an API error, are counted in `errors` and left
out of every rate, because they say nothing about the model):

- success: fraction of episodes solved, with a 95% Wilson score interval (well-behaved at 0% and 100%
  and for small n, unlike the normal approximation). When seeds are played several times
  (`samples_per_seed`), the interval counts seeds, not episodes: samples of one level are not independent
  draws, and treating them as such would narrow the interval by up to sqrt(k). Counting seeds is conservative.
- seeds_all_solved / seeds_none_solved / pass_at_k: fractions of seeds solved in every one of their samples,
  in none, and in at least one. With k samples per seed they tell sharpening from improving: RL that only
  sharpens turns seeds solved sometimes into seeds solved always or never, at the same mean success.
- reward / turns: mean episode return / mean answered turns.
- format_ok: well-formed answers over all answered turns (pooled over episodes).
- invalid_action: answers that were well-formed but named an action the game refused, over well-formed answers.
- tokens_per_episode: mean sampled (or API completion) tokens per episode; empty for scripted policies.
- seconds_per_episode: wall time per episode (episodes of a batch run together and share its time).
- paired_change / paired_low / paired_high / paired_levels / paired_against: the success change against the first
  model that played the same env (`paired_against`), paired by level: each level's success averaged over its samples,
  the mean difference over the levels both played and its 95% interval (`paired_change` of the trainer's held-out
  line). Every cell of one benchmark plays the same levels, so pairing removes the between-level variance that two
  Wilson intervals each carry. Empty for the first model and for cells that did not play.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vagen.eval.storage import atomic_write_text
from vagen.rollout.validation import change_text, paired_change, wilson_interval

COLUMNS = (
    "model",
    "env",
    "episodes",
    "errors",
    "success",
    "success_low",
    "success_high",
    "seeds",
    "seeds_all_solved",
    "seeds_none_solved",
    "pass_at_k",
    "reward",
    "turns",
    "format_ok",
    "invalid_action",
    "tokens_per_episode",
    "seconds_per_episode",
    "wall_time_s",
    "paired_change",
    "paired_low",
    "paired_high",
    "paired_levels",
    "paired_against",
    "note",
)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def outcomes_by_seed(records: Sequence[dict[str, Any]]) -> dict[int, list[bool]]:
    """Each env seed's successes, in episode order, over the records that played (no error)."""
    by_seed: dict[int, list[bool]] = {}
    for record in records:
        if record["error"] is None:
            by_seed.setdefault(record["seed"], []).append(bool(record["success"]))
    return by_seed


def success_by_seed(records: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Each env seed's success rate over its samples, over the records that played (no error)."""
    return {seed: sum(wins) / len(wins) for seed, wins in outcomes_by_seed(records).items()}


def summarize_cell(model: str, env: str, records: Sequence[dict[str, Any]], note: str = "") -> dict[str, Any]:
    """One summary row from the episode records of one (model, env)."""
    played = [r for r in records if r["error"] is None]
    n, wins = len(played), sum(bool(r["success"]) for r in played)
    by_seed = outcomes_by_seed(played)
    seeds = len(by_seed)
    low, high = wilson_interval(wins * seeds / n if n else 0, seeds)  # = (wins, n) with one sample per seed
    turns = sum(r["turns"] for r in played)
    well_formed = sum(r["format_ok_turns"] for r in played)
    tokens = [r["response_tokens"] for r in played if r["response_tokens"] is not None]
    wall = sum(r["wall_time_s"] for r in records)
    return {
        "model": model,
        "env": env,
        "episodes": n,
        "errors": len(records) - n,
        "success": _ratio(wins, n),
        "success_low": low,
        "success_high": high,
        "seeds": seeds,
        "seeds_all_solved": _ratio(sum(all(s) for s in by_seed.values()), seeds),
        "seeds_none_solved": _ratio(sum(not any(s) for s in by_seed.values()), seeds),
        "pass_at_k": _ratio(sum(any(s) for s in by_seed.values()), seeds),
        "reward": _ratio(sum(r["reward"] for r in played), n),
        "turns": _ratio(turns, n),
        "format_ok": _ratio(well_formed, turns),
        "invalid_action": _ratio(sum(r["invalid_action_turns"] for r in played), well_formed),
        "tokens_per_episode": _ratio(sum(tokens), len(tokens)) if tokens else math.nan,
        "seconds_per_episode": _ratio(wall, len(records)),
        "wall_time_s": wall,
        "paired_change": math.nan,
        "paired_low": math.nan,
        "paired_high": math.nan,
        "paired_levels": 0,
        "paired_against": "",
        "note": note,
    }


def add_paired_changes(rows: Sequence[dict[str, Any]], records: Sequence[Sequence[dict[str, Any]]]) -> None:
    """Fill each row's paired change against the first row of its env that played (`records[i]` are row i's
    episode records), in place: each level's success averaged over its samples, paired over the levels both played."""
    first: dict[str, tuple[str, dict[int, float]]] = {}
    for row, cell in zip(rows, records, strict=True):
        by_seed = success_by_seed(cell)
        if not by_seed:
            continue
        if row["env"] not in first:  # the reference of its env
            first[row["env"]] = (row["model"], by_seed)
            continue
        label, reference = first[row["env"]]
        if len(reference.keys() & by_seed.keys()) < 2:
            continue
        mean, low, high, levels = paired_change(reference, by_seed)
        row.update(paired_change=mean, paired_low=low, paired_high=high, paired_levels=levels, paired_against=label)


def _fmt(value: Any, percent: bool = False, digits: int = 2) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{100 * value:.1f}%" if percent else f"{value:.{digits}f}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """All rows as one Markdown table, then success by model × env."""
    header = (
        "| model | env | n | success | 95% CI | reward | turns | format ok | invalid act. | tokens/ep | s/ep | errors |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        interval = (
            "–"
            if math.isnan(row["success_low"])
            else f"[{100 * row['success_low']:.1f}, {100 * row['success_high']:.1f}]"
        )
        cells = [
            row["model"],
            row["env"],
            str(row["episodes"]),
            _fmt(row["success"], percent=True),
            interval,
            _fmt(row["reward"]),
            _fmt(row["turns"]),
            _fmt(row["format_ok"], percent=True),
            _fmt(row["invalid_action"], percent=True),
            _fmt(row["tokens_per_episode"], digits=1),
            _fmt(row["seconds_per_episode"], digits=3),
            str(row["errors"]) + (f" ({row['note']})" if row["note"] else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    repeated = [row for row in rows if row["episodes"] > row["seeds"]]
    if repeated:  # several samples per seed: how the successes spread over the seeds
        lines += ["", "| model | env | seeds | samples/seed | solved always | never | sometimes | pass@k |"]
        lines.append("|" + "---|" * 8)
        for row in repeated:
            sometimes = 1.0 - row["seeds_all_solved"] - row["seeds_none_solved"]
            shares = [row["seeds_all_solved"], row["seeds_none_solved"], sometimes, row["pass_at_k"]]
            cells = [row["model"], row["env"], str(row["seeds"]), f"{row['episodes'] / row['seeds']:g}"]
            lines.append("| " + " | ".join(cells + [_fmt(v, percent=True) for v in shares]) + " |")
    paired = [row for row in rows if row.get("paired_against")]
    if paired:  # the change against each env's first model, level by level
        lines += ["", "| model | env | paired change [95% CI] | against | levels |", "|" + "---|" * 5]
        for row in paired:
            change = change_text(row["paired_change"], row["paired_low"], row["paired_high"])
            cells = [row["model"], row["env"], change, row["paired_against"], str(row["paired_levels"])]
            lines.append("| " + " | ".join(cells) + " |")
    models = list(dict.fromkeys(row["model"] for row in rows))
    envs = list(dict.fromkeys(row["env"] for row in rows))
    by_cell = {(row["model"], row["env"]): row for row in rows}
    pivot = ["| success | " + " | ".join(envs) + " |", "|---|" + "---|" * len(envs)]
    for model in models:
        cells = [
            _fmt(by_cell[(model, env)]["success"], percent=True) if (model, env) in by_cell else "" for env in envs
        ]
        pivot.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + "\n".join(pivot) + "\n"


def write_summary(rows: Sequence[dict[str, Any]], folder: Path, title: str = "Evaluation") -> dict[str, Path]:
    """Write summary.md, summary.csv and summary.json into `folder`; return their paths by kind."""
    folder = Path(folder)
    paths = {kind: folder / f"summary.{kind}" for kind in ("md", "csv", "json")}
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(paths["csv"], buffer.getvalue())
    json_rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()} for row in rows]
    atomic_write_text(paths["json"], json.dumps(json_rows, indent=2))
    atomic_write_text(paths["md"], f"# {title}\n\n{markdown_table(rows)}")
    return paths


def plot_success(rows: Sequence[dict[str, Any]], path: Path, title: str = "Success rate") -> Path:
    """A grouped bar chart of success by env (groups) and model (bars), 95% Wilson intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(row["model"] for row in rows))
    envs = list(dict.fromkeys(row["env"] for row in rows))
    by_cell = {(row["model"], row["env"]): row for row in rows}
    width = 0.8 / max(len(models), 1)
    figure, axes = plt.subplots(figsize=(max(5.0, 1.2 + 0.55 * len(models) * len(envs)), 3.8), dpi=120)
    for offset, model in enumerate(models):
        xs, heights, below, above = [], [], [], []
        for position, env in enumerate(envs):
            row = by_cell.get((model, env))
            if row is None or math.isnan(row["success"]):
                continue
            xs.append(position - 0.4 + width * (offset + 0.5))
            heights.append(row["success"])
            below.append(row["success"] - row["success_low"])
            above.append(row["success_high"] - row["success"])
        bars = axes.bar(xs, heights, width * 0.92, yerr=[below, above], capsize=3, label=model)
        # A 0% bar has no height: a tick in the bar's colour shows where it stands.
        axes.scatter(
            xs,
            heights,
            marker="_",
            s=(width * 220) ** 2 / 40,
            color=bars.patches[0].get_facecolor() if bars.patches else None,
            zorder=3,
        )
        axes.bar_label(bars, labels=[f"{100 * h:.0f}%" for h in heights], fontsize=7, padding=2)
    axes.set_xticks(range(len(envs)), envs)
    axes.set_ylim(-0.03, 1.12)  # room below 0 so the 0% ticks show
    axes.set_ylabel("success rate (95% Wilson CI)")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
