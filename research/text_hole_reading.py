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
    python research/text_hole_reading.py mode=mixed steps=300 lr=5e-4 reading_coef=0 cells_coef=1 out=<folder>
    python research/text_hole_reading.py mode=mixed cells_steps=1000 cells_lr=1e-3 freeze_below=true steps=300 ...
        the same with cell labels instead (docs/learning.md, "What the policy cannot see"): the text analogue of
        tiny_vl's vision pre-training with `hole_labels`. A throw-away linear head reads, from every board cell's
        hidden state after `cells_layer` layers, the labels that pre-training gives each image tile: the directions
        of the player and the goal from that cell, and which of its four neighbours are holes (`tile_facts`), on 32
        FrozenLake boards a step; cells_coef=0 is its control. With cells_steps, first that many steps of the cell
        labels alone, training only the embeddings and the layers below `cells_layer` (`pretrain_cells`), and with
        freeze_below=true those stay fixed through the SFT steps, as tiny_vl's vision tower does
    python research/text_hole_reading.py mode=mixed steps=300 lr=5e-4 reading_coef=0 neighbours=true out=<folder>
        the same continuation with the board's neighbour embeddings added at zero first (`with_neighbours`: each cell's
        token also carries the symbols above, below, left and right of it), as a vision tower's patch does
    python research/text_hole_reading.py mode=mixed neighbours=true cells_steps=1000 cells_params=neighbours \
            cells_lr=3e-3 cells_layer=4 cells_coef=1 steps=300 lr=5e-4 reading_coef=0 out=<folder>
        the cell labels read after every layer, first by the neighbour tables alone (the rest fixed), then kept
        through the SFT
    python research/text_hole_reading.py mode=mixed neighbours=true cells_steps=1000 cells_params=hole_rows \
            cells_lr=3e-3 cells_layer=4 cells_coef=1 steps=300 lr=5e-4 reading_coef=1 out=<folder>
        the same with only the tables' rows of the hole symbol 'O' ever changing (in the SFT too), so that a Sokoban
        board changes only beside its targets, which share the symbol; and the FrozenLake reading loss in every SFT
        step (docs/learning.md, "Only the hole symbol's rows trained"); since 2026-12-07 the product builds the same
        weights as `frozenlake_text`'s default `tiny_text_holes` (vagen/bootstrap/text_holes.py, whose cell labels,
        hole-row mask and SFT loop this script calls)
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
from vagen.bootstrap.demos import demonstrations
from vagen.bootstrap.text_holes import (
    cell_logits,
    cells_head,
    hole_boards,
    only_hole_rows,
    pretrain_cells,
    sft_with_board_losses,
)
from vagen.bootstrap.tiny_text import make_text_game
from vagen.models.board_lm import with_neighbours
from vagen.rollout import DialogueFormatter
from vagen.rollout.validation import eval_seeds

SHIPPED = "vagen/bootstrap/shipped/warm-tiny-text-default-seed0"
DEFAULTS = {"mode": "probe", "model": SHIPPED, "levels": 256, "steps": 1500, "lr": 1e-3, "reading_coef": 1.0,
            "cells_coef": 0.0, "cells_layer": 2, "cells_steps": 0, "cells_lr": 1e-3, "freeze_below": "false",
            "neighbours": "false", "cells_params": "below", "seed": 0, "out": None, "threads": 1}  # fmt: skip
TABLE_PARAMS = ("neighbours", "hole_rows")  # the cells_params that train the neighbour tables (beside "below")


def hole_recall(model, head: torch.nn.Linear, layer: int, boards, pad_id: int) -> str:
    """The head's recall of the hole neighbours (up / down / left / right) over every cell of `boards`."""
    with torch.no_grad():
        logits, labels = cell_logits(model, head, layer, boards, pad_id)
    said, truth = logits[:, 2:].argmax(-1) == 1, labels[:, 2:] == 1
    return " / ".join(f"{v:.2f}" for v in ((said & truth).sum(0) / truth.sum(0)).tolist())


def parameters_below(model, layer: int) -> list[torch.nn.Parameter]:
    """What computes the hidden states after `layer` layers: the embeddings and the first `layer` layers."""
    return [*model.get_input_embeddings().parameters(), *model.model.layers[:layer].parameters()]


