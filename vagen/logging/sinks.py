"""Metric sinks: a JSON-lines file that is always written, and Weights & Biases when enabled.

`run_dir/metrics.jsonl` is the record of a run: one line per `log` call,
`{"step": <int>, "time": <unix seconds>, "<namespace>/<name>": <number>, ...}`, flushed at once so a
crash loses nothing. JSON has no NaN or infinity, so non-finite values are written as the strings
"nan", "inf" and "-inf" (valid JSON that keeps the sign); `read_metrics` turns them back into floats.

wandb is imported only when enabled. Its charts use `iteration` as the x-axis (a logged field, not
wandb's internal step), so the steps replayed after a resume are accepted instead of dropped.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch

METRICS_FILENAME = "metrics.jsonl"
WANDB_ID_FILENAME = "wandb_run_id.txt"
WANDB_MODES = ("offline", "online", "disabled")
_RESERVED_KEYS = ("step", "time")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _to_number(key: str, value: Any) -> bool | int | float:
    """A python scalar from a metric value; tensors must be 0-dim (so the caller chose how to reduce)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ValueError(
                f"Metric {key!r} is a tensor of shape {tuple(value.shape)}; log a 0-dim tensor or a number "
                "(reduce it first, e.g. with .mean())."
            )
        return value.item()
    if isinstance(value, np.ndarray | np.generic):
        if np.ndim(value) != 0:
            raise ValueError(f"Metric {key!r} is an array of shape {np.shape(value)}; reduce it to a scalar first.")
        return value.item()
    if isinstance(value, bool | int | float):
        return value
    raise TypeError(f"Metric {key!r} has type {type(value).__name__}; metrics must be numbers or 0-dim tensors.")


def _json_number(value: bool | int | float) -> bool | int | float | str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _from_json(record: dict[str, Any]) -> dict[str, Any]:
    return {key: _NON_FINITE.get(value, value) if isinstance(value, str) else value for key, value in record.items()}


def _checked(record: Any, path: Path, number: int) -> dict[str, Any]:
    """`record` if it is a metrics record (a JSON object with an integer "step"), else ValueError naming the line."""
    if not isinstance(record, dict) or type(record.get("step")) is not int:
        raise ValueError(
            f'{path} line {number} is not a metrics record (a JSON object with an integer "step"): '
            f"{json.dumps(record)[:80]}. Fix: delete or repair that line (or move the file aside to start the log "
            "afresh)."
        )
    return record


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file (or of `run_dir/metrics.jsonl` when given a folder), oldest first.

    "nan"/"inf"/"-inf" strings come back as floats. A torn last line (the process died mid-write) is
    skipped with a warning; a bad line elsewhere, or a line that is not a record, raises ValueError with its number.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILENAME
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            if number == len(lines):
                warnings.warn(f"Skipping the torn last line of {path}.", stacklevel=2)
                continue
            raise ValueError(
                f"{path} line {number} is not valid JSON ({error}); the file is damaged. Fix: delete or repair that "
                "line."
            ) from error
        records.append(_from_json(_checked(record, path, number)))
    return records


def _free_name(path: Path) -> Path:
    """`path`, or `stem-1.suffix`, `stem-2.suffix`, ... beside it: the first that does not exist (several
    backups within one second must not overwrite each other)."""
    candidate, number = path, 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
    return candidate


def _has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host) is not None  # where `wandb login` stores the key
    except (OSError, netrc.NetrcParseError):
        return False


