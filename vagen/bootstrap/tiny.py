"""Tiny Qwen2.5-VL-architecture models and their tokenizer, built locally with no download.

No vision-language model with open weights ships on PyPI, so the offline visual default is a
Qwen2.5-VL of a few million parameters (same code path as the real 3B/7B: mRoPE, windowed vision
attention, patch merger, `<|image_pad|>` expansion) that a later step warm-starts by SFT. Its
vocabulary is a ~1k-token byte-level BPE trained on the games' own texts: the real 151k vocab
would make the logits layer ~20× the cost of the whole rest of the model.

Everything is deterministic: the corpus comes from seeded environment episodes and a seeded
generator, BPE training is deterministic for a fixed corpus, and weights are drawn under
`torch.manual_seed(seed)` in a forked RNG (the caller's RNG state is untouched). Builds are cached
with `vagen.models.cache.build_once`, keyed by a hash of the corpus, so a change to the games'
texts rebuilds the tokenizer and the models that depend on it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from vagen.env import make_env
from vagen.models.cache import build_once, cache_root
from vagen.models.chat_template import (
    DEFAULT_SYSTEM_PROMPT,
    ENDOFTEXT,
    IM_END,
    IM_START,
    IMAGE_PAD,
    QWEN_VL_CHAT_TEMPLATE,
    QWEN_VL_SPECIAL_TOKENS,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
)
from vagen.models.processor import QwenVLProcessor, load_processor, make_processor, save_processor

# Bump when anything below changes what a build produces, so cached folders are rebuilt.
RECIPE_VERSION = 2
BPE_VOCAB_SIZE = 1024
MAX_POSITIONS = 8192
CORPUS_ENV_IDS = ("vagen/Sokoban-v0", "vagen/FrozenLake-v0", "vagen/Bandit-v0", "vagen/Countdown-v0")
CORPUS_SEEDS = 16
CORPUS_STEPS = 3
CORPUS_SYNTHETIC_RESPONSES = 600


@dataclass(frozen=True)
class TinySize:
    """Widths and depths of one tiny model size (text decoder, then vision tower)."""

    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_intermediate: int
    vision_hidden: int
    vision_depth: int
    vision_heads: int
    vision_intermediate: int


TINY_SIZES = {
    # The visual default, warm-started by SFT later: large enough to learn the games' formats.
    "default": TinySize(256, 4, 4, 2, 768, 64, 2, 4, 256),
    # For unit tests: every mechanism of the real architecture, as little compute as possible.
    "test": TinySize(64, 2, 4, 2, 128, 32, 2, 2, 64),
}


# ---- corpus and tokenizer --------------------------------------------------------------------
def env_corpus(
    env_ids: tuple[str, ...] = CORPUS_ENV_IDS, seeds: int = CORPUS_SEEDS, steps: int = CORPUS_STEPS
) -> list[str]:
    """Text observations and sampled responses of a few seeded random episodes per environment."""
    texts = []
    for env_id in env_ids:
        env = make_env(env_id, observation="text")
        for seed in range(seeds):
            observation, _ = env.reset(seed=seed)
            env.action_space.seed(seed)
            texts.append(observation.text)
            for _ in range(steps):
                response = env.action_space.sample()
                observation, _, terminated, truncated, _ = env.step(response)
                texts += [response, observation.text]
                if terminated or truncated:
                    break
        env.close()
    return texts


_THINGS = ("box", "target", "player", "wall", "hole", "goal", "floor", "ice", "box on target")
_RELATIONS = ("left of", "right of", "above", "below", "next to", "far from", "one step from")
_DIRECTIONS = ("Left", "Right", "Up", "Down")
_PLANS = (
    "I should push the box {d}.",
    "I will move {d} to reach the goal.",
    "Moving {d} avoids the hole.",
    "Go {d} first, then push.",
    "The path {d} is clear.",
)


def synthetic_responses(count: int = CORPUS_SYNTHETIC_RESPONSES, seed: int = 0) -> list[str]:
    """Well-formed `<think>…</think><answer>…</answer>` turns with short state-describing reasoning.

    The games' own random responses only ever think "random"; these give the BPE the words a
    trained policy writes (objects, relations, plans, arithmetic) so they cost few tokens.
    """
    rng = np.random.default_rng(seed)
    responses = []
    for index in range(count):
        if index % 5 == 4:
            a, b, c = (int(x) for x in rng.integers(1, 100, size=3))
            think = f"{a} + {b} = {a + b}, then {a + b} - {c} = {a + b - c}."
            responses.append(f"<think>{think}</think><answer>({a} + {b}) - {c}</answer>")
            continue
        sentences = []
        for _ in range(int(rng.integers(1, 4))):
            first, second = rng.choice(len(_THINGS), size=2, replace=False)
            relation = _RELATIONS[int(rng.integers(len(_RELATIONS)))]
            sentences.append(f"The {_THINGS[first]} is {relation} the {_THINGS[second]}.")
        plan = _PLANS[int(rng.integers(len(_PLANS)))]
        sentences.append(plan.format(d=_DIRECTIONS[int(rng.integers(4))].lower()))
        actions = [_DIRECTIONS[int(i)] for i in rng.integers(4, size=int(rng.integers(1, 4)))]
        responses.append(f"<think>{' '.join(sentences)}</think><answer>{' || '.join(actions)}</answer>")
    return responses


def tiny_corpus() -> list[str]:
    """The tokenizer's training corpus: env texts, synthetic responses and the chat scaffolding words."""
    scaffolding = [f"system\n{DEFAULT_SYSTEM_PROMPT}\n", "user\n", "assistant\n"] * 20
    return env_corpus() + synthetic_responses() + scaffolding


