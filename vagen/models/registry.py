"""Loading a policy by config: one registry of model *sources*, one loader per modality.

A source turns the config into a local folder (or a hub name) holding a transformers model;
`load_policy` then loads it the same way whatever the source: `AutoModelForImageTextToText` plus a
torchvision-free Qwen-VL processor for vision models, `AutoModelForCausalLM` plus its tokenizer for
text models. Offline-built defaults (tiny_vl, smollm2_135m) are sources like any other.

Sources that build models offline (the tiny models and the supervised warm start of `tiny_vl`, in
`vagen.bootstrap`, which trains with the rollout and the trainer's forward) register through the
`vagen.model_sources` entry-point group, loaded on first lookup, so this module never imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vagen.models.attention import use_fast_attention
from vagen.models.cache import verify_built_folder
from vagen.registry import Registry, load_entry_points

MODALITIES = ("vision", "text")
MODEL_SOURCES: Registry = Registry("model source")
SOURCE_ENTRY_POINT_GROUP = "vagen.model_sources"


def model_sources() -> list[str]:
    """Every source name, those of installed plugins (`vagen.model_sources` entry points) included."""
    load_entry_points(SOURCE_ENTRY_POINT_GROUP)
    return MODEL_SOURCES.names()


def model_folder(source: str, path: str | None = None, size: str | None = None) -> str:
    """The local folder (or hub name) that `source` resolves the model config to, building it if it must."""
    model_sources()
    return MODEL_SOURCES.get(source)(path, size)


@dataclass
class Policy:
    """A loaded policy: the module, what prepares its inputs, and what it can read."""

    name: str
    modality: str
    model: torch.nn.Module
    tokenizer: Any
    image_processor: Any | None
    folder: str

    @property
    def processor(self) -> Any:
        """What engines and the trainer forward take: the VL processor's image part, or the tokenizer."""
        return self.image_processor if self.image_processor is not None else self.tokenizer


@MODEL_SOURCES.register("pretrained")
def _pretrained(path: str | None, size: str | None) -> str:
    if not path:
        raise ValueError(
            "model.source=pretrained needs model.path: a hub name (e.g. Qwen/Qwen2.5-VL-3B-Instruct) or a local folder."
        )
    return path


@MODEL_SOURCES.register("smollm2")
def _smollm2(path: str | None, size: str | None) -> str:
    from vagen.models.smollm2 import build_smollm2

    return str(build_smollm2())


@MODEL_SOURCES.register("lora_adapter")
def _lora_adapter(path: str | None, size: str | None) -> str:
    """model.path: a LoRA adapter folder (`scripts/sft.py lora.enabled=true`); the adapter is folded into its base
    once, into a cached full model folder."""
    if not path:
        raise ValueError(
            "model.source=lora_adapter needs model.path: the folder `scripts/sft.py lora.enabled=true` wrote."
        )
    from vagen.models.lora import materialize_adapter

    return materialize_adapter(path, load_policy)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """ "auto" is bf16 on GPU and fp32 on CPU (bf16 inference of SmolLM2 gave garbage on this CPU)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"Unknown model.dtype {name!r}; use one of {['auto', *dtypes]}.")
    return dtypes[name]


def load_policy(
    name: str,
    source: str,
    modality: str,
    *,
    path: str | None = None,
    size: str | None = None,
    dtype: str = "auto",
    device: str | torch.device = "cpu",
) -> Policy:
    """Resolve the model's folder through its source and load it for its modality, on `device`."""
    if modality not in MODALITIES:
        raise ValueError(f"Unknown model.modality {modality!r}; use one of {MODALITIES}.")
    folder = model_folder(source, path, size)
    verify_built_folder(folder)  # a folder vagen built (or shipped) loads only as it was built
    device = torch.device(device)
    torch_dtype = resolve_dtype(dtype, device)
    try:
        if modality == "vision":
            from transformers import AutoModelForImageTextToText

            from vagen.models.processor import load_processor

            model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch_dtype)
            processor = load_processor(folder)
            tokenizer, image_processor = processor.tokenizer, processor.image_processor
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
            tokenizer, image_processor = AutoTokenizer.from_pretrained(folder), None
    except OSError as error:
        raise ValueError(
            f"Could not load model {name!r} from {folder!r}: {error}. Without network access, point model.path at "
            "a local folder with the weights, or use an offline default (model=tiny_vl or model=smollm2_135m)."
        ) from error
    use_fast_attention(model)
    return Policy(name, modality, model.to(device), tokenizer, image_processor, str(folder))


def load_processing(source: str, modality: str, *, path: str | None = None, size: str | None = None) -> tuple:
    """(tokenizer, image_processor or None) without the weights: config validation measures prompts with
    these before any model loads."""
    folder = model_folder(source, path, size)
    if modality == "vision":
        from vagen.models.processor import load_processor

        processor = load_processor(folder)
        return processor.tokenizer, processor.image_processor
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder), None
