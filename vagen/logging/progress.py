"""Training progress: a tqdm bar on a terminal, one concise line per iteration elsewhere (CI logs, files).

succ 0.31 rew 2.10 kept 0.62                          <- the key metrics, short names, missing ones omitted
iter 12/200 | 3.21s/it | ETA 10:03 | succ 0.31 ...    <- the non-terminal line
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from tqdm import tqdm

DEFAULT_KEYS = ("env/success", "env/reward", "filter/kept_ratio")
SHORT_NAMES = {
    "env/success": "succ",
    "env/reward": "rew",
    "filter/kept_ratio": "kept",
}


def short_name(key: str) -> str:
    """A label for the bar: a known abbreviation, else the part after the last '/'."""
    return SHORT_NAMES.get(key, key.rsplit("/", 1)[-1])


def format_value(value: float) -> str:
    """Two decimals for ordinary magnitudes, scientific notation for tiny or huge ones (KL, grad norms)."""
    if not math.isfinite(value):
        return str(value)
    if value != 0 and not 0.01 <= abs(value) < 10_000:
        return f"{value:.2e}"
    return f"{value:.2f}"


def summarize(metrics: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """'succ 0.31 rew 2.10' from the metrics present among `labels` (key -> label), in label order."""
    parts = [f"{label} {format_value(float(metrics[key]))}" for key, label in labels.items() if key in metrics]
    return " ".join(parts)


class ProgressBar:
    """Iteration progress with ETA and key metrics.

    Args:
        total_iterations: iterations of the whole run.
        initial: iterations already done (a resumed run); the ETA uses only the speed of this session.
        keys: metric names to show, or a mapping name -> label.
        disable: True shows nothing; None/False show the bar (terminal) or lines (not a terminal).
        file: where to write; default sys.stderr (as tqdm), so stdout stays clean for results.
        tty: override the terminal detection of `file` (None: ask `file.isatty()`).
    """

    def __init__(
        self,
        total_iterations: int,
        initial: int = 0,
        keys: Sequence[str] | Mapping[str, str] = DEFAULT_KEYS,
        disable: bool | None = None,
        *,
        file: TextIO | None = None,
        tty: bool | None = None,
    ) -> None:
        if total_iterations < 0 or initial < 0:
            raise ValueError(f"total_iterations and initial must be >= 0; got {total_iterations=}, {initial=}.")
        self.total = total_iterations
        self.done = initial
        self._initial = initial
        self._labels = dict(keys) if isinstance(keys, Mapping) else {key: short_name(key) for key in keys}
        self._file = file if file is not None else sys.stderr
        self._disabled = bool(disable)
        is_tty = tty if tty is not None else bool(getattr(self._file, "isatty", lambda: False)())
        self._bar = None
        if not self._disabled and is_tty:
            self._bar = tqdm(total=total_iterations, initial=initial, file=self._file, unit="it", dynamic_ncols=True)
        self._start = time.monotonic()

    def update(self, metrics: Mapping[str, Any] | None = None) -> None:
        """Advance one iteration and show the key numbers of `metrics` (numbers or 0-dim tensors)."""
        self.done += 1
        if self._disabled:
            return
        summary = summarize(metrics or {}, self._labels)
        if self._bar is not None:
            self._bar.set_postfix_str(summary, refresh=False)
            self._bar.update(1)
            return
        self._file.write(self._line(summary) + "\n")
        self._file.flush()

    def _line(self, summary: str) -> str:
        elapsed = time.monotonic() - self._start
        per_iteration = elapsed / max(self.done - self._initial, 1)
        remaining = max(self.total - self.done, 0) * per_iteration
        parts = [
            f"iter {self.done}/{self.total}",
            f"{per_iteration:.2f}s/it",
            f"ETA {tqdm.format_interval(remaining)}",
        ]
        if summary:
            parts.append(summary)
        return " | ".join(parts)

    def write(self, message: str) -> None:
        """Print a message without breaking the bar."""
        if self._disabled:
            return
        if self._bar is not None:
            self._bar.write(message, file=self._file)
        else:
            self._file.write(message + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
