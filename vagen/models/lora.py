"""LoRA adapters injected in place (peft), so the model keeps its own class and forward."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


def require_peft(option: str) -> None:
    """Raise the one-line fix when `option` (a config switch that turns LoRA on) is set but peft is not installed:
    checked with the config, before any model loads."""
    try:
        import peft  # noqa: F401
    except ImportError as error:
        raise ValueError(f"{option}=true needs peft: pip install peft.") from error


VISION_MODULES = r"(.*\.)?visual\..*"  # the names inside the vision tower: its modules and their parameters


def add_lora(
    model: torch.nn.Module, r: int, alpha: int, dropout: float, target_modules: list[str], exclude_vision: bool = False
) -> None:
    """Inject LoRA layers into `model` and make them the only trainable parameters; with `exclude_vision` none goes
    into the vision tower (`trainer.freeze_vision`: its MLPs share names such as gate_proj with the language model's).

    In-place injection (not a PeftModel wrapper) keeps `model.model`, `get_output_embeddings()` and
    the mRoPE helpers where the trainer, engines and scorer expect them; checkpoints then hold the
    adapter weights under the model's own parameter names.
    """
    from peft import LoraConfig, inject_adapter_in_model

    exclude = VISION_MODULES if exclude_vision else None
    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), exclude_modules=exclude
    )
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


# ---- adapters saved on their own (a supervised warm start of a large model as a few MB) ----------------------------
ADAPTER_WEIGHTS = "adapter.safetensors"
ADAPTER_CONFIG = "adapter.json"
ADAPTER_FORMAT = 2  # bump when the files' layout changes; older folders are then refused, not misread
MERGED_VERSION = 2  # bump when folding changes, so materialised folders in the cache are rebuilt


def save_adapter(model: torch.nn.Module, folder: Path, lora: dict[str, Any], base: dict[str, Any]) -> Path:
    """Write `model`'s LoRA weights (peft's `default` adapter) and what they adapt into `folder`.

    adapter.json records the LoRA settings and `base`, the model config (source, path, size, modality) the adapter
    was trained on: together they rebuild the adapted model (`materialize_adapter`) without a full copy of it."""
    from safetensors.torch import save_file

    tensors = {
        name: value.detach().contiguous().cpu() for name, value in model.state_dict().items() if ".lora_" in name
    }
    if not tensors:
        raise ValueError("The model holds no LoRA weights to save; inject them with add_lora first.")
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    settings = {
        "format": ADAPTER_FORMAT,
        "lora": {key: lora[key] for key in ("r", "alpha", "target_modules")},
        "base": base,
    }
    (folder / ADAPTER_CONFIG).write_text(json.dumps(settings, indent=2))
    return folder / ADAPTER_WEIGHTS


def read_adapter(folder: Path) -> dict[str, Any]:
    """adapter.json of an adapter folder, checked; a missing or damaged one is a ValueError naming the fix."""
    path = Path(folder) / ADAPTER_CONFIG
    fix = "point model.path at a folder written by `scripts/sft.py lora.enabled=true`, or re-run that SFT"
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"LoRA adapter folder {folder}: cannot read {ADAPTER_CONFIG} ({error}); {fix}.") from None
    if (
        not isinstance(settings, dict)
        or settings.get("format") != ADAPTER_FORMAT
        or not (folder / ADAPTER_WEIGHTS).exists()
    ):
        raise ValueError(
            f"LoRA adapter folder {folder} is not a format-{ADAPTER_FORMAT} adapter with {ADAPTER_WEIGHTS}; {fix}."
        )
    return settings


def materialize_adapter(folder: str | Path, load_policy: Callable[..., Any]) -> str:
    """A full model folder of the adapter's base with the adapter folded in, built once into the vagen cache.
    `load_policy` loads the base (`vagen.models.registry.load_policy`, passed in: the registry imports this module).

    Everything downstream (engines, vLLM, checkpoints, the trainer's own LoRA) then sees a plain model. The cache
    entry is keyed by the adapter's bytes and the base folder, so a re-trained adapter never reuses a stale one."""
    from safetensors.torch import load_file

    from vagen.models.cache import build_once, cache_root

    folder = Path(folder)
    settings = read_adapter(folder)
    base = settings["base"]
    digest = hashlib.sha256((folder / ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    stamp = {"adapter_sha256": digest, "base": base, "version": MERGED_VERSION}

    def build(out: Path) -> None:
        policy = load_policy("adapter base", base["source"], base["modality"], path=base.get("path"),
                             size=base.get("size"), dtype="float32")  # fmt: skip
        add_lora(policy.model, dropout=0.0, **settings["lora"])
        missing, unexpected = policy.model.load_state_dict(load_file(str(folder / ADAPTER_WEIGHTS)), strict=False)
        if unexpected or any(".lora_" in key for key in missing):
            raise ValueError(f"{folder}'s adapter does not fit its base model {base}; re-run the SFT that wrote it.")
        policy.model.save_pretrained(out, state_dict=merged_state_dict(policy.model))
        written = {item.name for item in out.iterdir()}
        for item in Path(policy.folder).iterdir():  # tokenizer, processor, chat template: the base's
            weights = item.name.startswith((".", "model.safetensors", "pytorch_model"))  # "." = the cache marker
            if item.is_file() and item.name not in written and not weights:
                shutil.copy2(item, out / item.name)

    return str(build_once(cache_root() / f"lora-merged-{digest[:16]}", stamp, build))
