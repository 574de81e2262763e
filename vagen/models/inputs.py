"""What a transformers model needs besides token ids: vision inputs, position ids (incl. Qwen2-VL's 3-D
mrope), the ids it must never sample, and eval mode.

One place for these, shared by the engine that samples, the trainer's forward and the MI scorer, so the
three always see the same pixels and positions for the same dialogue.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from PIL import Image


def image_key(image: Image.Image) -> tuple:
    """What tells two images apart: mode, size and a digest of the pixels (two images with equal keys give the model
    the same inputs)."""
    return image.mode, image.size, hashlib.sha1(image.tobytes()).digest()


def mrope_index_fn(model: torch.nn.Module) -> Any:
    """The model's `get_rope_index` if it uses Qwen2-VL-style 3-D rope positions, else None."""
    inner = getattr(model, "model", None)
    return getattr(inner, "get_rope_index", None)


def prompt_position_ids(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids of a left-padded prompt batch, and the offset that decode positions continue from.

    input_ids, attention_mask: (B, L) int64.
    Returns `position_ids`, (B, L) for ordinary causal LMs or (3, B, L) for mrope models, and
    `rope_delta` (B,) int64: a token appended at real index t (0-based, pads not counted) sits at
    position t + rope_delta (0 for text models; for mrope, images use fewer positions than tokens).
    A trainer that wants positions identical to generation can call this on its own batch.
    """
    get_rope_index = mrope_index_fn(model)
    if get_rope_index is None:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
        return position_ids, torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    image_token_id = model.config.image_token_id
    mm_token_type_ids = (input_ids == image_token_id).int()  # 1 marks an image token, as the processor does
    position_ids, rope_delta = get_rope_index(
        input_ids, mm_token_type_ids=mm_token_type_ids, image_grid_thw=image_grid_thw, attention_mask=attention_mask
    )
    return position_ids, rope_delta.view(-1)  # (3, B, L), (B,)


def image_model_inputs(model: torch.nn.Module, processor: Any, images: list[Image.Image]) -> dict[str, torch.Tensor]:
    """`pixel_values` and `image_grid_thw` of `images` (in order) on the model's device and dtype; {} without images.

    One place turns images into vision inputs, so the engine, the trainer's forward and the MI scorer
    always see the same pixels for the same image.
    """
    if not images:
        return {}
    image_processor = getattr(processor, "image_processor", processor)
    if image_processor is None or "pixel_values" not in getattr(image_processor, "model_input_names", ()):
        raise ValueError(
            "Inputs carry images but there is no image processor; pass the model's processor "
            "(e.g. EngineSource(model=..., processor=<the model's processor>))."
        )
    processed = image_processor(images=images, return_tensors="pt")
    parameter = next(model.parameters())
    return {
        "pixel_values": processed["pixel_values"].to(parameter.device, dtype=parameter.dtype),
        "image_grid_thw": processed["image_grid_thw"].to(parameter.device),
    }


def cache_inputs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword that passes a KV cache to `model`'s forward: `cache` from transformers 5.2x on (which deprecates
    `past_key_values` with a FutureWarning on every call), `past_key_values` before."""
    forward = model.forward
    name = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
    return {name: cache}


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either name (`cache` in newer transformers)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def placeholder_token_ids(model: torch.nn.Module) -> list[int]:
    """Image / video pad ids of a vision-language model ([] otherwise).

    They are never sampled: a generated pad would be read as an image slot when the trainer re-runs
    the sequence with its images, so the sampled ids could not be trained on (token-in/token-out).
    """
    if mrope_index_fn(model) is None:
        return []
    names = ("image_token_id", "video_token_id")
    return [i for i in (getattr(model.config, name, None) for name in names) if isinstance(i, int)]


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run `model` in eval mode (no dropout) and restore its previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