def corpus_digest(corpus: list[str], vocab_size: int = BPE_VOCAB_SIZE) -> str:
    """sha256 of the corpus and the BPE settings: equal digests give identical tokenizers."""
    digest = hashlib.sha256(f"vocab={vocab_size}\n".encode())
    for text in corpus:
        digest.update(text.encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def train_tiny_tokenizer(
    corpus: list[str], vocab_size: int = BPE_VOCAB_SIZE, isolate: str | None = None
) -> PreTrainedTokenizerFast:
    """A byte-level BPE with Qwen2.5-VL's special-token strings and chat template.

    Special tokens get ids 0..6 in `QWEN_VL_SPECIAL_TOKENS` order. Like Qwen, digits are split
    one per token (arithmetic in Countdown stays regular), `<|im_end|>` ends a turn (eos) and
    `<|endoftext|>` pads. `isolate`: a regex whose every match is its own pre-token, so BPE never merges it with
    a neighbour (the tiny text model's grid cells, `vagen.bootstrap.tiny_text.GRID_CELL_PATTERN`).
    """
    bpe = Tokenizer(models.BPE())
    splits = [pre_tokenizers.Split(Regex(isolate), behavior="isolated")] if isolate else []
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(QWEN_VL_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknown tokens
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=MAX_POSITIONS,
        chat_template=QWEN_VL_CHAT_TEMPLATE,
    )
    assert [tokenizer.convert_tokens_to_ids(t) for t in QWEN_VL_SPECIAL_TOKENS] == list(range(7))
    return tokenizer


# ---- model configs ---------------------------------------------------------------------------
def mrope_section(head_dim: int) -> list[int]:
    """Split of the rotary half-dimension into (temporal, height, width) parts, as Qwen2.5-VL's 16/24/24 of 64."""
    half = head_dim // 2
    spatial = (half - half // 4) // 2
    return [half - 2 * spatial, spatial, spatial]


def _text_fields(tokenizer: PreTrainedTokenizerFast, size: TinySize) -> dict:
    pad_id, eos_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT), tokenizer.convert_tokens_to_ids(IM_END)
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": size.text_hidden,
        "intermediate_size": size.text_intermediate,
        "num_hidden_layers": size.text_layers,
        "num_attention_heads": size.text_heads,
        "num_key_value_heads": size.text_kv_heads,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }


def tiny_vl_config(tokenizer: PreTrainedTokenizerFast, size: str = "default") -> Qwen2_5_VLConfig:
    """A Qwen2.5-VL config of the given `TINY_SIZES` entry whose vocabulary is `tokenizer`'s."""
    dims = _size(size)
    head_dim = dims.text_hidden // dims.text_heads
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": mrope_section(head_dim)}
    vision = {
        "depth": dims.vision_depth,
        "hidden_size": dims.vision_hidden,
        "intermediate_size": dims.vision_intermediate,
        "num_heads": dims.vision_heads,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": dims.text_hidden,
        # Windowed attention in every block but the last, like the real model's mix of local and global.
        "window_size": 112,
        "fullatt_block_indexes": [dims.vision_depth - 1],
    }
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_VL_SPECIAL_TOKENS}
    return Qwen2_5_VLConfig(
        text_config={**_text_fields(tokenizer, dims), "rope_parameters": rope},
        vision_config=vision,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,  # as Qwen2.5-VL-3B; halves the parameters of a tiny model
    )


