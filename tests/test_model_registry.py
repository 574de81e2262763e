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
    import huggingface_hub.constants

    # huggingface_hub reads HF_HUB_OFFLINE at import: setting only the variable here waits ~50 s for the network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
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


def tiny_base(modality: str) -> dict:
    """A base model config for an adapter: a tiny test model's folder (built in the usual cache, before a test
    points the cache elsewhere)."""
    folder = build_tiny_text_lm(size="test") if modality == "text" else build_tiny_vl(size="test")
    return {"source": "pretrained", "path": str(folder), "size": None, "modality": modality}


@pytest.mark.parametrize("modality", ["text", "vision"])
def test_a_saved_lora_adapter_loads_as_the_adapted_model(modality, tmp_path, monkeypatch):
    """An adapter saved alone (adapter.safetensors + adapter.json) and loaded through source=lora_adapter computes
    what the peft-adapted model computed: the saved config re-creates the adapters, and the folded weights
    (`merged_state_dict`, W + (alpha/r)·B@A) agree with peft's forward x·Aᵀ·Bᵀ·(alpha/r)."""
    from vagen.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, add_lora, save_adapter

    base = tiny_base(modality)
    monkeypatch.setenv("VAGEN_CACHE", str(tmp_path / "cache"))  # the folded model is built here
    adapted = load_policy("base", "pretrained", modality, path=base["path"], dtype="float32")
    add_lora(adapted.model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in adapted.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)  # peft starts B at 0: a trained adapter has moved it
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    save_adapter(adapted.model, tmp_path / "adapter", lora, base)
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]

    loaded = load_policy("warm", "lora_adapter", modality, path=str(tmp_path / "adapter"), dtype="float32")
    plain = load_policy("base", "pretrained", modality, path=base["path"], dtype="float32")
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        expected = adapted.model(input_ids=ids).logits
        assert torch.allclose(loaded.model(input_ids=ids).logits, expected, atol=1e-5)
        assert not torch.allclose(plain.model(input_ids=ids).logits, expected, atol=1e-3)
    changed = {
        name for name, p in loaded.model.state_dict().items() if not torch.equal(p, plain.model.state_dict()[name])
    }
    assert changed and all(name.split(".")[-2] in ("q_proj", "v_proj", "down_proj") for name in changed)
    assert loaded.tokenizer.chat_template == plain.tokenizer.chat_template


def test_a_damaged_or_retrained_adapter_is_never_read_stale(tmp_path, monkeypatch):
    from vagen.models.lora import ADAPTER_CONFIG, add_lora, save_adapter

    base = tiny_base("text")
    monkeypatch.setenv("VAGEN_CACHE", str(tmp_path / "cache"))
    policy = load_policy("base", "pretrained", "text", path=base["path"], dtype="float32")
    add_lora(policy.model, r=2, alpha=2, dropout=0.0, target_modules=["q_proj"])
    folder = tmp_path / "adapter"
    save_adapter(policy.model, folder, {"r": 2, "alpha": 2, "target_modules": ["q_proj"]}, base)
    first = load_policy("warm", "lora_adapter", "text", path=str(folder)).model.state_dict()
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.1)
    save_adapter(
        policy.model, folder, {"r": 2, "alpha": 2, "target_modules": ["q_proj"]}, base
    )  # re-trained into the same folder
    second = load_policy("warm", "lora_adapter", "text", path=str(folder)).model.state_dict()
    assert any(not torch.equal(first[name], second[name]) for name in first)
    (folder / ADAPTER_CONFIG).write_text("{not json")
    with pytest.raises(ValueError, match=r"cannot read adapter\.json.*scripts/sft\.py lora\.enabled=true"):
        load_policy("warm", "lora_adapter", "text", path=str(folder))
    with pytest.raises(ValueError, match=r"needs model\.path"):
        load_policy("warm", "lora_adapter", "text")
