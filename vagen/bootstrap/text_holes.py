"""frozenlake_text's default `tiny_text_holes`: the shipped tiny_text continued so that it reads the holes next to
the player, the text analogue of `tiny_vl_holes` (docs/learning.md, "Only the hole symbol's rows trained").

A causal LM cannot put what lies below or to the right of a board cell on that cell's token; the board model's
neighbour tables can (`with_neighbours`: each cell's embedding gets one of each neighbour's symbol, added at zero).
The build (`TextHolesRecipe`):

1. the cell labels alone (`pretrain_cells`): a throw-away linear head reads, from every FrozenLake board cell's
   hidden state after `cells_layer` layers, the labels that tiny_vl's vision pre-training gives each image tile (the
   directions of the player and the goal, and which of the four neighbours are holes); only the tables' rows of the
   hole symbol 'O' train (`only_hole_rows`, kept for the whole build), so a Sokoban board, which shares 'O' for its
   targets, changes only beside its targets;
2. `steps` SFT steps on both text games' solver demonstrations, each with the FrozenLake board-reading loss (one
   board -> its `<think>` text) and the cell labels' loss added (`sft_with_board_losses`).

Measured (2026-12-07, 1 thread): first-turn readings exact beside a hole 50/123 (tiny_text 21/123),
`frozenlake_text` 78.9% at T = 0.5 on 256 held-out episodes (tiny_text 72.7%), `sokoban_text` within the range of
plain continuations of tiny_text. Like tiny_text it ships with its report and the stamp of its recipe and base, and is
rebuilt into the cache (with progress bars, about 20 minutes on 2 CPU cores) when either changes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from vagen.bootstrap.demos import Demo, demonstrations, sft_batch
from vagen.bootstrap.tiny import load_tiny_text_lm
from vagen.bootstrap.tiny_text import (
    SFT_MICRO_BATCH,
    TEXT_GAMES,
    board_example,
    board_reading_loss,
    build_warm_tiny_text,
    make_text_game,
    noisy_play,
)
from vagen.bootstrap.warmstart import (
    SHIPPED_DIR,
    backward_sft_batch,
    evaluate_all,
    loss_summary,
    lr_factor,
    probe_labels,
)
from vagen.env.policies import RELATIVE_DIRECTIONS
from vagen.models.board_lm import with_neighbours
from vagen.models.cache import build_once, cache_root, read_stamp, sha256_file
from vagen.rollout import DialogueFormatter

TEXT_HOLES_VERSION = 1  # bump when anything below changes what a build produces
TEXT_HOLES_FOLDER = SHIPPED_DIR / "tiny-text-holes"
Board = tuple[tuple[list[int], int], str, np.ndarray]  # ((ids, prompt length), the true reading, the cell labels)


@dataclass(frozen=True)
class TextHolesRecipe:
    """Everything that decides what `tiny_text_holes` is, beside its base (all of it goes into the stamp)."""

    boards: int = 4000  # FrozenLake boards (levels 300,000 + k, after 0-3 noisy solver turns): labels and readings
    cells_steps: int = 1000  # steps of the cell labels alone (32 boards each), training only the tables' hole rows
    cells_lr: float = 3e-3
    cells_layer: int = 4  # the labels are read from each cell's hidden state after this many layers
    steps: int = 300  # SFT steps, each on 16 of both text games' demonstrations and 32 boards (`sft_with_board_losses`)
    lr: float = 5e-4
    reading_coef: float = 1.0  # weight of the board-reading loss in every SFT step
    cells_coef: float = 1.0  # weight of the cell labels' loss in every SFT step
    train_episodes: int = 2400  # demonstration episodes per game (seeds 0..train_episodes-1), noise as tiny_text's
    noise_eps: float = 0.25
    seed: int = 0  # the head's initialisation, the label steps' and the SFT's draws
    eval_episodes: int = 256  # the report's held-out episodes per game (the evaluator's seeds), greedy and at T
    eval_temperature: float = 0.5
    max_new_tokens: int = 48


TEXT_HOLES_RECIPE = TextHolesRecipe()


# ---- the cell labels ---------------------------------------------------------------------------
def hole_boards(tokenizer: PreTrainedTokenizerFast, levels, rng: np.random.Generator) -> list[Board]:
    """FrozenLake boards of `levels`, each after 0-3 turns of noisy solver play: their board-reading example
    (`board_example`), the true reading, and the cell labels that the vision pre-training gives an image of the board
    (`probe_labels` with `hole_labels`): (H·W, 2 + 4), row-major, the player's and the goal's direction from each cell,
    then its hole neighbours up / down / left / right."""
    env, boards = make_text_game("frozenlake_text", hole_labels=True), []
    for level in levels:
        observation = noisy_play(env, level, 3, rng)
        game = env.unwrapped
        shape, facts = game.grid().shape, game.tile_facts()
        width = len(game.key_cells()) + facts.shape[1]
        labels = probe_labels(shape, game.key_cells(), (0, width), width, facts)
        boards.append((board_example(tokenizer, env, observation.text), game.demo_reasoning().strip(), labels))
    env.close()
    return boards


def cells_head(model: torch.nn.Module, boards: list[Board]) -> torch.nn.Linear:
    """The throw-away linear head that reads a cell's labels (one class per relative direction, per label column)."""
    return torch.nn.Linear(model.config.hidden_size, boards[0][2].shape[1] * len(RELATIVE_DIRECTIONS))