def tiny_text_config(tokenizer: PreTrainedTokenizerFast, size: str = "default") -> Qwen2Config:
    """A Qwen2 causal-LM config with the text dimensions of `TINY_SIZES[size]`."""
    return Qwen2Config(**_text_fields(tokenizer, _size(size)), tie_word_embeddings=True)


def _size(size: str) -> TinySize:
    if size not in TINY_SIZES:
        raise ValueError(f"Unknown tiny model size {size!r}; choose one of {sorted(TINY_SIZES)}.")
    return TINY_SIZES[size]


def init_model(model_class: type[PreTrainedModel], config, seed: int = 0) -> PreTrainedModel:
    """`model_class(config)` with weights drawn from `seed`, leaving the global torch RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    return model.eval()


def _generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    """Stop at `<|im_end|>` or `<|endoftext|>` (as Qwen does), and never sample a vision or turn-start token.

    An untrained tiny model samples every token with similar probability. A sampled `<|image_pad|>`
    would enter the next turn's context with no image behind it and crash the forward pass there
    ("image features and image tokens do not match"), so `generate` suppresses the vision tokens
    and `<|im_start|>` (a response never opens a new turn).
    """
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    never_sampled = [IM_START, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
    return GenerationConfig(
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=eos_ids[1],
        suppress_tokens=[tokenizer.convert_tokens_to_ids(token) for token in never_sampled],
    )


# ---- build and load --------------------------------------------------------------------------
def _stamp(kind: str, size: str, seed: int, digest: str) -> dict[str, object]:
    return {"model": kind, "size": size, "seed": seed, "recipe": RECIPE_VERSION, "corpus_sha256": digest}


def build_tiny_vl(cache_dir: str | Path | None = None, size: str = "default", seed: int = 0) -> Path:
    """Return the folder of the untrained tiny Qwen2.5-VL (`size` in `TINY_SIZES`), building it once.

    The folder holds model.safetensors, config.json, generation_config.json, the tokenizer (with
    the chat template) and the image processor config; load it with `load_tiny_vl`. `cache_dir`
    defaults to `cache_root()` ($VAGEN_CACHE or ~/.cache/vagen).
    """
    _size(size)
    corpus = tiny_corpus()
    target = Path(cache_dir or cache_root()) / f"tiny-vl-{size}-seed{seed}"

    def build(folder: Path) -> None:
        tokenizer = train_tiny_tokenizer(corpus)
        model = init_model(Qwen2_5_VLForConditionalGeneration, tiny_vl_config(tokenizer, size), seed)
        model.generation_config = _generation_config(tokenizer)
        model.save_pretrained(folder)
        save_processor(make_processor(tokenizer), folder)

    return build_once(target, _stamp("tiny-vl", size, seed, corpus_digest(corpus)), build)


def load_tiny_vl(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[Qwen2_5_VLForConditionalGeneration, QwenVLProcessor]:
    """The model (in eval mode) and processor saved in `path` by `build_tiny_vl` (or a fine-tune of it)."""
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=dtype)
    return model.eval(), load_processor(path)


def build_tiny_text_lm(cache_dir: str | Path | None = None, size: str = "default", seed: int = 0) -> Path:
    """Return the folder of a random tiny Qwen2 causal LM sharing the tiny VL's tokenizer, building it once."""
    _size(size)
    corpus = tiny_corpus()
    target = Path(cache_dir or cache_root()) / f"tiny-text-lm-{size}-seed{seed}"

    def build(folder: Path) -> None:
        tokenizer = train_tiny_tokenizer(corpus)
        model = init_model(Qwen2ForCausalLM, tiny_text_config(tokenizer, size), seed)
        model.generation_config = _generation_config(tokenizer)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return build_once(target, _stamp("tiny-text-lm", size, seed, corpus_digest(corpus)), build)


def load_tiny_text_lm(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The causal LM (in eval mode) and tokenizer saved in `path` by `build_tiny_text_lm`."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)  # Qwen2, or BoardQwen2 (registered by vagen.models)
    return model.eval(), PreTrainedTokenizerFast.from_pretrained(path)
