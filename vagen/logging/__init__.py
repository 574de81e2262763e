"""Run logging: metrics sinks (JSONL always, wandb optional) and a progress display."""

from vagen.logging.progress import ProgressBar
from vagen.logging.sinks import MetricsLogger, read_metrics

__all__ = ["MetricsLogger", "ProgressBar", "read_metrics"]
