"""Gradient checkpointing of transformers models that train in eval mode.

HF recomputes a decoder layer in backward only when that layer is in training mode, but the trainer keeps its
models in eval mode (no dropout: the old and new log-probs must come from the same function). So checkpointing is
switched on once, and `recomputing` puts the checkpointed layers alone in training mode around the update: their
submodules (attention, MLP, any dropout) stay in eval mode, and generation and no-grad scoring never checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def enable_gradient_checkpointing(module: torch.nn.Module) -> None:
    """HF gradient checkpointing on `module` (a transformers model) or, for the critic, on its `.model` backbone."""
    target = module if hasattr(module, "gradient_checkpointing_enable") else getattr(module, "model", None)
    if target is None or not getattr(target, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"{type(module).__name__} does not support gradient checkpointing: "
            "set trainer.gradient_checkpointing=false."
        )
    # Non-reentrant: works when the inputs need no grad (frozen embeddings under LoRA) and with autocast.
    target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def checkpointed_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in module.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


@contextmanager
def recomputing(*modules: torch.nn.Module) -> Iterator[None]:
    """Within: the checkpointed layers of `modules` keep only their inputs and recompute the rest in backward."""
    layers = [layer for module in modules for layer in checkpointed_layers(module)]
    previous = [layer.training for layer in layers]
    for layer in layers:
        layer.training = True  # the layer object only, not `.train()`: its children stay in eval mode
    try:
        yield
    finally:
        for layer, mode in zip(layers, previous, strict=True):
            layer.training = mode
