"""Does tiny_text read boards when its cells carry their row and column, and when it first reads single boards?
(findings: docs/warm_starts.md, "Board positions and board reading")

    python research/text_board_sft.py [board=true] [reading_steps=500] [reading_turns=3] [steps=800] [lr=0.003]
                                      [eval_episodes=32] [threads=2] [out=DIR]

Builds tiny_text's untrained model with the grid tokenizer, as `BoardQwen2ForCausalLM` (`board=true`: every board
cell's embedding gets a learned row and column embedding, `vagen.models.board_lm`) or as the plain Qwen2 of recipe
version 1 (`board=false`); runs `reading_steps` of board reading (`vagen.bootstrap.tiny_text.pretrain_boards`: one
board -> the game's `<think>` text; with `reading_turns`, also boards after up to that many turns of noisy solver
play); then the warm start of `TINY_TEXT_RECIPE` with `steps` SFT steps at `lr` on sokoban_text + frozenlake_text.
Writes out/ as a model folder with its report.json (held-out success before and after SFT, greedy and at T=0.5) and
board_reading.json (the reading losses). `research/text_token_loss.py model=out` then says where the loss sits. With
the defaults this is the computation of the shipped tiny_text's build (`build_warm_tiny_text`), into out/.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from vagen.bootstrap.tiny import init_model, load_tiny_text_lm, tiny_text_config
from vagen.bootstrap.tiny_text import (
    SFT_MICRO_BATCH,
    TEXT_GAMES,
    TINY_TEXT_READING,
    TINY_TEXT_RECIPE,
    build_tiny_text,
    make_text_game,
    pretrain_boards,
)
from vagen.bootstrap.warmstart import warm_start
from vagen.cli import script_options

DEFAULTS = {
    "board": True,
    "reading_steps": TINY_TEXT_READING.steps,
    "reading_turns": TINY_TEXT_READING.turns,
    "steps": TINY_TEXT_RECIPE.steps,
    "lr": 3e-3,
    "eval_episodes": 32,
    "threads": 2,
    "out": "outputs/text_board_sft",
}


def main() -> None:
    options, _ = script_options(sys.argv[1:], DEFAULTS, overrides=False)
    torch.set_num_threads(int(options.threads))
    board, reading_steps = bool(options.board), int(options.reading_steps)
    turns = int(options.reading_turns)
    label = f"board{int(board)}_reading{reading_steps}_turns{turns}_steps{options.steps}_lr{options.lr:g}"
    out = Path(options.out) / label
    recipe = replace(TINY_TEXT_RECIPE, steps=int(options.steps), lr=float(options.lr))
    recipe = replace(recipe, eval_episodes=int(options.eval_episodes))
    model, tokenizer = load_tiny_text_lm(build_tiny_text(size=recipe.size, seed=recipe.base_seed))  # BoardQwen2
    if not board:
        plain = init_model(Qwen2ForCausalLM, tiny_text_config(tokenizer, recipe.size), recipe.base_seed)
        plain.generation_config, model = model.generation_config, plain
    reading = replace(TINY_TEXT_READING, steps=reading_steps, turns=turns)
    losses = pretrain_boards(model, tokenizer, reading) if reading_steps else []
    first, *others = TEXT_GAMES
    out.mkdir(parents=True, exist_ok=True)
    games = {name: (lambda name=name: make_text_game(name)) for name in others}
    report = warm_start(
        model, tokenizer, recipe, out, lambda: make_text_game(first), first, True, games,
        micro_batch_size=SFT_MICRO_BATCH,
    )  # fmt: skip
    (out / "board_reading.json").write_text(json.dumps({"steps": reading_steps, "turns": turns, "losses": losses}))
    blocks = {first: report, **report["other_games"]}
    for name, block in blocks.items():
        print(name, {key: block["eval"][key] for key in ("greedy", "temperature_0.5", "random")})
    print(f"model folder: {out}")


if __name__ == "__main__":
    main()
