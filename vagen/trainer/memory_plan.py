"""A memory plan before any weights load: peak device memory of a StarPO run, by component, from the model's config.

Everything is counted in bytes from the HF config (`config.json`) and the run's options; nothing is loaded.
P = parameters, T = trainable parameters, w = bytes per weight (4 fp32, 2 bf16), a = bytes per activation
(2 under `trainer.bf16` autocast or bf16 weights, else 4), b = `trainer.micro_batch_size`, s = tokens per
dialogue (`rollout.max_context_tokens`), n = sampled tokens per dialogue (≤ max_turns·max_new_tokens), L layers,
H hidden, I MLP width, kv = kv_heads·head_dim, V vocabulary.

  weights      P·w                      the policy (a Qwen2 / Qwen2.5-VL / Llama-style decoder, counted exactly:
                                        tests compare with `sum(p.numel())` of the built model)
  reference    P·w if kl_coef > 0       a frozen copy of the initial policy; 0 with LoRA (the reference is the same
                                        model with its adapters switched off)
  critic       P_backbone·w             `ValueModel` deep-copies the backbone (everything but an untied LM head)
  lora         T_lora·w                 r·(in+out) per adapted linear layer (peft keeps adapters in the base dtype)
  grads        T·w                      one gradient per trainable parameter (policy + critic), alive through backward
  snapshot     T_policy·w               the policy's trainable weights before the update, for policy/update_norm
  optimizer    2·T·w                    AdamW's exp_avg and exp_avg_sq, created in the parameter's dtype by torch
  activations  what autograd keeps for backward in one micro-batch (b dialogues):
               per decoder layer and token (15·H + 3·kv + 4·I)·a: input norm (x, x·rsqrt, its output), q/k/v, rotated
               q/k, the GQA-expanded k/v fed to attention, attention output, o_proj input, residual, post-attention
               norm, and the SwiGLU MLP's gate, up, silu(gate) and product (4I); ×L×b·s, plus 2·H·a per token outside
               the layers (embeddings, final norm). The 15 was counted with `torch.autograd.graph.saved_tensors_hooks`
               on a Qwen2 layer (HF, SDPA, fp32): it keeps 15.0·H + 3·kv + 4·I per token.
               With gradient checkpointing only each layer's input is kept (H·a per token per layer) plus one layer's
               full set during its recomputation: (L·H + 2H + per-layer)·b·s·a.
               Plus the LM head on sampled tokens only (`vagen.forward`): 8 fp32 [b·n, V] tensors at its
               backward, the first of the pass, while every layer's activations are still held (the forward keeps
               logits, log-softmax, the entropy's softmax and product, ~4.6; their gradients add ~3, measured by peak
               RSS on CPU), and the vision tower on image patches
               (4 per merged image token): (13·Hv + 4·Iv)·a per patch per block, when it has trainable parameters.
               Kernels that materialise the attention matrix (eager attention) add b·heads·s²·a per layer
               (`attention_matrix=True`); SDPA (flash / memory-efficient on GPU, the CPU kernel) does not.
  kv_cache     2·L·kv·tokens·w          generation with the hf engine: tokens = (batch + kept) × s (batch = rollout
                                        batch, or engine_kwargs.max_batch_size; kept = the rollout batch, whose last
                                        turn the engine keeps for the next, with engine_kwargs.keep_cache, else 0;
                                        validation plays the held-out episodes in slices of the rollout batch)
  vllm         util × device memory     vLLM reserves `gpu_memory_utilization` of the device for itself (its weights
                                        and KV cache) for the whole run; it does not sleep between rollouts here

Peak = weights + reference + critic + lora + optimizer + vllm + max(grads + snapshot + activations, kv_cache):
weights, optimizer states and vLLM's reservation live all run, gradients, the snapshot and activations only during
the update and the hf engine's KV cache only during the rollout. Not counted: the no-grad old/reference log-prob
passes (a layer at a time, smaller than the update), allocator fragmentation, CUDA context (~0.5 GiB) and the Python
heap. `benchmarks/bench_memory_plan.py` compares the plan with measured peaks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

GIB = 1024**3
QKV_BIAS_TYPES = (  # q/k/v projections with a bias
    "qwen2",
    "qwen2_5_vl",
    "qwen2_5_vl_text",
    "qwen2_vl",
    "qwen2_vl_text",
    "vagen_board_qwen2",  # vagen.models.board_lm
)
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")  # configs/train.yaml
LOGIT_TENSORS = 8  # fp32 [n, V] tensors alive at the LM head's backward (see the module docstring)


@dataclass(frozen=True)
class VisionShape:
    """The Qwen2.5-VL vision tower's widths (vision_config)."""

    hidden: int
    depth: int
    intermediate: int
    out_hidden: int
    patch: int = 14
    temporal_patch: int = 2
    merge: int = 2
    in_channels: int = 3


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs from a HF config: the decoder's widths and, for a VL model, its vision tower."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool
    vision: VisionShape | None = None


