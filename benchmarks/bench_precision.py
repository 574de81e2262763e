"""Is bf16 autocast a speed-up on this machine? One SFT forward/backward of tiny_vl, float32 against bf16, side by side.

    python benchmarks/bench_precision.py [dialogues=16] [repeats=3] [threads=2]

    dialogues   dialogues in the step (the SFT batch size)
    repeats     timed steps per precision, alternating
    threads     torch threads

Plays `dialogues` noisy-solver sokoban_visual demonstrations, then times `backward_sft_batch` (the SFT step's
forward and backward) on them with the shipped tiny_vl, alternating float32 and bf16 autocast, and prints the median
of each and their ratio next to what `vagen.models.precision.native_bf16` says of this CPU. This is the measurement
behind `sft.bf16=auto` and the warning for bf16 on CPUs that emulate it.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from vagen.bootstrap.demos import demonstrations, sft_batch
from vagen.bootstrap.tiny import load_tiny_vl
from vagen.bootstrap.warmstart import backward_sft_batch, build_warm_tiny_vl, make_sokoban_visual
from vagen.cli import script_options
from vagen.models.precision import native_bf16
from vagen.rollout import DialogueFormatter


def main() -> None:
    options, _ = script_options(sys.argv[1:], {"dialogues": 16, "repeats": 3, "threads": 2}, overrides=False)
    torch.set_num_threads(options.threads)
    model, processor = load_tiny_vl(build_warm_tiny_vl())
    formatter = DialogueFormatter(processor.tokenizer, processor.image_processor)
    demos = demonstrations(make_sokoban_visual, formatter, range(options.dialogues), 0.25, name="sokoban_visual")
    batch = sft_batch(demos, processor.tokenizer.pad_token_id)
    model.train()
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(options.repeats):
        for bf16 in (False, True):
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            backward_sft_batch(model, batch, processor, None, bf16)
            seconds[bf16].append(time.perf_counter() - started)
    fp32, bf16 = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(f"native bf16 on this CPU: {native_bf16('cpu')} ({torch.backends.cpu.get_cpu_capability()})")
    print(f"SFT step of {len(demos)} tiny_vl dialogues, {options.threads} threads, median of {options.repeats}:")
    print(f"  float32 {fp32:.1f} s, bf16 autocast {bf16:.1f} s: bf16 takes {bf16 / fp32:.2f}x the float32 time")


if __name__ == "__main__":
    main()
