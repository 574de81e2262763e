"""The generation-engine interface: token ids (and images) in, sampled token ids and log-probs out.

Token-in/token-out (docs/spec.md §6.1): the rollout builds the exact prompt ids itself (chat template applied,
image pads expanded), an engine samples continuation ids, and training reads those very ids back.
Nothing is decoded and re-tokenised on the way, so every engine speaks ids, never text.

One constructor signature for all engines
-----------------------------------------
Engines are built from very different things: the transformers engine samples from the live
policy module that the trainer updates; a vLLM engine loads weights from a model folder into
its own memory. So every rollout engine class is registered in `ENGINES` and built the same way::

    engine = build_engine("hf", EngineSource(model=policy, processor=processor), max_batch_size=32)
    engine = build_engine("vllm", EngineSource(model_path="/ckpt/qwen", processor=processor), gpu_memory=0.5)

(`vagen.engines.api.ApiEngine`, for chat servers, takes the same `from_source` arguments but is not a
rollout engine: a server answers text, not ids and log-probs, so it only evaluates models.)

`EngineSource` names what the policy *is* (a live module, a path, a tokenizer/processor); the
keyword arguments are the engine's own knobs (batch size, memory, URL) and come straight from the
`engine:` config group. Each engine class implements `from_source(source, **engine_kwargs)` and
raises, naming the missing field, when the source lacks what it needs. Callers never special-case
an engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from PIL import Image

from vagen.registry import Registry

FinishReason = Literal["stop", "length"]


@dataclass
class Context:
    """One prompt, ready for the model.

    token_ids: the full prompt (chat template applied), with each image's pad token ALREADY repeated
        as many times as the image has tokens after merging (the caller expands them).
    images: the images those pads refer to, in order of appearance; empty for text-only prompts.
    """

    token_ids: list[int]
    images: list[Image.Image] = field(default_factory=list)
    seed: int | None = None
    """This context's own sampling seed: what it samples then depends on the seed alone, never on which other
    contexts share its batch (a worker's share of the groups). None: derived from the call's seed and position."""


def derive_seed(*keys: int) -> int:
    """One 31-bit seed from a tuple of non-negative ints, e.g. (run seed, iteration, turn, context).

    Every sampling seed of the project comes from here, through numpy's SeedSequence, so different key
    tuples give unrelated seeds. Adding offsets instead (seed + turn, seed + context) made context i at
    turn t and context i-1 at turn t+1 sample with the same seed.
    """
    return int(np.random.default_rng([int(key) for key in keys]).integers(2**31 - 1))


def context_seeds(contexts: list[Context], seed: int | None) -> list[int | None]:
    """The sampling seed of each context of a call seeded with `seed`: its own `Context.seed` when set, else
    `derive_seed(seed, position)`; None for every context without its own seed in an unseeded call."""
    return [
        context.seed if context.seed is not None else (None if seed is None else derive_seed(seed, index))
        for index, context in enumerate(contexts)
    ]


@dataclass
class SamplingParams:
    """How to sample continuations. Validated on construction; bad values raise `ValueError`."""

    max_new_tokens: int = 128
    """Upper bound on sampled tokens per context (stop token included)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax), and then top_p / top_k / seed are ignored."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to >= top_p; 1 keeps all."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    seed: int | None = None
    """Seed of the sampling RNG for this call; None draws from torch's global RNG."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Generation of a context ends right after it emits one of these; the stop token is kept in the output."""

    def __post_init__(self) -> None:
        self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}; set it to >= 1.")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(
                f"temperature must be a finite number >= 0, got {self.temperature!r}; use 0 for greedy decoding."
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}; use 1.0 to disable nucleus sampling.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}; use 0 to disable top-k.")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}.")
        bad_stops = [t for t in self.stop_token_ids if not isinstance(t, int) or t < 0]
        if bad_stops:
            raise ValueError(f"stop_token_ids must be non-negative ints, got {bad_stops!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """What an engine returns for one context.

    token_ids: the exact sampled ids, the stop token included when one was hit.
    logprobs: log-probability of each sampled token under the distribution it was drawn from: the
        logits with banned ids removed, divided by the temperature, truncated to top-k / top-p and
        renormalised (vLLM's `processed_logprobs`); greedy decoding reports T = 1. This is the
        behaviour policy. The trainer scores softmax(logits / T) without truncation (as verl and TRL
        do), so at top_p = 1, top_k = 0 the two agree and `rollout/logprob_gap_*` measures only real
        mismatch (precision, kernels, inputs); with truncation the gap also shows the mass cut off.
    finish_reason: "stop" if a stop token ended it, "length" if max_new_tokens did.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        assert len(self.token_ids) == len(self.logprobs), "one log-prob per sampled token"


@dataclass
class EngineSource:
    """What an engine is built from; each engine reads the fields it needs.

    model: a live policy module (the transformers engine samples from it, sharing it with the trainer).
    processor: the tokenizer, or the multimodal processor (it carries `.image_processor` and the tokenizer).
    model_path: a local folder or model name, for engines that load weights themselves (vLLM) or name a
        served model (API engines).
    """

    model: Any = None
    processor: Any = None
    model_path: str | None = None


@runtime_checkable
class Engine(Protocol):
    """Anything that samples continuations for a batch of contexts."""

    @classmethod
    def from_source(cls, source: EngineSource, **engine_kwargs: Any) -> Engine:
        """Build the engine; raise `ValueError` naming the missing `EngineSource` field or bad kwarg."""
        ...

    def generate(self, contexts: list[Context], sampling: SamplingParams) -> list[Generation]:
        """One `Generation` per context, in the same order. The whole list is one batched job."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Make the engine sample from these weights (called after every trainer update)."""
        ...

    def forget(self) -> None:
        """Drop what the engine keeps between calls for the dialogues to go on (the hf engine's keys and values of
        the last turn): a rollout calls it once its dialogues are over, so nothing is held through the update."""
        ...


ENGINES: Registry[type[Engine]] = Registry("engine")


def build_engine(name: str, source: EngineSource, **engine_kwargs: Any) -> Engine:
    """Build the engine registered as `name` (e.g. "hf") from `source` and its own keyword arguments."""
    return ENGINES.get(name).from_source(source, **engine_kwargs)
