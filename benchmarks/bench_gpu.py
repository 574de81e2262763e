"""One full StarPO iteration of a Qwen2.5-VL-3B-architecture model on sokoban_visual: seconds per phase,
tokens/s and peak memory next to the memory plan's estimate, for full fine-tuning and LoRA.

The model has the published Qwen2.5-VL-3B-Instruct's numbers (written below, nothing downloaded) and random
weights; its tokenizer and processor are the project's tiny ones (vagen.bootstrap.tiny), so the text is gibberish
but every tensor has the real size: 151,936-entry embeddings and LM head, 36 decoder layers, a 32-block vision tower.
It needs torch, transformers and torchvision-free processing only: the hf engine generates (no vLLM, no network).

    python benchmarks/bench_gpu.py [scale=3b|tiny] [modes=full,lora] [groups=2] [group_size=4] [micro_batch=2]
                                [max_turns=3] [max_new_tokens=64] [context=2048] [grad_ckpt=false] [folder=DIR]
    python benchmarks/bench_gpu.py              # the 3B architecture, bf16, on the GPU
    python benchmarks/bench_gpu.py scale=tiny   # a few narrow layers: proves the script on a CPU in minutes

    scale            3b: the published architecture; tiny: a few narrow layers, the same vocabulary
    modes            comma-separated: full, lora
    groups           P initial states
    group_size       N rollouts per state
    micro_batch      dialogues per forward/backward
    max_turns        turns per episode
    max_new_tokens   tokens per turn
    context          rollout.max_context_tokens
    grad_ckpt        true: trainer.gradient_checkpointing=true
    folder           an already built model folder of this scale (default: build one in a temporary folder)

Each mode runs in a fresh subprocess, so its peak (`torch.cuda.max_memory_allocated` on GPU, peak RSS growth on
CPU) is its own. Phases: rollout (generation + env steps), old/ref log-probs (the no-grad scoring passes; score
tok/s = dialogue tokens per second of them; the first mini-batch's old log-probs come from its own forward,
`trainer.reuse_first_forward`), update (the PPO
forward/backward/optimizer steps). A KL term (kl_coef=0.001) is on so that the reference pass is timed: a frozen
copy under full fine-tuning, the same model with adapters off under LoRA.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from vagen.bootstrap.tiny import mrope_section, tiny_corpus, train_tiny_tokenizer
from vagen.cli import script_options
from vagen.models.chat_template import (
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    QWEN_VL_SPECIAL_TOKENS,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
)
from vagen.models.processor import make_processor, save_processor
from vagen.rollout import trajectories_to_batch
from vagen.trainer.memory_plan import GIB
from vagen.trainer.starpo import StarPOTrainer

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
# Qwen/Qwen2.5-VL-3B-Instruct's config.json; "tiny" keeps the vocabulary and shrinks the rest.
SCALES = {
    "3b": {
        "text": {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
                 "intermediate_size": 11008, "vocab_size": 151936, "rope_theta": 1e6},
        "vision": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                   "fullatt_block_indexes": [7, 15, 23, 31]},
    },
    "tiny": {
        "text": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "intermediate_size": 704, "vocab_size": 151936, "rope_theta": 1e6},
        "vision": {"depth": 2, "hidden_size": 64, "intermediate_size": 256, "num_heads": 2,
                   "fullatt_block_indexes": [1]},
    },
}  # fmt: skip
MODES = {"full": [], "lora": ["trainer.lora.enabled=true", "trainer.lora.r=16", "trainer.lora.alpha=32"]}
DEFAULTS = {"scale": "3b", "modes": "full,lora", "groups": 2, "group_size": 4, "micro_batch": 2, "max_turns": 3,
            "max_new_tokens": 64, "context": 2048, "grad_ckpt": False, "folder": ""}  # fmt: skip


def qwen2_5_vl_config(scale: str, tokenizer) -> Qwen2_5_VLConfig:
    """The scale's Qwen2.5-VL config, its special-token ids from the project's tokenizer."""
    text, vision = dict(SCALES[scale]["text"]), SCALES[scale]["vision"]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    rope = {"rope_type": "default", "rope_theta": text.pop("rope_theta"), "mrope_section": mrope_section(head_dim)}
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_VL_SPECIAL_TOKENS}
    vision = {**vision, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
              "out_hidden_size": text["hidden_size"]}  # fmt: skip
    text.update(max_position_embeddings=32768, eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT])
    return Qwen2_5_VLConfig(
        text_config={**text, "rope_parameters": rope},
        vision_config=vision,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,  # as the published 3B
    )


def build_model_folder(scale: str, folder: Path) -> None:
    """Random bf16 weights of the scale (drawn on the GPU when there is one: 3.75B on a CPU takes minutes)."""
    tokenizer = train_tiny_tokenizer(tiny_corpus())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(qwen2_5_vl_config(scale, tokenizer)).to(torch.bfloat16)
    model.save_pretrained(folder)
    save_processor(make_processor(tokenizer), folder)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the modes run in child processes: leave them the whole device


def run_config(options: DictConfig, folder: str, run_dir: str):
    overrides = [
        "~tuned", "env=sokoban_visual", "model=qwen2_5_vl_3b", f"model.path={folder}", "model.dtype=bfloat16",
        "trainer.bf16=true", "algorithm.kl_coef=0.001", "filter.empty_policy=keep_all", "diagnostics.compute_freq=0",
        f"trainer.groups={options.groups}", f"trainer.group_size={options.group_size}",
        f"trainer.mini_batch_size={options.groups * options.group_size}",
        f"trainer.micro_batch_size={options.micro_batch}",
        f"env.kwargs.max_turns={options.max_turns}", f"rollout.max_new_tokens={options.max_new_tokens}",
        f"rollout.max_context_tokens={options.context}", f"trainer.gradient_checkpointing={options.grad_ckpt}",
        "trainer.eval_every=0", "trainer.viz_every=0", "logger.wandb_mode=disabled", "logger.progress=false",
        f"run_dir={run_dir}", *MODES[options.only],
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("train", overrides=overrides)


def measure(options: DictConfig, folder: str) -> dict[str, float]:
    """One iteration of mode `options.only` in this process: phase seconds, tokens, peak memory, the plan."""
    cuda = torch.cuda.is_available()
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = StarPOTrainer(run_config(options, folder, run_dir))
        learner = trainer.learner
        metrics = trainer.train_iteration()
        trainer.close()
    batch = trajectories_to_batch(trainer.last_trajectories, pad_token_id=0)
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "rollout_s": metrics["perf/rollout_s"],
        "logprobs_s": metrics["perf/logprobs_s"],  # the update times its own scoring pass
        "update_s": metrics["perf/update_s"] - metrics["perf/logprobs_s"],
        "sampled_tokens": float(batch.response_mask.sum()),
        "tokens": float(batch.attention_mask.sum()),
        "peak_gib": (peak - (0 if cuda else start_rss)) / GIB,
        "plan_gib": learner.memory_plan.peak / GIB if learner.memory_plan else float("nan"),
        "trainable_m": sum(p.numel() for p in learner.trainable_parameters()) / 1e6,
    }


def report(mode: str, r: dict[str, float]) -> str:
    return (
        f"| {mode:<5} | {r['trainable_m']:11.1f} | {r['rollout_s']:9.1f} | {r['logprobs_s']:10.1f} | "
        f"{r['update_s']:8.1f} | {r['sampled_tokens'] / r['rollout_s']:13.1f} | "
        f"{r['tokens'] / max(r['logprobs_s'], 1e-9):11.0f} | {r['tokens'] / r['update_s']:12.0f} | "
        f"{r['peak_gib']:8.2f} | {r['plan_gib']:8.2f} |"
    )


def parse_options(argv: list[str]) -> DictConfig:
    """The options, with `only=<mode>` for the child process (it runs that mode and prints JSON)."""
    choices = {"scale": tuple(SCALES), "modes": tuple(MODES), "only": tuple(MODES)}
    return script_options(argv, {**DEFAULTS, "only": ""}, overrides=False, choices=choices)[0]


def main() -> None:
    options = parse_options(sys.argv[1:])
    if options.only:
        print(json.dumps(measure(options, options.folder)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = options.folder or str(Path(scratch) / f"qwen2_5_vl-{options.scale}")
        if not options.folder:
            build_model_folder(options.scale, Path(folder))
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
        print(f"Qwen2.5-VL {options.scale} architecture, bf16, on {device}; P={options.groups} "
              f"N={options.group_size} turns={options.max_turns} new_tokens={options.max_new_tokens} "
              f"grad_ckpt={options.grad_ckpt}")  # fmt: skip
        print("| mode  | trainable M | rollout s | logprobs s | update s | rollout tok/s | score tok/s | "
              "update tok/s | peak GiB | plan GiB |")  # fmt: skip
        print("|-------|-------------|-----------|------------|----------|---------------|-------------|"
              "--------------|----------|----------|")  # fmt: skip
        arguments = [f"{key}={options[key]}" for key in DEFAULTS if key != "folder"]
        for mode in options.modes.split(","):
            command = [sys.executable, __file__, f"only={mode}", f"folder={folder}", *arguments]
            child = subprocess.run(command, capture_output=True, text=True)
            if child.returncode:
                print(f"| {mode:<5} | failed: {child.stderr.strip().splitlines()[-1]}")
                continue
            print(report(mode, json.loads(child.stdout.strip().splitlines()[-1])))


if __name__ == "__main__":
    main()