def cell_parameters(model, layer: int, which: str) -> list[torch.nn.Parameter]:
    """What the cell labels alone train: `below` (`parameters_below`) or `neighbours` (the neighbour tables only, the
    rest of the model fixed, so the labels can only be carried by what the tables add); `hole_rows` is `neighbours`
    with `only_hole_rows`' mask on the tables."""
    if which in TABLE_PARAMS:
        return list(model.get_input_embeddings().neighbour.parameters())
    return parameters_below(model, layer)


def greedy_think(model, tokenizer, prompt_ids: list[int]) -> str:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=40, do_sample=False)
    return tokenizer.decode(out[0, len(prompt_ids) :]).split("<think>")[-1].split("</think>")[0].strip()


def single_board_readings(model, tokenizer, boards) -> dict[str, str]:
    """Exact single-board readings, split by whether the truth names a hole."""
    counts = collections.Counter()
    for (ids, prompt), truth, _ in boards:
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
    if str(args["neighbours"]).lower() == "true":
        model = with_neighbours(model)
    if args["mode"] == "probe":
        return probe(model.eval(), tokenizer, int(args["levels"]))
    steps, lr, started = int(args["steps"]), float(args["lr"]), time.time()
    rng = np.random.default_rng(0)  # the boards' noisy play, then (reading mode) each step's draws
    boards = hole_boards(tokenizer, range(300_000, 304_000), rng)
    held_out = hole_boards(tokenizer, eval_seeds(200), np.random.default_rng(1))
    demos = []
    if args["mode"] == "mixed":
        formatter = DialogueFormatter(tokenizer)
        for name in ("sokoban_text", "frozenlake_text"):
            demos += demonstrations(functools.partial(make_text_game, name), formatter, range(2400), 0.25, 0, name)
    cells_coef, layer, pad = float(args["cells_coef"]), int(args["cells_layer"]), tokenizer.pad_token_id
    torch.manual_seed(int(args["seed"]))
    head = cells_head(model, boards)
    if args["cells_params"] == "hole_rows":
        only_hole_rows(model, tokenizer)
    if int(args["cells_steps"]):

        def on_cells_step(step: int, loss: float) -> None:
            if step % 200 == 0 or step == int(args["cells_steps"]):
                recall = hole_recall(model.eval(), head, layer, held_out, pad)
                model.train()
                print(f"cells step {step}: loss {loss:.4f}, held-out recall of hole neighbours {recall}", flush=True)

        below = cell_parameters(model, layer, str(args["cells_params"]))
        pretrain_cells(model, head, layer, boards, below, int(args["cells_steps"]), float(args["cells_lr"]),
                       np.random.default_rng(int(args["seed"]) + 1), pad, on_cells_step)  # fmt: skip
        if str(args["freeze_below"]).lower() == "true":  # as tiny_vl's SFT keeps the pre-trained vision tower fixed
            for parameter in parameters_below(model, layer):
                parameter.requires_grad_(False)
    if demos:
        rng = np.random.default_rng(int(args["seed"]))  # the dialogues' order and the reading draws
    print(f"step 0: single-board readings exact {single_board_readings(model.eval(), tokenizer, held_out)}")

    def on_step(step: int, losses: dict[str, float]) -> None:
        if step % 500 == 0 or step == steps:
            readings = single_board_readings(model.eval(), tokenizer, held_out)
            model.train()
            print(f"step {step}: dialogue loss {losses['dialogue']:.4f}, reading loss {losses['reading']:.4f}, cell "
                  f"labels' loss {losses['cells']:.4f}, single-board readings exact {readings}, "
                  f"{time.time() - started:.0f} s", flush=True)  # fmt: skip

    sft_with_board_losses(model, tokenizer, demos, boards, head, layer, steps, lr, float(args["reading_coef"]),
                          cells_coef, rng, on_step)  # fmt: skip
    if args["out"]:
        model.eval().save_pretrained(args["out"])
        tokenizer.save_pretrained(args["out"])


if __name__ == "__main__":
    given = dict(arg.split("=", 1) for arg in sys.argv[1:])
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise SystemExit(f"Unknown options {sorted(unknown)}; valid: {sorted(DEFAULTS)}.")
    if given.get("cells_params", "below") not in ("below", *TABLE_PARAMS):
        raise SystemExit(f"cells_params={given['cells_params']}: expected below, neighbours or hole_rows.")
    if given.get("cells_params") in TABLE_PARAMS and given.get("neighbours", "false").lower() != "true":
        raise SystemExit(f"cells_params={given['cells_params']} trains the neighbour tables: add neighbours=true.")
    main(DEFAULTS | given)
