"""The memory plan (vagen/trainer/memory_plan.py) against measured peaks, on CPU.

Each configuration runs in a fresh subprocess: it builds a ~100M-parameter Qwen2-style text model from a config
(random weights, nothing downloaded), then does two update steps as the trainer does (the trainer's own
`policy_forward` with entropy, backward, AdamW step) on a random batch. Measured = growth of the peak RSS
(`ru_maxrss`) from just before the model is built to after the second optimizer step (the first creates AdamW's
states); the estimate is the plan's weights + lora + grads + optimizer + activations for the same model and
batch (no reference, critic or KV cache).

    python benchmarks/bench_memory_plan.py [batch=4] [seq=512] [sampled=256]

    batch     dialogues per micro-batch
    seq       tokens per dialogue
    sampled   sampled (scored) tokens per dialogue
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from vagen.cli import script_options
from vagen.forward import policy_forward
from vagen.models.checkpointing import enable_gradient_checkpointing, recomputing
from vagen.models.lora import add_lora
from vagen.rollout.batch import TokenBatch
from vagen.trainer.memory_plan import GIB, TrainingSetup, model_shape, plan_memory

MODEL = {  # ~100M parameters: a Qwen2 of SmolLM2-135M's width with a smaller vocabulary
    "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_key_value_heads": 4, "vocab_size": 32000, "tie_word_embeddings": True,
}  # fmt: skip
STEPS = 2  # AdamW creates its states at the first step: the second is the steady state a run lives in
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
CONFIGS = {  # name -> (gradient checkpointing, LoRA rank)
    "full fp32": (False, 0),
    "full fp32 + grad ckpt": (True, 0),
    "LoRA r=16": (False, 16),
    "LoRA r=16 + grad ckpt": (True, 16),
}
DEFAULTS = {"batch": 4, "seq": 512, "sampled": 256}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def random_batch(batch: int, seq: int, sampled: int, vocab: int) -> TokenBatch:
    """Full-length dialogues whose last `sampled` tokens were sampled."""
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    response = torch.zeros(batch, seq)
    response[:, seq - sampled :] = 1.0
    zeros = torch.zeros(batch, seq)
    return TokenBatch(
        input_ids=ids,
        attention_mask=torch.ones(batch, seq, dtype=torch.long),
        response_mask=response,
        token_rewards=zeros,
        turn_ids=torch.zeros(batch, seq, dtype=torch.long),
        rollout_logprobs=zeros,
        group_index=torch.zeros(batch, dtype=torch.long),
        returns=torch.zeros(batch),
        images=[[] for _ in range(batch)],
    )


def measure(name: str, batch: int, seq: int, sampled: int) -> float:
    """One update step of configuration `name` in this process; the peak RSS growth in bytes."""
    checkpointing, rank = CONFIGS[name]
    data = random_batch(batch, seq, sampled, MODEL["vocab_size"])
    start = peak_rss_bytes()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**MODEL)).eval()
    if rank:
        add_lora(model, r=rank, alpha=2 * rank, dropout=0.0, target_modules=list(LORA_TARGETS))
    if checkpointing:
        enable_gradient_checkpointing(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        with recomputing(model):
            logprobs, entropy = policy_forward(model, data, None, with_entropy=True)
            mask = data.response_mask
            loss = -((logprobs + 0.001 * entropy) * mask).sum() / mask.sum()
            loss.backward()
        optimizer.step()
    return peak_rss_bytes() - start


def estimate(name: str, batch: int, seq: int, sampled: int) -> int:
    checkpointing, rank = CONFIGS[name]
    setup = TrainingSetup(
        micro_batch_size=batch,
        seq_len=seq,
        sampled_tokens=sampled,
        lora_rank=rank,
        lora_targets=LORA_TARGETS,
        gradient_checkpointing=checkpointing,
    )
    plan = plan_memory(model_shape(MODEL), setup)
    return plan.peak


def main() -> None:
    # only=<config>: the child process, which measures that configuration and prints JSON
    options, _ = script_options(sys.argv[1:], {**DEFAULTS, "only": ""}, overrides=False, choices={"only": CONFIGS})
    sizes = (options.batch, options.seq, options.sampled)
    if options.only:
        print(json.dumps({"measured": measure(options.only, *sizes)}))
        return
    params = plan_memory(model_shape(MODEL), TrainingSetup(1, 1, 1)).parameters
    print(f"Qwen2-style model, {params / 1e6:.1f}M parameters (fp32); batch={options.batch} seq={options.seq} "
          f"sampled={options.sampled}; torch {torch.__version__}")  # fmt: skip
    print(f"| {'config':<24} | estimate GB | measured GB | ratio |")
    print(f"|{'-' * 26}|-------------|-------------|-------|")
    arguments = [f"{key}={options[key]}" for key in DEFAULTS]
    for name in CONFIGS:
        command = [sys.executable, __file__, f"only={name}", *arguments]
        child = subprocess.run(command, capture_output=True, text=True, check=True)
        measured = json.loads(child.stdout.strip().splitlines()[-1])["measured"]
        planned = estimate(name, *sizes)
        print(f"| {name:<24} | {planned / GIB:11.2f} | {measured / GIB:11.2f} | {planned / measured:5.2f} |")


if __name__ == "__main__":
    main()
