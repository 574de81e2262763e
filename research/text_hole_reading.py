"""Does tiny_text see the holes next to the player? Three measurements (docs/warm_starts.md, "Holes next to the
player"), each from the shipped tiny_text unless `model=<folder>`:

    python research/text_hole_reading.py mode=probe [model=<folder>] [levels=256]
        first-turn readings of frozenlake_text's held-out levels (greedy, in the dialogue), split by whether a hole is
        next to the player, and each side's recall
    python research/text_hole_reading.py mode=reading steps=1500 lr=1e-3 out=<folder>
        FrozenLake board reading alone (one board -> its <think> text, 32 boards a step, as the recipe's reading
        phase), with the exact single-board readings on 200 held-out boards every 500 steps
    python research/text_hole_reading.py mode=mixed steps=300 lr=5e-4 reading_coef=1.0 out=<folder>
        recipe 4's second SFT pass continued (both games' demonstrations, 16 dialogues a step, cosine decay) with the
        FrozenLake reading loss added to every step; reading_coef=0 is its control
"""

from __future__ import annotations

import collections
import functools
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import vagen.models  # noqa: F401  (registers BoardQwen2 with the Auto classes)
from vagen.bootstrap.demos import demonstrations, sft_batch
from vagen.bootstrap.tiny_text import board_example, board_reading_loss, make_text_game, noisy_play
from vagen.bootstrap.warmstart import backward_sft_batch, lr_factor
from vagen.rollout import DialogueFormatter
from vagen.rollout.validation import eval_seeds

SHIPPED = "vagen/bootstrap/shipped/warm-tiny-text-default-seed0"
DEFAULTS = {"mode": "probe", "model": SHIPPED, "levels": 256, "steps": 1500, "lr": 1e-3, "reading_coef": 1.0,
            "out": None, "threads": 1}  # fmt: skip


def reading_boards(tokenizer, levels, rng: np.random.Generator) -> list[tuple[tuple[list[int], int], str]]:
    """((ids, prompt length), the true reading) of FrozenLake boards, each after 0-3 turns of noisy solver play."""
    env, boards = make_text_game("frozenlake_text"), []
    for level in levels:
        observation = noisy_play(env, level, 3, rng)
        boards.append((board_example(tokenizer, env, observation.text), env.unwrapped.demo_reasoning().strip()))
    return boards


def greedy_think(model, tokenizer, prompt_ids: list[int]) -> str:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=40, do_sample=False)
    return tokenizer.decode(out[0, len(prompt_ids) :]).split("<think>")[-1].split("</think>")[0].strip()


def single_board_readings(model, tokenizer, boards) -> dict[str, str]:
    """Exact single-board readings, split by whether the truth names a hole."""
    counts = collections.Counter()
    for (ids, prompt), truth in boards:
        think = greedy_think(model, tokenizer, ids[:prompt] + tokenizer("<think>")["input_ids"])
        counts["hole" if "holes" in truth else "none", think == truth] += 1
    return {kind: f"{counts[kind, True]}/{counts[kind, True] + counts[kind, False]}" for kind in ("hole", "none")}


def probe(model, tokenizer, levels: int) -> None:
    formatter, env = DialogueFormatter(tokenizer), make_text_game("frozenlake_text")
    exact, sides = collections.Counter(), collections.Counter()
    for seed in eval_seeds(levels):
        observation, _ = env.reset(seed=seed)
        think, truth = (
            greedy_think(model, tokenizer, formatter.first_prompt(observation)),
            env.unwrapped.demo_reasoning(),
        )
        hole = "holes" in truth
        exact[hole, think == truth.strip()] += 1
        named = think.split("holes")[1].strip(" .").split() if "holes" in think else []
        for side in truth.split("holes")[1].strip(" .").split() if hole else []:
            sides[side, side in named] += 1
    print(f"first-turn readings exact: beside a hole {exact[True, True]}/{exact[True, True] + exact[True, False]}, "
          f"without one {exact[False, True]}/{exact[False, True] + exact[False, False]}")  # fmt: skip
    print("holes named, by side: " + ", ".join(f"{s} {sides[s, True]}/{sides[s, True] + sides[s, False]}" for s in
                                               ("up", "down", "left", "right")))  # fmt: skip


def main(args: dict) -> None:
    torch.set_num_threads(int(args["threads"]))
    tokenizer = AutoTokenizer.from_pretrained(args["model"])
    model = AutoModelForCausalLM.from_pretrained(args["model"])
    if args["mode"] == "probe":
        return probe(model.eval(), tokenizer, int(args["levels"]))
    steps, lr, started = int(args["steps"]), float(args["lr"]), time.time()
    rng = np.random.default_rng(0)  # the boards' noisy play, then (reading mode) each step's draws
    boards = [example for example, _ in reading_boards(tokenizer, range(300_000, 304_000), rng)]
    held_out = reading_boards(tokenizer, eval_seeds(200), np.random.default_rng(1))
    demos = []
    if args["mode"] == "mixed":
        formatter = DialogueFormatter(tokenizer)
        for name in ("sokoban_text", "frozenlake_text"):
            demos += demonstrations(functools.partial(make_text_game, name), formatter, range(2400), 0.25, 0, name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, 10, 0.05) if demos else 1.0)
    if demos:
        rng = np.random.default_rng(0)  # the dialogues' order and the reading draws
    order, coef = [], float(args["reading_coef"]) if demos else 1.0
    torch.manual_seed(0)
    print(f"step 0: single-board readings exact {single_board_readings(model.eval(), tokenizer, held_out)}")
    model.train()
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        dialogue = 0.0
        if demos:
            if len(order) < 16:
                order += rng.permutation(len(demos)).tolist()
            rows, order = order[:16], order[16:]
            dialogue = backward_sft_batch(model, sft_batch([demos[i] for i in rows], tokenizer.pad_token_id),
                                          tokenizer, 8, False)  # fmt: skip
        reading = board_reading_loss(model, tokenizer, [boards[i] for i in rng.integers(0, len(boards), 32)])
        if coef > 0:
            (coef * reading).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 500 == 0 or step == steps:
            readings = single_board_readings(model.eval(), tokenizer, held_out)
            model.train()
            print(f"step {step}: dialogue loss {dialogue:.4f}, reading loss {reading.item():.4f}, single-board "
                  f"readings exact {readings}, {time.time() - started:.0f} s", flush=True)  # fmt: skip
    if args["out"]:
        model.eval().save_pretrained(args["out"])
        tokenizer.save_pretrained(args["out"])


if __name__ == "__main__":
    given = dict(arg.split("=", 1) for arg in sys.argv[1:])
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise SystemExit(f"Unknown options {sorted(unknown)}; valid: {sorted(DEFAULTS)}.")
    main(DEFAULTS | given)