def cell_logits(
    model: torch.nn.Module, head: torch.nn.Linear, layer: int, batch: list[Board], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`head`'s logits for every cell of `batch`'s boards (their prompts only), (cells, columns, classes), read from
    the RMS-normalised hidden states after `layer` layers, and the labels (cells, columns)."""
    prompts = [ids[:prompt] for (ids, prompt), _, _ in batch]
    ids = torch.full((len(prompts), max(map(len, prompts))), pad_id)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt)
    hidden = model(ids, output_hidden_states=True).hidden_states[layer]
    rows, _ = model.get_input_embeddings().positions(ids)
    cells = hidden[rows > 0]  # (Σ H·W, D): every board's cells, row-major, boards in order
    cells = cells * torch.rsqrt(cells.square().mean(-1, keepdim=True) + 1e-6)  # as the next layer reads them
    labels = torch.as_tensor(np.concatenate([labels for _, _, labels in batch]))
    assert cells.shape[0] == labels.shape[0], "one hidden state per board cell"
    return head(cells).view(*labels.shape, len(RELATIVE_DIRECTIONS)), labels


def cells_loss(model: torch.nn.Module, head: torch.nn.Linear, layer: int, batch: list[Board], pad_id: int):
    """Cross-entropy of `head` reading every cell's labels of `batch`'s boards (`cell_logits`)."""
    logits, labels = cell_logits(model, head, layer, batch, pad_id)
    return torch.nn.functional.cross_entropy(logits.view(-1, len(RELATIVE_DIRECTIONS)), labels.view(-1))


def only_hole_rows(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> None:
    """From now on, train only the neighbour tables' rows of the hole symbol 'O' (a gradient mask on each table; the
    other rows stay as they are, zero after `with_neighbours`)."""
    embedding = model.get_input_embeddings()
    row = int(embedding.symbol[tokenizer.convert_tokens_to_ids("O")])
    assert row > 0, "'O' is a board cell symbol"
    for table in embedding.neighbour:
        mask = torch.zeros(table.weight.shape[0], 1)
        mask[row] = 1.0
        table.weight.register_hook(lambda grad, mask=mask: grad * mask)


def pretrain_cells(
    model: torch.nn.Module,
    head: torch.nn.Linear,
    layer: int,
    boards: list[Board],
    parameters: list[torch.nn.Parameter],
    steps: int,
    lr: float,
    rng: np.random.Generator,
    pad_id: int,
    on_step: Callable[[int, float], None] | None = None,
) -> None:
    """`steps` steps of the cell labels alone (32 boards a step drawn from `rng`, AdamW at `lr`), training only
    `parameters` (gradient norm clipped to 1) and the head: the text analogue of tiny_vl's vision pre-training, which
    trains the vision tower alone. `on_step(step, loss)` after each step."""
    optimizer = torch.optim.AdamW([*parameters, *head.parameters()], lr=lr, weight_decay=0.01)
    model.train()
    for step in range(1, steps + 1):
        loss = cells_loss(model, head, layer, [boards[i] for i in rng.integers(0, len(boards), 32)], pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        if on_step is not None:
            on_step(step, loss.item())


# ---- SFT with the board losses -----------------------------------------------------------------
def sft_with_board_losses(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    demos: list[Demo],
    boards: list[Board],
    head: torch.nn.Linear,
    layer: int,
    steps: int,
    lr: float,
    reading_coef: float,
    cells_coef: float,
    rng: np.random.Generator,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[float]:
    """`steps` AdamW steps (at `lr`, weight decay 0.01, gradient norm clipped to 1), each on 16 of `demos`
    (shuffled by `rng`; none: the board losses alone, at a constant `lr`, with the reading at weight 1) and 32 of
    `boards` (drawn by `rng`): `reading_coef` times the board-reading loss, plus `cells_coef` times the cell labels'
    loss (training the head too). With demos, the learning rate warms up over 10 steps and decays to 5% (cosine).
    Trains every parameter that requires grad; `on_step(step, losses)` after each step. Returns the dialogue losses."""
    parameters = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if cells_coef else [])
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, 10, 0.05) if demos else 1.0)
    order, coef, losses, pad = [], reading_coef if demos else 1.0, [], tokenizer.pad_token_id
    model.train()
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        dialogue = 0.0
        if demos:
            if len(order) < 16:
                order += rng.permutation(len(demos)).tolist()
            rows, order = order[:16], order[16:]
            dialogue = backward_sft_batch(model, sft_batch([demos[i] for i in rows], pad), tokenizer, SFT_MICRO_BATCH,
                                          False)  # fmt: skip
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
        losses.append(dialogue)
        if on_step is not None:
            on_step(step, {"dialogue": dialogue, "reading": reading.item(), "cells": cells.item()})
    model.eval()
    return losses


# ---- the build ---------------------------------------------------------------------------------
def train_tiny_text_holes(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, folder: Path, recipe: TextHolesRecipe
) -> dict[str, Any]:
    """`recipe` on `model` (a trained tiny_text), saved into `folder` with its report.json: the held-out evaluation
    of both text games before and after, each loss's summary, and the seconds until the model was trained ("train",
    the evaluation before included) and in all."""
    started = time.perf_counter()
    games = {name: (lambda name=name: make_text_game(name)) for name in TEXT_GAMES}
    before = {name: evaluate_all(model, tokenizer, recipe, game, name, scripted=False) for name, game in games.items()}
    model = with_neighbours(model)
    boards = hole_boards(tokenizer, range(300_000, 300_000 + recipe.boards), np.random.default_rng(0))
    formatter = DialogueFormatter(tokenizer)
    episodes, demos = range(recipe.train_episodes), []
    for name, game in games.items():  # the demonstrations' noise draws are seeded 0, as tiny_text's
        demos += demonstrations(game, formatter, episodes, recipe.noise_eps, 0, name)
    torch.manual_seed(recipe.seed)
    head = cells_head(model, boards)
    only_hole_rows(model, tokenizer)
    bar = tqdm(total=recipe.cells_steps + recipe.steps, desc="tiny_text_holes (once)", unit="step")
    cell_losses: list[float] = []

    def on_cells_step(step: int, loss: float) -> None:
        cell_losses.append(loss)
        bar.update(1)
        bar.set_postfix(cells=f"{loss:.3f}", refresh=False)

    tables = list(model.get_input_embeddings().neighbour.parameters())
    pretrain_cells(model, head, recipe.cells_layer, boards, tables, recipe.cells_steps, recipe.cells_lr,
                   np.random.default_rng(recipe.seed + 1), tokenizer.pad_token_id, on_cells_step)  # fmt: skip
    board_losses: dict[str, list[float]] = {"reading": [], "cells": []}

    def on_sft_step(step: int, losses: dict[str, float]) -> None:
        for key in board_losses:
            board_losses[key].append(losses[key])
        bar.update(1)
        bar.set_postfix(dialogue=f"{losses['dialogue']:.3f}", reading=f"{losses['reading']:.3f}", refresh=False)

    dialogue_losses = sft_with_board_losses(
        model, tokenizer, demos, boards, head, recipe.cells_layer, recipe.steps, recipe.lr, recipe.reading_coef,
        recipe.cells_coef, np.random.default_rng(recipe.seed), on_sft_step,
    )  # fmt: skip
    bar.close()
    trained = time.perf_counter()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    after = {name: evaluate_all(model, tokenizer, recipe, game, name, scripted=False) for name, game in games.items()}
    summary = {"cells": cell_losses, "dialogue": dialogue_losses, **board_losses}
    report = {
        "recipe": asdict(recipe),
        "games": {name: {"eval_before": before[name], "eval": after[name]} for name in games},
        "loss": {name: loss_summary(losses) for name, losses in summary.items() if losses},
        "seconds": {"train": trained - started, "total": time.perf_counter() - started},
    }
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    return report


def tiny_text_holes_stamp(recipe: TextHolesRecipe, base: Path) -> dict[str, Any]:
    """What decides the build: the recipe, this module's version and the base tiny_text (its folder's stamp and the
    sha256 of its weights, so a rebuilt tiny_text shows)."""
    return {
        "model": "tiny-text-holes",
        "version": TEXT_HOLES_VERSION,
        "recipe": asdict(recipe),
        "base": {"stamp": read_stamp(base), "model.safetensors sha256": sha256_file(base / "model.safetensors")},
    }


def build_tiny_text_holes(
    cache_dir: str | Path | None = None, recipe: TextHolesRecipe | None = None, base: Path | None = None
) -> Path:
    """The folder of `tiny_text_holes`: the shipped build while its stamp is `recipe` on `base` (default: the text
    default's folder, `build_warm_tiny_text`), else built once into the cache."""
    recipe = recipe or TEXT_HOLES_RECIPE
    base = base or build_warm_tiny_text(cache_dir)
    stamp = tiny_text_holes_stamp(recipe, base)
    if read_stamp(TEXT_HOLES_FOLDER) == stamp:
        return TEXT_HOLES_FOLDER

    def build(folder: Path) -> None:
        train_tiny_text_holes(*load_tiny_text_lm(base), folder, recipe)

    return build_once(Path(cache_dir or cache_root()) / TEXT_HOLES_FOLDER.name, stamp, build)
