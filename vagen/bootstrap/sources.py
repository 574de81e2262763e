"""The model sources built offline: `tiny_vl` (the warm-started tiny Qwen2.5-VL, shipped or built once by
`build_warm_tiny_vl`), `tiny_vl_random` and `tiny_text` (untrained tiny models).

Registered through the `vagen.model_sources` entry point (pyproject.toml), so `vagen.models` finds them
without importing this layer.
"""

from __future__ import annotations

from vagen.bootstrap.tiny import build_tiny_text_lm, build_tiny_vl
from vagen.bootstrap.warmstart import WarmStartRecipe, build_warm_tiny_vl
from vagen.models.registry import MODEL_SOURCES

# The test size gets a short recipe (~30 s on CPU): enough to write the response format reliably,
# so tests exercise real <think> blocks (MI scoring, parsing) without the full warm start.
QUICK_WARM_START = {
    "train_episodes": 64,
    "steps": 100,
    "batch_size": 8,
    "lr": 1e-2,
    "vision_steps": 60,
    "vision_batch_size": 16,
    "eval_episodes": 8,
}


@MODEL_SOURCES.register("tiny_vl")
def tiny_vl_source(path: str | None, size: str | None) -> str:
    size = size or "default"
    recipe = WarmStartRecipe() if size == "default" else WarmStartRecipe(size=size, **QUICK_WARM_START)
    return str(build_warm_tiny_vl(recipe=recipe))


@MODEL_SOURCES.register("tiny_vl_random")
def tiny_vl_random_source(path: str | None, size: str | None) -> str:
    return str(build_tiny_vl(size=size or "default"))


@MODEL_SOURCES.register("tiny_text")
def tiny_text_source(path: str | None, size: str | None) -> str:
    return str(build_tiny_text_lm(size=size or "default"))
