"""Plot a training run: training, filtering, diagnostics and regime figures as PNGs.

    python scripts/plot_run.py outputs/runs/sokoban_visual-tiny_vl-grpo-seed0 [--out DIR]

Reads `RUN_DIR/metrics.jsonl` (and `RUN_DIR/config.yaml` for the title when present), writes
`DIR/<figure>.png` (default DIR: RUN_DIR/plots), prints each written path and one line per panel
left out because its metrics are not in the log.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import OmegaConf

from vagen.logging import read_metrics
from vagen.logging.sinks import METRICS_FILENAME
from vagen.viz.plots import render_run


def run_name(run_dir: Path) -> str:
    """'env · model · algorithm · filter' from the run's resolved config, or the folder name without one."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        return run_dir.name
    config = OmegaConf.load(config_path)
    parts = [OmegaConf.select(config, f"{group}.name") for group in ("env", "model", "algorithm")]
    strategy = OmegaConf.select(config, "filter.strategy")
    if strategy and strategy != "none":
        parts.append(f"filter {strategy} {OmegaConf.select(config, 'filter.value', default='')}".strip())
    named = [str(part) for part in parts if part]
    return " · ".join(named) if named else run_dir.name


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="run folder holding metrics.jsonl (written by scripts/train.py)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: RUN_DIR/plots)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.run_dir / METRICS_FILENAME).is_file():
        raise SystemExit(
            f"No {METRICS_FILENAME} in {args.run_dir}; pass the run folder that scripts/train.py wrote "
            "(its `run_dir`, e.g. outputs/runs/<env>-<model>-<algorithm>-seed<seed>)."
        )
    paths, skipped = render_run(read_metrics(args.run_dir), args.out or args.run_dir / "plots", run_name(args.run_dir))
    for path in paths:
        print(f"wrote {path}")
    for note in skipped:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
