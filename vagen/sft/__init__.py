"""Supervised warm starts on solver demonstrations (`scripts/sft.py`); the `tiny_vl` default is one of them."""

from vagen.sft.demos import Demo, demonstrations, play_demo, sft_batch
from vagen.sft.warmstart import WarmStartRecipe, build_warm_tiny_vl, read_report, warm_start

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
