"""The memory plan: exact parameter counts from configs, hand-computed components, the trainer's refusal."""

import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM

from vagen.models.lora import add_lora
from vagen.trainer import learner as learner_module
from vagen.trainer import memory_plan
from vagen.trainer.memory_plan import (
    GIB,
    TrainingSetup,
    lora_parameter_count,
    model_shape,
    parameter_count,
    plan_memory,
)
from vagen.trainer.starpo import StarPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trainer import TEXT, config

TEXT_CFG = {
    "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 100,
}  # fmt: skip
VISION_CFG = {
    "depth": 2, "hidden_size": 32, "intermediate_size": 40, "num_heads": 2, "out_hidden_size": 48,
    "fullatt_block_indexes": [1],
}  # fmt: skip


def built(kind: str, tied: bool) -> tuple[torch.nn.Module, object]:
    if kind == "text":
        config = Qwen2Config(**TEXT_CFG, tie_word_embeddings=tied)
        return Qwen2ForCausalLM(config), config
    config = Qwen2_5_VLConfig(text_config=TEXT_CFG, vision_config=VISION_CFG, tie_word_embeddings=tied)
    return Qwen2_5_VLForConditionalGeneration(config), config


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("kind", ["text", "vision"])
def test_parameter_counts_equal_the_built_models(kind, tied):
    model, config = built(kind, tied)
    for source in (config, config.to_dict()):  # a config object or its dict (config.json)
        assert parameter_count(model_shape(source)) == sum(p.numel() for p in model.parameters())
    targets = ["q_proj", "v_proj", "gate_proj", "qkv"]  # gate_proj and qkv also adapt the vision tower
    add_lora(model, r=4, alpha=8, dropout=0.0, target_modules=targets)
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert lora_parameter_count(model_shape(config), 4, targets) == adapters


def test_the_published_qwen2_5_vl_3b_config_has_its_known_size():
    """The flat config.json of Qwen/Qwen2.5-VL-3B-Instruct (its numbers, nothing downloaded): 3.75B parameters."""
    published = {
        "model_type": "qwen2_5_vl", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008,
        "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2, "tie_word_embeddings": True,
        "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                          "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "in_channels": 3},
    }  # fmt: skip
    assert parameter_count(model_shape(published)) == 3_754_622_976


def test_plan_components_by_hand():
    """H=48, I=80, L=3, 4 heads (12 dims), 2 kv heads, V=100, tied: P=52,176 (counted in the test above)."""
    shape = model_shape(Qwen2Config(**TEXT_CFG, tie_word_embeddings=True))
    p = parameter_count(shape)
    setup = TrainingSetup(micro_batch_size=2, seq_len=10, sampled_tokens=4, reference=True, rollout_batch=3)
    plan = plan_memory(shape, setup)
    per_layer = 15 * 48 + 3 * 24 + 4 * 80  # elements per token
    activations = (3 * per_layer + 2 * 48) * 20 * 4 + 8 * 2 * 4 * 100 * 4
    assert plan.components["weights"] == plan.components["reference"] == 4 * p
    assert (plan.components["grads"], plan.components["optimizer"]) == (4 * p, 8 * p)
    assert plan.components["snapshot"] == 4 * p  # the weights before the update, for policy/update_norm
    assert plan.components["activations"] == activations
    assert plan.components["kv_cache"] == 2 * 3 * 24 * 3 * 10 * 4
    assert plan.peak == 4 * p * 2 + 8 * p + max(4 * p + 4 * p + activations, plan.components["kv_cache"])
    lora = plan_memory(shape, TrainingSetup(2, 10, 4, reference=True, lora_rank=2, lora_targets=("q_proj",)))
    adapters = 3 * 2 * (48 + 48)
    assert lora.components["reference"] == 0 and lora.trainable == adapters
    assert lora.components["optimizer"] == 8 * adapters
    checkpointed = plan_memory(shape, TrainingSetup(2, 10, 4, gradient_checkpointing=True))
    assert checkpointed.components["activations"] == (3 * 48 + per_layer + 2 * 48) * 20 * 4 + 8 * 2 * 4 * 100 * 4


def test_a_run_that_cannot_fit_is_refused_before_loading_with_the_fix(monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the memory check")

    monkeypatch.setattr(learner_module, "load_policy", no_model)
    one = [*TEXT, "rollout.max_context_tokens=512", "trainer.micro_batch_size=1"]
    cfg = config(one)
    full = memory_plan.plan_run(cfg, 50, "cpu")
    # Room for everything the plan counts with gradient checkpointing, not without it, even one dialogue at a time.
    budget = memory_plan.plan_run(config([*one, "trainer.gradient_checkpointing=true"]), 50, "cpu").peak
    assert budget < full.peak
    monkeypatch.setattr(memory_plan, "available_memory", lambda device: (budget, "the GPU"))
    with pytest.raises(ValueError, match=r"micro_batch_size=1 .*biggest: activations .*gradient_checkpointing=true"):
        StarPOTrainer(cfg)
    monkeypatch.setattr(memory_plan, "available_memory", lambda device: (1, "the GPU"))
    with pytest.raises(ValueError, match=r"trainer\.memory_check=false"):
        StarPOTrainer(cfg)


def test_a_micro_batch_that_does_not_fit_is_lowered_to_the_largest_that_does(monkeypatch, tmp_path):
    cfg = config([*TEXT, "rollout.max_context_tokens=512", "trainer.micro_batch_size=4"], tmp_path)
    at = {size: memory_plan.plan_run(config([*TEXT, "rollout.max_context_tokens=512",
                                             f"trainer.micro_batch_size={size}"]), 50, "cpu").peak
          for size in (2, 3)}  # fmt: skip
    assert at[2] < at[3]
    monkeypatch.setattr(memory_plan, "available_memory", lambda device: (at[2], "the GPU"))
    with pytest.warns(UserWarning, match=r"trainer\.micro_batch_size=4 does not fit .* using 2"):
        trainer = StarPOTrainer(cfg)
    assert trainer.learner.memory_plan.micro_batch_size == 2 and trainer.learner.memory_plan.peak == at[2]
    assert (
        trainer.learner.micro_batch_size == 2
    )  # what the update splits by: a runtime value, logged by the warning above
    assert trainer.cfg.trainer.micro_batch_size == 4  # the user's config (and config.yaml) keep what was asked


def test_the_memory_check_can_be_skipped(monkeypatch):
    monkeypatch.setattr(memory_plan, "available_memory", lambda device: (1, "the GPU"))
    trainer = StarPOTrainer(config([*TEXT, "trainer.memory_check=false"]))
    assert trainer.learner.memory_plan is None


def test_setup_from_config_reads_the_runs_options():
    cfg = config(["env=sokoban_visual", "model=tiny_vl_test", "trainer.lora.enabled=true", "algorithm.kl_coef=0.1",
                  "trainer.bf16=true", "rollout=vllm"])  # fmt: skip
    setup = memory_plan.setup_from_config(cfg, prompt_tokens=300, device="cuda", device_bytes=80 * GIB)
    assert (setup.weight_bytes, setup.activation_bytes) == (4, 2)  # tiny_vl_test is float32 weights
    assert setup.sampled_tokens == 5 * 128 and setup.image_tokens == 1500
    assert setup.reference and setup.lora_rank == 8 and setup.rollout_batch == 0
    assert setup.vllm_bytes == int(0.4 * 80 * GIB)
