"""Plot a training run: training, filtering, diagnostics and regime figures as PNGs.

    python scripts/plot_run.py run=outputs/runs/sokoban_visual-tiny_vl-grpo-seed0 [out=DIR]

    run   run folder holding metrics.jsonl (written by scripts/train.py); required
    out   folder for the PNGs (default: RUN/plots)

Reads `RUN/metrics.jsonl` (and `RUN/config.yaml` for the title when present), writes
`DIR/<figure>.png` (default DIR: RUN/plots), prints each written path and one line per panel
left out because its metrics are not in the log.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from vagen.cli import script_options
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


def parse_args(argv: list[str]) -> tuple[Path, Path]:
    """(the run folder, the folder for the PNGs) from `run=... [out=...]`."""
    example = {"run": "outputs/runs/sokoban_visual-tiny_vl-grpo-seed0"}
    options, _ = script_options(argv, {"run": "", "out": ""}, overrides=False, required=example)
    run_dir = Path(options.run)
    return run_dir, Path(options.out) if options.out else run_dir / "plots"


def main(argv: list[str] | None = None) -> int:
    run_dir, out = parse_args(sys.argv[1:] if argv is None else argv)
    if not (run_dir / METRICS_FILENAME).is_file():
        raise SystemExit(
            f"No {METRICS_FILENAME} in {run_dir}; pass the run folder that scripts/train.py wrote "
            "(its `run_dir`, e.g. run=outputs/runs/<env>-<model>-<algorithm>-seed<seed>)."
        )
    paths, skipped = render_run(read_metrics(run_dir), out, run_name(run_dir))
    for path in paths:
        print(f"wrote {path}")
    for note in skipped:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
