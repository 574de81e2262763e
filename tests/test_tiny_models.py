"""The tiny offline Qwen2.5-VL / Qwen2 models, their BPE tokenizer, chat template and processor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from vagen.bootstrap.tiny import (
    TINY_SIZES,
    build_tiny_text_lm,
    build_tiny_vl,
    env_corpus,
    load_tiny_text_lm,
    load_tiny_vl,
    mrope_section,
    tiny_corpus,
    train_tiny_tokenizer,
)
from vagen.models.chat_template import QWEN_VL_CHAT_TEMPLATE, QWEN_VL_SPECIAL_TOKENS
from vagen.models.processor import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MIN_PIXELS,
    image_token_count,
    load_processor,
    make_processor,
    save_processor,
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("vagen-cache")


@pytest.fixture(scope="module")
def tokenizer():
    return train_tiny_tokenizer(tiny_corpus())


@pytest.fixture(scope="module")
def tiny_vl(cache_dir):
    return load_tiny_vl(build_tiny_vl(cache_dir, size="test"))


def random_images(count: int, side: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(count)]


def image_prompt(processor, question: str) -> str:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# ---- tokenizer and chat template -----------------------------------------------------------
def test_tokenizer_round_trips_env_texts_and_unseen_text(tokenizer):
    texts = [*env_corpus(seeds=2, steps=2), "Numbers: 907, 13\nTarget: 42 √ ünïcödé ✓ 🙂", "  two  spaces\t\n"]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    # Trained on the games' texts, the BPE compresses them well below one token per character.
    sokoban_rules = env_corpus(env_ids=("vagen/Sokoban-v0",), seeds=1, steps=0)[0]
    assert len(tokenizer.encode(sokoban_rules)) < len(sokoban_rules) / 3


def test_tokenizer_is_deterministic_and_has_qwen_roles(tokenizer):
    again = train_tiny_tokenizer(tiny_corpus())
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert 500 <= len(tokenizer) <= 2048
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"


def test_special_tokens_are_single_ids(tokenizer):
    ids = [tokenizer.encode(token, add_special_tokens=False) for token in QWEN_VL_SPECIAL_TOKENS]
    assert all(len(one) == 1 for one in ids)
    assert len({one[0] for one in ids}) == len(QWEN_VL_SPECIAL_TOKENS)
    # Inside running text too, glued to other characters.
    in_context = tokenizer.encode("x<|vision_start|><|image_pad|><|vision_end|>y", add_special_tokens=False)
    expected = [tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")]
    assert in_context[1:4] == expected


def test_chat_template_renders_image_message_in_qwen_layout(tokenizer):
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Where is the box?"}]},
        {"role": "assistant", "content": "<think>left</think><answer>Left</answer>"},
        {"role": "user", "content": "Go on."},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Where is the box?<|im_end|>\n"
        "<|im_start|>assistant\n<think>left</think><answer>Left</answer><|im_end|>\n"
        "<|im_start|>user\nGo on.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(with_system, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )
    assert tokenizer.chat_template == QWEN_VL_CHAT_TEMPLATE


# ---- processor -----------------------------------------------------------------------------
@pytest.mark.parametrize(("side", "tokens"), [(168, 36), (112, 16)])
def test_image_token_count_and_expansion_without_resize(tokenizer, side, tokens):
    assert (DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS) == (56 * 56, 448 * 448)
    assert image_token_count(side, side) == tokens
    processor = make_processor(tokenizer)
    text = image_prompt(processor, "Describe.")
    assert text.count("<|image_pad|>") == 1
    batch = processor(text=[text], images=random_images(1, side), return_tensors="pt")
    assert int((batch["input_ids"] == processor.image_token_id).sum()) == tokens
    # Sides that are multiples of 28 inside [min, max] pixels are not resized: 14-px patches tile the image.
    assert batch["image_grid_thw"].tolist() == [[1, side // 14, side // 14]]
    assert batch["pixel_values"].shape == (tokens * 4, 3 * 2 * 14 * 14)


def test_image_token_count_resizes_outside_pixel_range():
    assert image_token_count(240, 240) == 81  # rounded to 252 = 9 × 28
    assert image_token_count(28, 28) == 4  # raised to min_pixels 56 × 56
    assert image_token_count(2000, 2000) <= DEFAULT_MAX_PIXELS // 28**2


def test_load_processor_round_trip_gives_same_ids_and_pixels(tokenizer, tmp_path):
    original = make_processor(tokenizer, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    save_processor(original, tmp_path)
    reloaded = load_processor(tmp_path)
    texts = [image_prompt(original, "Where is the goal?"), image_prompt(original, "Push the box left.")]
    images = random_images(2, 168, seed=1)
    first = original(text=texts, images=images, padding=True, return_tensors="pt")
    second = reloaded(text=texts, images=images, padding=True, return_tensors="pt")
    assert torch.equal(first["input_ids"], second["input_ids"])
    assert torch.equal(first["pixel_values"], second["pixel_values"])
    assert reloaded.tokenizer.chat_template == original.tokenizer.chat_template
    assert reloaded.image_processor.size == original.image_processor.size


def test_load_processor_names_the_fix_for_a_wrong_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="build_tiny_vl"):
        load_processor(tmp_path)


# ---- models --------------------------------------------------------------------------------
@pytest.mark.parametrize("size", sorted(TINY_SIZES))
def test_mrope_section_covers_half_the_head(size):
    dims = TINY_SIZES[size]
    head_dim = dims.text_hidden // dims.text_heads
    assert sum(mrope_section(head_dim)) == head_dim // 2


def test_tiny_vl_build_is_deterministic_per_seed(cache_dir, tmp_path):
    first = load_file(build_tiny_vl(cache_dir, size="test") / "model.safetensors")
    rebuilt = load_file(build_tiny_vl(tmp_path / "elsewhere", size="test") / "model.safetensors")
    other_seed = load_file(build_tiny_vl(tmp_path / "elsewhere", size="test", seed=1) / "model.safetensors")
    assert first.keys() == rebuilt.keys()
    assert all(torch.equal(first[name], rebuilt[name]) for name in first)
    assert not all(torch.equal(first[name], other_seed[name]) for name in first)


def test_tiny_vl_config_matches_tokenizer(tiny_vl):
    model, processor = tiny_vl
    config = model.config
    assert config.text_config.vocab_size == len(processor.tokenizer)
    assert config.image_token_id == processor.image_token_id
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_generation_with_images_returns_new_ids(tiny_vl):
    model, processor = tiny_vl
    texts = [image_prompt(processor, "Where is the box?" + " Left" * i) for i in range(4)]
    batch = processor(text=texts, images=random_images(4, 168), padding=True, padding_side="left", return_tensors="pt")
    torch.manual_seed(0)
    with torch.no_grad():
        output = model.generate(**batch, max_new_tokens=16, min_new_tokens=16, do_sample=True)
    new_ids = output[:, batch["input_ids"].shape[1] :]
    assert new_ids.shape == (4, 16)
    assert int(new_ids.max()) < len(processor.tokenizer)
    # Vision tokens are never sampled: one in a response would break the next turn's forward.
    assert not bool((new_ids == processor.image_token_id).any())


def test_loss_backward_reaches_every_vision_parameter(tiny_vl):
    model, processor = tiny_vl
    texts = [image_prompt(processor, "Where is the hole?"), image_prompt(processor, "Up")]
    batch = processor(text=texts, images=random_images(2, 112), padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model.zero_grad()
    loss = model(**batch, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    silent = [name for name, p in model.model.visual.named_parameters() if p.grad is None or not p.grad.any()]
    assert silent == []
    model.zero_grad()


def test_tiny_text_lm_generates_and_trains(cache_dir):
    model, tokenizer = load_tiny_text_lm(build_tiny_text_lm(cache_dir, size="test"))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Arms: Dragon, Phoenix"}], tokenize=False, add_generation_prompt=True
    )
    batch = tokenizer([prompt], return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**batch, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert output.shape == (1, batch["input_ids"].shape[1] + 8)
    loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    assert torch.isfinite(loss) and model.get_input_embeddings().weight.grad.any()


def test_unknown_size_raises_with_choices(cache_dir):
    with pytest.raises(ValueError, match="default"):
        build_tiny_vl(cache_dir, size="huge")