def _as_dict(config: Any) -> dict[str, Any]:
    return config if isinstance(config, dict) else config.to_dict()


def model_shape(config: Any) -> ModelShape:
    """The shape of a transformers config object or config dict (Qwen2, Qwen2.5-VL nested or flat, Llama)."""
    top = _as_dict(config)
    text = {**top, **_as_dict(top.get("text_config") or {})}  # flat (published) or nested (transformers 5) VL configs
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    vision = None
    if top.get("vision_config"):
        v = _as_dict(top["vision_config"])
        vision = VisionShape(
            hidden=v.get("hidden_size", v.get("embed_dim")),
            depth=v["depth"],
            intermediate=v["intermediate_size"],
            out_hidden=v.get("out_hidden_size", text["hidden_size"]),
            patch=v.get("patch_size", 14),
            temporal_patch=v.get("temporal_patch_size", 2),
            merge=v.get("spatial_merge_size", 2),
            in_channels=v.get("in_channels", 3),
        )
    return ModelShape(
        vocab=text["vocab_size"],
        hidden=text["hidden_size"],
        layers=text["num_hidden_layers"],
        heads=heads,
        kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        intermediate=text["intermediate_size"],
        tied=bool(top.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        qkv_bias=bool(text.get("attention_bias", text.get("model_type", top.get("model_type")) in QKV_BIAS_TYPES)),
        vision=vision,
    )


def read_config(folder: str | Path) -> dict[str, Any]:
    """`config.json` of a local model folder (a published model's own, or one the tiny sources built)."""
    return json.loads((Path(folder) / "config.json").read_text())


# ---- parameters ----------------------------------------------------------------------------------
def linear_layers(shape: ModelShape) -> dict[str, tuple[int, int, int, bool]]:
    """Every nn.Linear by its module (leaf) name: (in_features, out_features, how many, has bias)."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    inter, bias = shape.intermediate, shape.qkv_bias
    layers = {
        "q_proj": (h, q, shape.layers, bias),
        "k_proj": (h, kv, shape.layers, bias),
        "v_proj": (h, kv, shape.layers, bias),
        "o_proj": (q, h, shape.layers, False),
        "gate_proj": (h, inter, shape.layers, False),
        "up_proj": (h, inter, shape.layers, False),
        "down_proj": (inter, h, shape.layers, False),
    }
    v = shape.vision
    if v is not None:  # the vision blocks' MLP shares the decoder's leaf names (peft matches both)
        merged = v.hidden * v.merge**2
        vision = {
            "qkv": (v.hidden, 3 * v.hidden, v.depth, True),
            "proj": (v.hidden, v.hidden, v.depth, True),
            "vision.gate_proj": (v.hidden, v.intermediate, v.depth, True),
            "vision.up_proj": (v.hidden, v.intermediate, v.depth, True),
            "vision.down_proj": (v.intermediate, v.hidden, v.depth, True),
            "merger.0": (merged, merged, 1, True),
            "merger.2": (merged, v.out_hidden, 1, True),
        }
        layers.update(vision)
    return layers


def _linear_params(fan_in: int, fan_out: int, count: int, bias: bool) -> int:
    return count * (fan_in * fan_out + (fan_out if bias else 0))


def vision_parameter_count(shape: ModelShape) -> int:
    v = shape.vision
    if v is None:
        return 0
    vision_prefixes = ("qkv", "proj", "vision.", "merger.")
    layers = linear_layers(shape).items()
    linears = sum(_linear_params(*spec) for name, spec in layers if name.startswith(vision_prefixes))
    patch_embed = v.in_channels * v.temporal_patch * v.patch**2 * v.hidden  # Conv3d without bias
    norms = 2 * v.hidden * v.depth + v.hidden  # two RMSNorms per block, the merger's ln_q
    return linears + patch_embed + norms


def parameter_count(shape: ModelShape) -> int:
    """P: every parameter of the model (tied embeddings counted once), as `sum(p.numel())` of the built model."""
    linears = linear_layers(shape).items()
    decoder = sum(_linear_params(*spec) for name, spec in linears if name.endswith("_proj") and "." not in name)
    norms = 2 * shape.hidden * shape.layers + shape.hidden
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    return decoder + norms + embeddings + vision_parameter_count(shape)


def lora_parameter_count(shape: ModelShape, rank: int, targets: list[str]) -> int:
    """r·(in + out) per linear layer whose leaf name is a target (peft's suffix match: `gate_proj` adapts the
    vision tower's MLP too)."""
    total = 0
    for name, (fan_in, fan_out, count, _) in linear_layers(shape).items():
        if name.rpartition(".")[2] in targets:
            total += count * rank * (fan_in + fan_out)
    return total


# ---- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainingSetup:
    """The run's options that decide memory (see the module docstring for the symbols)."""

    micro_batch_size: int
    seq_len: int
    sampled_tokens: int  # n per dialogue
    weight_bytes: int = 4
    activation_bytes: int = 4
    image_tokens: int = 0  # merged image tokens per dialogue (vision models)
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_targets: tuple[str, ...] = ()
    critic: bool = False
    reference: bool = False  # kl_coef > 0
    freeze_vision: bool = False
    gradient_checkpointing: bool = False
    attention_matrix: bool = False
    rollout_batch: int = 0  # dialogues generated at once by the hf engine (0 = no KV cache counted)
    kept_rows: int = 0  # dialogues whose last turn the hf engine keeps for the next (keep_cache)
    vllm_bytes: int = 0


@dataclass
class MemoryPlan:
    """Bytes per component and the peak they add up to."""

    components: dict[str, int]
    parameters: int
    trainable: int
    update: dict[str, int] = field(default_factory=dict)  # what exists only during the update (grads, snapshot, ...)
    micro_batch_size: int = 0  # the b it was planned with

    @property
    def peak(self) -> int:
        rollout = self.components.get("kv_cache", 0)
        persistent = sum(v for k, v in self.components.items() if k not in self.update and k != "kv_cache")
        return persistent + max(sum(self.update.values()), rollout)

    def biggest(self, count: int = 3) -> list[tuple[str, int]]:
        return sorted(((k, v) for k, v in self.components.items() if v), key=lambda kv: -kv[1])[:count]

    def describe(self) -> str:
        parts = ", ".join(f"{name} {size / GIB:.2f}" for name, size in self.biggest(len(self.components)))
        return f"peak {self.peak / GIB:.2f} GiB ({parts} GiB)"


def layer_activation_elements(shape: ModelShape) -> int:
    """Elements autograd keeps per token of one decoder layer (module docstring)."""
    kv = shape.kv_heads * shape.head_dim
    return 15 * shape.hidden + 3 * kv + 4 * shape.intermediate


def activation_bytes(shape: ModelShape, setup: TrainingSetup, vision_trains: bool) -> int:
    """What one micro-batch's forward keeps for its backward."""
    tokens = setup.micro_batch_size * setup.seq_len
    a = setup.activation_bytes
    per_layer = layer_activation_elements(shape) * tokens * a
    if setup.attention_matrix:
        per_layer += setup.micro_batch_size * shape.heads * setup.seq_len**2 * a
    outside = 2 * shape.hidden * tokens * a  # embeddings, final norm
    if setup.gradient_checkpointing:
        decoder = shape.layers * shape.hidden * tokens * a + per_layer + outside
    else:
        decoder = shape.layers * per_layer + outside
    logits = LOGIT_TENSORS * setup.micro_batch_size * setup.sampled_tokens * shape.vocab * 4
    vision = 0
    v = shape.vision
    if v is not None and vision_trains and setup.image_tokens:
        patches = setup.micro_batch_size * setup.image_tokens * v.merge**2
        per_block = (13 * v.hidden + 4 * v.intermediate) * patches * a
        if setup.gradient_checkpointing:  # block inputs + one block recomputed
            vision = v.depth * v.hidden * patches * a + per_block
        else:
            vision = v.depth * per_block
    return decoder + logits + vision


def plan_memory(shape: ModelShape, setup: TrainingSetup) -> MemoryPlan:
    """Peak memory of one StarPO run, by component (bytes)."""
    w = setup.weight_bytes
    params = parameter_count(shape)
    lora = lora_parameter_count(shape, setup.lora_rank, list(setup.lora_targets)) if setup.lora_rank else 0
    untied_head = 0 if shape.tied else shape.vocab * shape.hidden
    vision = vision_parameter_count(shape)
    if lora:
        policy_trainable = lora
        vision_trains = any(t in ("qkv", "proj", "gate_proj", "up_proj", "down_proj") for t in setup.lora_targets)
    else:
        policy_trainable = params - (vision if setup.freeze_vision else 0)
        vision_trains = not setup.freeze_vision
    # The critic copies the backbone after LoRA is injected: with LoRA it trains its adapters and the value head.
    critic_trainable = (lora if lora else params - untied_head) + shape.hidden + 1 if setup.critic else 0
    trainable = policy_trainable + critic_trainable
    kv_tokens = (setup.rollout_batch + setup.kept_rows) * setup.seq_len
    components = {
        "weights": params * w,
        "lora": lora * w,
        "reference": params * w if setup.reference and not lora else 0,
        "critic": (params - untied_head + lora + shape.hidden + 1) * w if setup.critic else 0,
        "optimizer": 2 * trainable * w,
        "grads": trainable * w,
        "snapshot": policy_trainable * w,
        "activations": activation_bytes(shape, setup, vision_trains) * (2 if setup.critic else 1),
        "kv_cache": 2 * shape.layers * shape.kv_heads * shape.head_dim * kv_tokens * w,
        "vllm": setup.vllm_bytes,
    }
    update = {name: components[name] for name in ("grads", "snapshot", "activations")}
    return MemoryPlan(
        components, parameters=params, trainable=trainable, update=update, micro_batch_size=setup.micro_batch_size
    )


# ---- the trainer's check -------------------------------------------------------------------------
FIXES = (
    ("set trainer.gradient_checkpointing=true", lambda s: s.gradient_checkpointing, {"gradient_checkpointing": True}),
    ("set trainer.lora.enabled=true", lambda s: s.lora_rank, {"lora_rank": 8, "lora_targets": DEFAULT_LORA_TARGETS}),
    ("set trainer.bf16=true", lambda s: s.activation_bytes == 2, {"activation_bytes": 2}),
    ("set model.dtype=bfloat16", lambda s: s.weight_bytes == 2, {"weight_bytes": 2, "activation_bytes": 2}),
    ("set trainer.freeze_vision=true", lambda s: s.freeze_vision, {"freeze_vision": True}),
)


def fixes_that_fit(shape: ModelShape, setup: TrainingSetup, available: int) -> list[str]:
    """The single option changes (in order of least effect on the algorithm) under which the plan fits."""
    return [
        hint
        for hint, already, change in FIXES
        if not already(setup) and plan_memory(shape, replace(setup, **change)).peak <= available
    ]


def largest_fitting_micro_batch(shape: ModelShape, setup: TrainingSetup, available: int) -> MemoryPlan | None:
    """The plan with the largest micro-batch size up to `setup`'s that fits; None when not even 1 does."""
    for size in range(setup.micro_batch_size, 0, -1):
        plan = plan_memory(shape, replace(setup, micro_batch_size=size))
        if plan.peak <= available:
            return plan
    return None


def check_fits(shape: ModelShape, setup: TrainingSetup, available: int, where: str) -> MemoryPlan:
    """The plan that fits, at the largest micro-batch size up to the configured one: a smaller micro-batch
    accumulates the same gradient (`aggregation_share`), so lowering it changes speed, not the algorithm. Raises
    ValueError naming the biggest components and the options that would make it fit when not even 1 dialogue does."""
    fitting = largest_fitting_micro_batch(shape, setup, available)
    if fitting is not None:
        return fitting
    smallest = replace(setup, micro_batch_size=1)
    plan = plan_memory(shape, smallest)
    fixes = fixes_that_fit(shape, smallest, available) or [
        "combine trainer.gradient_checkpointing=true, trainer.lora.enabled=true, a lower "
        "rollout.max_context_tokens and trainer.bf16=true, or use a smaller model"
    ]
    biggest = ", ".join(f"{name} {size / GIB:.1f} GiB" for name, size in plan.biggest())
    raise ValueError(
        f"This run needs about {plan.peak / GIB:.1f} GiB even at trainer.micro_batch_size=1 but {where} has "
        f"{available / GIB:.1f} GiB; "
        f"biggest: {biggest}. "
        f"To fit: {' or '.join(fixes)}. (Estimate: vagen/trainer/memory_plan.py; skip with trainer.memory_check=false.)"
    )


def available_memory(device: str) -> tuple[int, str] | None:
    """(bytes, description) the run may use: the whole GPU on cuda (the run owns it), MemAvailable of the host on
    CPU (what can be allocated without swapping or the OOM killer); None where it cannot be read."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info()[1], "the GPU"
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    fields = {line.split(":")[0]: line.split()[1] for line in lines if ":" in line}
    return (int(fields["MemAvailable"]) * 1024, "this machine's available RAM") if "MemAvailable" in fields else None


def setup_from_config(cfg: Any, prompt_tokens: int, device: str, device_bytes: int = 0) -> TrainingSetup:
    """The `TrainingSetup` of a training config (configs/train.yaml) on `device` ("cuda" or "cpu").

    prompt_tokens: the first prompt's length (images expanded); on a vision model every turn's observation is
    assumed to be an image of that size, an upper bound on the image tokens a dialogue holds.
    """
    trainer, rollout = cfg.trainer, cfg.rollout
    dtype = cfg.model.dtype if cfg.model.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    weight_bytes = 4 if dtype == "float32" else 2
    turns = int(cfg.env.kwargs.get("max_turns", 1))
    seq = rollout.max_context_tokens
    kwargs = rollout.engine_kwargs
    vllm = rollout.engine == "vllm" and device == "cuda"
    return TrainingSetup(
        micro_batch_size=trainer.micro_batch_size,
        seq_len=seq,
        sampled_tokens=min(seq, turns * rollout.max_new_tokens),
        weight_bytes=weight_bytes,
        activation_bytes=2 if trainer.bf16 else weight_bytes,
        image_tokens=min(seq, turns * prompt_tokens) if cfg.model.modality == "vision" else 0,
        lora_rank=trainer.lora.r if trainer.lora.enabled else 0,
        lora_targets=tuple(trainer.lora.target_modules),
        critic=bool(cfg.algorithm.critic),
        reference=cfg.algorithm.kl_coef > 0,
        freeze_vision=bool(trainer.freeze_vision),
        gradient_checkpointing=bool(trainer.gradient_checkpointing),
        rollout_batch=0 if vllm else kwargs.get("max_batch_size") or trainer.groups * trainer.group_size,
        kept_rows=0 if vllm or not kwargs.get("keep_cache", True) else trainer.groups * trainer.group_size,
        vllm_bytes=int(kwargs.get("gpu_memory_utilization", 0.9) * device_bytes) if vllm else 0,
    )


def check_run_fits(cfg: Any, config: Any, prompt_tokens: int, device: str) -> MemoryPlan | None:
    """The trainer's check before loading: the plan of `cfg` for the model config `config` that fits what `device`
    has (see `available_memory`), its micro-batch size lowered where needed (`check_fits`); raises ValueError when
    none fits; None when the memory cannot be read."""
    available = available_memory(device)
    if available is None:
        return None
    budget, where = available
    setup = setup_from_config(cfg, prompt_tokens, "cuda" if device.startswith("cuda") else "cpu", budget)
    return check_fits(model_shape(config), setup, budget, where)


def local_config(folder: str) -> dict[str, Any] | None:
    """The model's config.json from a local folder, or from the hub cache for a hub name (never downloads)."""
    if (Path(folder) / "config.json").exists():
        return read_config(folder)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    cached = try_to_load_from_cache(folder, "config.json")
    return json.loads(Path(cached).read_text()) if isinstance(cached, str) else None


def plan_run(cfg: Any, prompt_tokens: int, device: str) -> MemoryPlan | None:
    """`check_run_fits` for the model of `cfg` (resolved through its source, as the trainer will load it). A hub
    model not in the local cache cannot be planned (its load will download or fail): warns and returns None."""
    import warnings

    from vagen.models.registry import model_folder

    folder = model_folder(cfg.model.source, cfg.model.path, cfg.model.size)
    config = local_config(str(folder))
    if config is None:
        warnings.warn(
            f"No local config.json for {folder!r}: the memory check (trainer.memory_check) is skipped.", stacklevel=3
        )
        return None
    return check_run_fits(cfg, config, prompt_tokens, device)
