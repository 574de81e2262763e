"""Generation engines behind one interface (token ids in, sampled ids and log-probs out); see `base`."""

from vagen.engines.api import ApiEngine, ApiGeneration
from vagen.engines.base import ENGINES, Context, Engine, EngineSource, Generation, SamplingParams, build_engine
from vagen.engines.hf import HFEngine
from vagen.engines.vllm_engine import VLLMEngine

__all__ = [
    "ENGINES",
    "ApiEngine",
    "ApiGeneration",
    "Context",
    "Engine",
    "EngineSource",
    "Generation",
    "HFEngine",
    "SamplingParams",
    "VLLMEngine",
    "build_engine",
]
