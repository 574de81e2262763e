"""Model configs resolve through the source registry; local folders load; offline hub names fail clearly."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from vagen.bootstrap.tiny import build_tiny_text_lm, build_tiny_vl
from vagen.models.registry import load_policy, load_processing, model_sources, resolve_dtype

MODEL_CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs" / "model").glob("*.yaml"))


@pytest.mark.parametrize("path", MODEL_CONFIGS, ids=lambda p: p.stem)
def test_every_model_config_names_a_registered_source(path):
    config = OmegaConf.load(path)
    assert config.name == path.stem
    assert config.source in model_sources()
    assert config.modality in ("vision", "text")


def test_pretrained_source_loads_local_vision_and_text_folders():
    vision = load_policy("local_vl", "pretrained", "vision", path=str(build_tiny_vl(size="test")), dtype="float32")
    assert vision.image_processor is not None and vision.processor is vision.image_processor
    assert type(vision.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    text = load_policy("local_lm", "pretrained", "text", path=str(build_tiny_text_lm(size="test")), dtype="float32")
    assert text.image_processor is None and text.processor is text.tokenizer
    tokenizer, image_processor = load_processing("pretrained", "vision", path=str(build_tiny_vl(size="test")))
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == vision.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert image_processor.merge_size == 2


def test_unreachable_model_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="offline default"):
        load_policy("missing", "pretrained", "text", path="no-such-org/no-such-model")


def test_bad_names_list_the_valid_ones():
    with pytest.raises(ValueError, match="smollm2"):
        load_policy("x", "nope", "text")
    with pytest.raises(ValueError, match="modality"):
        load_policy("x", "smollm2", "audio")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("fp8", torch.device("cpu"))
