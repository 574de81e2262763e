"""Why a model's evaluated episodes fail: dead ends, running out of turns, suboptimal turns, misread states.

    python scripts/failure_report.py cells=outputs/eval/default/tiny_vl/sokoban_visual[,more cells] [json=FILE]

    cells   comma-separated <out_dir>/<model>/<env> folders of scripts/evaluate.py; required
    json    also write the reports to this JSON file

A cell is the folder `scripts/evaluate.py` writes per (model, env): `settings.json` and `episodes/*.json`. Every
episode is replayed in its game next to the game's solver (vagen/eval/failures.py); games without a solver or
demonstration reasoning cannot be analysed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vagen.cli import script_options
from vagen.eval.failures import failure_report, replay_cell


def cell_report(cell: Path) -> dict:
    settings_path = cell / "settings.json"
    if not settings_path.is_file():
        raise ValueError(f"{cell} has no settings.json: pass a folder of scripts/evaluate.py, <out_dir>/<model>/<env>.")
    records = [json.loads(path.read_text()) for path in sorted((cell / "episodes").glob("*.json"))]
    if not records:
        raise ValueError(f"{cell}/episodes holds no episodes: run scripts/evaluate.py first.")
    return failure_report(replay_cell(json.loads(settings_path.read_text()), records))


def report_lines(name: str, report: dict) -> list[str]:
    lines = [f"{name}: {report['episodes']} episodes"]
    lines.append("  outcome: " + ", ".join(f"{outcome} {share}" for outcome, share in report["outcomes"].items()))
    lines.append("  success by the level's solver distance at the start:")
    lines += [f"    {distance:>4s}: {share}" for distance, share in report["success_by_initial_distance"].items()]
    for key, title in (
        ("optimal_turns_by_turn", "turns whose executed actions were all optimal"),
        ("dead_ends_entered_by_turn", "turns that entered a dead end"),
    ):
        lines.append(f"  {title}, by turn: " + ", ".join(f"{turn}: {share}" for turn, share in report[key].items()))
    matches = report["reasoning_matches_demo"]
    lines.append(
        "  reasoning equal to the demonstration's for the state seen: "
        + ", ".join(f"in {where} {share}" for where, share in matches.items())
    )
    return lines


def main(argv: list[str] | None = None) -> None:
    example = {"cells": "outputs/eval/default/tiny_vl/sokoban_visual"}
    defaults = {"cells": "", "json": ""}
    options, _ = script_options(sys.argv[1:] if argv is None else argv, defaults, overrides=False, required=example)
    cells = [Path(cell) for cell in options.cells.split(",") if cell]
    reports = {str(cell): cell_report(cell) for cell in cells}
    for name, report in reports.items():
        print("\n".join(report_lines(name, report)))
    if options.json:
        Path(options.json).write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    try:
        main()
    except (ValueError, NotImplementedError) as error:  # user errors: each says what to change
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
