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
        step (docs/learning.md, "Only the hole symbol's rows trained")
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
from vagen.bootstrap.warmstart import backward_sft_batch, lr_factor, probe_labels
from vagen.env.policies import RELATIVE_DIRECTIONS
from vagen.models.board_lm import with_neighbours
from vagen.rollout import DialogueFormatter
from vagen.rollout.validation import eval_seeds

SHIPPED = "vagen/bootstrap/shipped/warm-tiny-text-default-seed0"
DEFAULTS = {"mode": "probe", "model": SHIPPED, "levels": 256, "steps": 1500, "lr": 1e-3, "reading_coef": 1.0,
            "cells_coef": 0.0, "cells_layer": 2, "cells_steps": 0, "cells_lr": 1e-3, "freeze_below": "false",
            "neighbours": "false", "cells_params": "below", "seed": 0, "out": None, "threads": 1}  # fmt: skip
TABLE_PARAMS = ("neighbours", "hole_rows")  # the cells_params that train the neighbour tables (beside "below")


def reading_boards(tokenizer, levels, rng: np.random.Generator) -> list[tuple[tuple[list[int], int], str, np.ndarray]]:
    """((ids, prompt length), the true reading, the cell labels) of FrozenLake boards, each after 0-3 turns of noisy
    solver play. The cell labels are the vision pre-training's for an image of the board (`probe_labels`, with
    `hole_labels`): (H·W, 2 + 4), row-major, the player's and the goal's direction from each cell, then its hole
    neighbours up / down / left / right."""
    env, boards = make_text_game("frozenlake_text", hole_labels=True), []
    for level in levels:
        observation = noisy_play(env, level, 3, rng)
        game = env.unwrapped
        shape, facts = game.grid().shape, game.tile_facts()
        width = len(game.key_cells()) + facts.shape[1]
        labels = probe_labels(shape, game.key_cells(), (0, width), width, facts)
        boards.append((board_example(tokenizer, env, observation.text), game.demo_reasoning().strip(), labels))
    return boards


def cells_loss(model, head: torch.nn.Linear, layer: int, batch, pad_id: int) -> torch.Tensor:
    """Cross-entropy of `head` reading each board cell's labels (`reading_boards`) from its hidden state after `layer`
    layers, over the boards of `batch` [((ids, prompt length), reading, labels)] (their prompts only)."""
    logits, labels = cell_logits(model, head, layer, batch, pad_id)
    return torch.nn.functional.cross_entropy(logits.view(-1, len(RELATIVE_DIRECTIONS)), labels.view(-1))


def cell_logits(model, head: torch.nn.Linear, layer: int, batch, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`head`'s logits for every cell of `batch`'s boards, (cells, columns, classes), and their labels (cells,
    columns)."""
    prompts = [ids[:prompt] for (ids, prompt), _, _ in batch]
    ids = torch.full((len(prompts), max(map(len, prompts))), pad_id)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt)
    hidden = model(ids, output_hidden_states=True).hidden_states[layer]
    rows, _ = model.get_input_embeddings().positions(ids)
    cells = hidden[rows > 0]  # (Σ H·W, D): every board's cells, row-major, boards in order
    cells = cells * torch.rsqrt(cells.square().mean(-1, keepdim=True) + 1e-6)  # RMS-normalised, as the next layer reads
    labels = torch.as_tensor(np.concatenate([labels for _, _, labels in batch]))
    assert cells.shape[0] == labels.shape[0], "one hidden state per board cell"
    return head(cells).view(*labels.shape, len(RELATIVE_DIRECTIONS)), labels


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


def only_hole_rows(model, tokenizer) -> None:
    """From now on, train only the neighbour tables' rows of the hole symbol 'O' (a gradient mask on each table; the
    other rows stay as they are, zero after `with_neighbours`)."""
    embedding = model.get_input_embeddings()
    row = int(embedding.symbol[tokenizer.convert_tokens_to_ids("O")])
    assert row > 0, "'O' is a board cell symbol"
    for table in embedding.neighbour:
        mask = torch.zeros(table.weight.shape[0], 1)
        mask[row] = 1.0
        table.weight.register_hook(lambda grad, mask=mask: grad * mask)


def pretrain_cells(model, head: torch.nn.Linear, layer: int, boards, held_out, args: dict, pad_id: int) -> None:
    """`cells_steps` steps of the cell labels alone (32 boards a step, AdamW at `cells_lr`), training only what is
    below `layer` (`parameters_below`; with cells_params=neighbours or hole_rows only the neighbour tables) and the
    head: the text analogue of tiny_vl's vision pre-training, which trains the vision tower alone."""
    below = cell_parameters(model, layer, str(args["cells_params"]))
    optimizer = torch.optim.AdamW([*below, *head.parameters()], lr=float(args["cells_lr"]), weight_decay=0.01)
    rng, steps = np.random.default_rng(int(args["seed"]) + 1), int(args["cells_steps"])
    model.train()
    for step in range(1, steps + 1):
        loss = cells_loss(model, head, layer, [boards[i] for i in rng.integers(0, len(boards), 32)], pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(below, 1.0)
        optimizer.step()
        if step % 200 == 0 or step == steps:
            recall = hole_recall(model.eval(), head, layer, held_out, pad_id)
            model.train()
            print(f"cells step {step}: loss {loss.item():.4f}, held-out recall of hole neighbours {recall}", flush=True)


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
    boards = reading_boards(tokenizer, range(300_000, 304_000), rng)
    held_out = reading_boards(tokenizer, eval_seeds(200), np.random.default_rng(1))
    demos = []
    if args["mode"] == "mixed":
        formatter = DialogueFormatter(tokenizer)
        for name in ("sokoban_text", "frozenlake_text"):
            demos += demonstrations(functools.partial(make_text_game, name), formatter, range(2400), 0.25, 0, name)
    cells_coef, layer = float(args["cells_coef"]), int(args["cells_layer"])
    torch.manual_seed(int(args["seed"]))
    head = torch.nn.Linear(model.config.hidden_size, boards[0][2].shape[1] * len(RELATIVE_DIRECTIONS))
    pad = tokenizer.pad_token_id
    if args["cells_params"] == "hole_rows":
        only_hole_rows(model, tokenizer)
    if int(args["cells_steps"]):
        pretrain_cells(model, head, layer, boards, held_out, args, pad)
        if str(args["freeze_below"]).lower() == "true":  # as tiny_vl's SFT keeps the pre-trained vision tower fixed
            for parameter in parameters_below(model, layer):
                parameter.requires_grad_(False)
    parameters = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if cells_coef else [])
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, 10, 0.05) if demos else 1.0)
    if demos:
        rng = np.random.default_rng(int(args["seed"]))  # the dialogues' order and the reading draws
    order, coef = [], float(args["reading_coef"]) if demos else 1.0
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
        drawn = [boards[i] for i in rng.integers(0, len(boards), 32)]
        reading = board_reading_loss(model, tokenizer, [example for example, _, _ in drawn])
        if coef > 0:
            (coef * reading).backward()
        cells = torch.zeros(())
        if cells_coef > 0:
            cells = cells_loss(model, head, layer, drawn, pad)
            (cells_coef * cells).backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        if step % 500 == 0 or step == steps:
            readings = single_board_readings(model.eval(), tokenizer, held_out)
            model.train()
            print(f"step {step}: dialogue loss {dialogue:.4f}, reading loss {reading.item():.4f}, cell labels' "
                  f"loss {cells.item():.4f}, single-board "
                  f"readings exact {readings}, {time.time() - started:.0f} s", flush=True)  # fmt: skip
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
