"""LoRA adapters injected in place (peft), so the model keeps its own class and forward."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def add_lora(model: torch.nn.Module, r: int, alpha: int, dropout: float, target_modules: list[str]) -> None:
    """Inject LoRA layers into `model` and make them the only trainable parameters.

    In-place injection (not a PeftModel wrapper) keeps `model.model`, `get_output_embeddings()` and
    the mRoPE helpers where the trainer, engines and scorer expect them; checkpoints then hold the
    adapter weights under the model's own parameter names.
    """
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules))
    inject_adapter_in_model(config, model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("lora_" in name)


@contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model` computing its base weights alone (peft's `PeftModel.disable_adapter()` for in-place adapters).

    The base weights never train under LoRA, so this is the initial policy: the KL reference without a second copy.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)  # also makes the adapters trainable again


def lora_kwargs(lora_cfg: Any) -> dict[str, Any]:
    """The `add_lora` arguments from a `trainer.lora` config block."""
    return {key: lora_cfg[key] for key in ("r", "alpha", "dropout", "target_modules")}


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights with every LoRA adapter folded into its base weight (W + scale·B·A), under the plain
    model's parameter names (no `base_layer`, no `lora_A/B`): what an engine with its own copy of the base
    model (vLLM) loads to sample from the adapted policy. A model without adapters gives its own state dict."""
    from peft.tuners.lora import LoraLayer

    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    merged = {}
    for key, tensor in model.state_dict().items():
        if ".lora_" in key:
            continue  # folded into the base weight below
        prefix, found, leaf = key.partition(".base_layer.")
        if found:
            layer = layers[prefix]
            if leaf == "weight":
                tensor = tensor + sum(layer.get_delta_weight(adapter) for adapter in layer.active_adapters)
            key = f"{prefix}.{leaf}"
        merged[key] = tensor
    return merged
