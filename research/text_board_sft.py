"""Does tiny_text read boards when its cells carry their row and column, and when it first reads single boards?
(findings: docs/warm_starts.md, "Board positions and board reading")

    python research/text_board_sft.py [board=true] [reading_steps=500] [reading_turns=3] [steps=800] [lr=0.003]
                                      [more_steps=1200] [eval_episodes=32] [threads=2] [out=DIR]

Builds tiny_text's untrained model with the grid tokenizer, as `BoardQwen2ForCausalLM` (`board=true`: every board
cell's embedding gets a learned row and column embedding, `vagen.models.board_lm`) or as the plain Qwen2 of recipe
version 1 (`board=false`); runs `reading_steps` of board reading (`vagen.bootstrap.tiny_text.pretrain_boards`: one
board -> the game's `<think>` text; with `reading_turns`, also boards after up to that many turns of noisy solver
play); then the warm start of `TINY_TEXT_RECIPE` with `steps` SFT steps at `lr` on sokoban_text + frozenlake_text,
and `TINY_TEXT_CONTINUATION` with `more_steps` (0: no second pass). Writes out/ as a model folder with its report.json
(held-out success before and after SFT, greedy and at T=0.5, and the board reading's loss; `train_warm_tiny_text`).
`research/text_token_loss.py model=out` then says where the loss sits. With the defaults this is the computation of
the shipped tiny_text's build (`build_warm_tiny_text`), into out/.
"""

import sys
from dataclasses import replace
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from vagen.bootstrap.tiny import init_model, load_tiny_text_lm, tiny_text_config
from vagen.bootstrap.tiny_text import (
    TINY_TEXT_CONTINUATION,
    TINY_TEXT_READING,
    TINY_TEXT_RECIPE,
    build_tiny_text,
    train_warm_tiny_text,
)
from vagen.cli import script_options

DEFAULTS = {
    "board": True,
    "reading_steps": TINY_TEXT_READING.steps,
    "reading_turns": TINY_TEXT_READING.turns,
    "steps": TINY_TEXT_RECIPE.steps,
    "lr": 3e-3,
    "more_steps": TINY_TEXT_CONTINUATION.steps,
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
    label += f"_more{options.more_steps}" if int(options.more_steps) else ""
    out = Path(options.out) / label
    recipe = replace(TINY_TEXT_RECIPE, steps=int(options.steps), lr=float(options.lr))
    recipe = replace(recipe, eval_episodes=int(options.eval_episodes))
    more = int(options.more_steps)
    continuation = replace(TINY_TEXT_CONTINUATION, steps=more, eval_episodes=recipe.eval_episodes) if more else None
    model, tokenizer = load_tiny_text_lm(build_tiny_text(size=recipe.size, seed=recipe.base_seed))  # BoardQwen2
    if not board:
        plain = init_model(Qwen2ForCausalLM, tiny_text_config(tokenizer, recipe.size), recipe.base_seed)
        plain.generation_config, model = model.generation_config, plain
    reading = replace(TINY_TEXT_READING, steps=reading_steps, turns=turns)
    out.mkdir(parents=True, exist_ok=True)
    report = train_warm_tiny_text(model, tokenizer, out, recipe, reading, continuation)
    for name, block in {report["env"]: report, **report["other_games"]}.items():
        print(name, {key: block["eval"][key] for key in ("greedy", "temperature_0.5", "random")})
    print(f"model folder: {out}")


if __name__ == "__main__":
    main()