class MetricsLogger:
    """Writes metrics to `run_dir/metrics.jsonl` and, unless disabled, to a wandb run.

    Args:
        run_dir: the run's output folder (created if missing).
        wandb_mode: "offline" (local wandb files, sync later with `wandb sync`), "online" (needs
            WANDB_API_KEY or `wandb login`) or "disabled" (JSONL only).
        project, run_name, config: passed to `wandb.init`.
        resume: continue an existing run: append to the JSONL (call `truncate_after(iteration)` first)
            and reuse the wandb run id stored in the run folder. Without it, an existing metrics file is
            renamed to `metrics.jsonl.<time>.bak` so a new run never mixes with an old one.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        wandb_mode: str = "offline",
        project: str = "vagen",
        run_name: str | None = None,
        config: dict | None = None,
        resume: bool = False,
    ) -> None:
        if wandb_mode not in WANDB_MODES:
            raise ValueError(f"Unknown wandb_mode {wandb_mode!r}; choose one of {list(WANDB_MODES)}.")
        if wandb_mode == "online" and not _has_wandb_credentials():
            raise ValueError(
                "wandb_mode='online' needs credentials: set the WANDB_API_KEY environment variable (or run "
                "`wandb login`), or use logger.wandb_mode=offline and `wandb sync` the run later."
            )
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILENAME
        self.wandb_mode = wandb_mode
        if not resume and self.path.exists() and self.path.stat().st_size > 0:
            backup = _free_name(self.path.with_name(f"{METRICS_FILENAME}.{time.strftime('%Y%m%d-%H%M%S')}.bak"))
            warnings.warn(f"{self.path} exists and resume=False: moving it to {backup.name}.", stacklevel=2)
            os.replace(self.path, backup)
        try:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close()
        except OSError as error:
            raise ValueError(
                f"Cannot open the metrics file {self.path} ({error.strerror}). Fix: move it out of the way (or "
                "choose another run_dir=...)."
            ) from error
        self._wandb_run = None
        if wandb_mode != "disabled":
            self._wandb_run = self._start_wandb(project, run_name, config, resume)

    def _start_wandb(self, project: str, run_name: str | None, config: dict | None, resume: bool) -> Any:
        import wandb  # lazily: a heavy import that JSONL-only runs do not need

        id_file = self.run_dir / WANDB_ID_FILENAME
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        run = wandb.init(
            mode=self.wandb_mode,
            dir=str(self.run_dir),
            project=project,
            name=run_name,
            config=config,
            id=run_id,
            resume="allow" if resume else None,
        )
        id_file.write_text(run.id)
        run.define_metric("iteration")
        run.define_metric("*", step_metric="iteration")
        return run

    def log(self, metrics: Mapping[str, float | int | torch.Tensor], step: int) -> None:
        """Append one record for iteration `step`; values are numbers or 0-dim tensors."""
        if self._file.closed:
            raise ValueError("This MetricsLogger is closed; create a new one to log more.")
        numbers: dict[str, bool | int | float] = {}
        for key, value in metrics.items():
            if not isinstance(key, str) or key in _RESERVED_KEYS:
                raise ValueError(f"Metric name {key!r} is not allowed; use 'namespace/name' strings.")
            numbers[key] = _to_number(key, value)
        record = {"step": int(step), "time": time.time()}
        record.update({key: _json_number(value) for key, value in numbers.items()})
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        if self._wandb_run is not None:
            self._wandb_run.log({"iteration": int(step), **numbers})

    def truncate_after(self, step: int) -> int:
        """Drop records with step > `step` (logged after the checkpoint being resumed); return how many.

        The file is rewritten beside itself and swapped in, so a crash here keeps the old file.
        """
        self._file.close()
        lines = self.path.read_text(encoding="utf-8").splitlines()
        kept = []
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn line from a crash mid-write
            if _checked(record, self.path, number)["step"] <= step:
                kept.append(line)
        temp = self.path.with_name(self.path.name + ".tmp")
        temp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(temp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        return len(lines) - len(kept)

    def close(self, exit_code: int = 0) -> None:
        """Flush and close the file and finish the wandb run; safe to call twice."""
        if not self._file.closed:
            self._file.close()
        if self._wandb_run is not None:
            self._wandb_run.finish(exit_code=exit_code)
            self._wandb_run = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.close(exit_code=0 if exc_type is None else 1)
