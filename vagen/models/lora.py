"""LoRA adapters injected in place (peft), so the model keeps its own class and forward."""

from __future__ import annotations

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


def lora_kwargs(lora_cfg: Any) -> dict[str, Any]:
    """The `add_lora` arguments from a `trainer.lora` config block."""
    return {key: lora_cfg[key] for key in ("r", "alpha", "dropout", "target_modules")}
