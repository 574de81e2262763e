"""Models the project builds offline: untrained tiny models (`tiny`) and supervised warm starts on solver
demonstrations (`demos`, `warmstart`; `scripts/sft.py`), of which the `tiny_vl` default and the text default
`tiny_text` (`tiny_text`) are two. Their model
sources (`sources`) register through the `vagen.model_sources` entry point."""

from vagen.bootstrap.demos import Demo, demonstrations, play_demo, sft_batch
from vagen.bootstrap.warmstart import WarmStartRecipe, build_warm_tiny_vl, read_report, warm_start

__all__ = [
    "Demo",
    "WarmStartRecipe",
    "build_warm_tiny_vl",
    "demonstrations",
    "play_demo",
    "read_report",
    "sft_batch",
    "warm_start",
]
