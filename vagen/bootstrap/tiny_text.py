"""The text default `tiny_text`: the language half of tiny_vl (a tiny Qwen2 causal LM, ~3.4M parameters) with a
tokenizer that keeps every grid cell one token, warm-started by SFT on solver demonstrations of sokoban_text and
frozenlake_text (`warm_start`, the recipe machinery of tiny_vl).

Why its own tokenizer: tiny_vl's BPE was trained on the games' texts as they come, so it merges runs of grid
symbols ('___', '####', 'PO'): the same board row becomes different token sequences depending on its neighbours,
and a cell's column is no longer its token offset within the row. Here a pre-tokenizer isolates every grid symbol
(`GRID_CELL_PATTERN`) before BPE, so a 6×6 Sokoban board is 36 cell tokens plus 5 newlines, row r column c always
sits r·7 + c tokens after the board's first cell, and the relative directions the `<think>` text names are fixed
token offsets that rotary attention can read. The special and chat tokens are tiny_vl's (same ids 0..6, same chat
template), so the rollout, context building and generation suppression work unchanged.

Its cells also carry their 2-D position: the base is `BoardQwen2ForCausalLM` (`vagen.models.board_lm`), whose board
cells get a learned row and column embedding, and the build first trains it to read single boards (`BoardReading`,
the text analogue of tiny_vl's vision pre-training) before the SFT. Why: docs/warm_starts.md, "Board positions and
board reading".

Like tiny_vl, a finished build ships with the package (`SHIPPED_DIR/warm-tiny-text-default-seed0`: weights,
tokenizer, report.json, and the stamp of the recipe that built it); it is used while the recipe is unchanged and
rebuilt into the cache (with a progress bar) when it is not.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from vagen.bootstrap.demos import demo_response, turn_actions
from vagen.bootstrap.tiny import (
    _generation_config,
    _size,
    corpus_digest,
    init_model,
    load_tiny_text_lm,
    tiny_corpus,
    tiny_text_config,
    train_tiny_tokenizer,
)
from vagen.bootstrap.warmstart import SHIPPED_DIR, WarmStartRecipe, loss_summary, warm_start
from vagen.env import make_env
from vagen.models.board_lm import BoardQwen2ForCausalLM, board_config
from vagen.models.cache import build_once, cache_root, read_stamp

# Bump when anything below changes what a build produces (tokenizer, corpus, games), so caches rebuild.
# 2: a BoardQwen2ForCausalLM base that reads boards before the SFT; 3: later turns' boards too; 4: a second SFT pass
TINY_TEXT_VERSION = 4
# Every grid symbol of the text games is its own pre-token: walls, floor/ice, the box-on-target/on-goal mark, the
# navigation/sudoku '.', and an upper-case letter not starting a word (P player, O target/hole, X box, S, G goal).
# Words ("Left", "Sokoban") keep their capital, so only cells and one-letter names are split.
GRID_CELL_PATTERN = r"[#_√.]|[A-Z](?![a-z])"
# The games of the text default, exactly configs/env/sokoban_text.yaml and configs/env/frozenlake_text.yaml (a test
# compares them), in the order the recipe trains them: the report's "eval" is the first, "other_games" the rest.
SOKOBAN_TEXT = {
    "observation": "text",
    "dim_room": [6, 6],
    "num_boxes": 1,
    "cell_separator": "",
    "list_positions": False,
    "max_steps": 100,
    "max_turns": 5,
    "max_actions_per_turn": 3,
    "response_format": "free_think",
    "grounding_coef": 0.0,
    "worldmodel_coef": 0.0,
    "action_separator": "||",
    "format_penalty": -1.0,
    "distance_shaping": 0.0,
    "step_penalty": -0.1,
}
FROZENLAKE_TEXT = {
    "observation": "text",
    "size": 4,
    "p_frozen": 0.8,
    "desc": None,
    "cell_separator": "",
    "success_rate": 1.0,
    "max_steps": 100,
    "max_turns": 5,
    "max_actions_per_turn": 3,
    "response_format": "free_think",
    "grounding_coef": 0.0,
    "worldmodel_coef": 0.0,
    "action_separator": "||",
    "format_penalty": -0.1,
}
TEXT_GAMES = {
    "sokoban_text": ("vagen/Sokoban-v0", SOKOBAN_TEXT),
    "frozenlake_text": ("vagen/FrozenLake-v0", FROZENLAKE_TEXT),
}
DEMO_CORPUS_SEEDS = 32  # solver episodes per text game whose think/answer texts join the tokenizer's corpus


def make_text_game(name: str, **overrides: Any):
    """The env of `TEXT_GAMES[name]` (configs/env/<name>.yaml)."""
    env_id, kwargs = TEXT_GAMES[name]
    return make_env(env_id, **{**kwargs, **overrides})


def demo_corpus(seeds: int = DEMO_CORPUS_SEEDS) -> list[str]:
    """Observations and solver demo responses of the text games (seeds far from the training and held-out ones), so
    the BPE spends its merges on the words a warm-started policy writes ("box is up-left of me")."""
    texts = []
    for name in TEXT_GAMES:
        env = make_text_game(name)
        for seed in range(900_000, 900_000 + seeds):
            observation, _ = env.reset(seed=seed)
            texts.append(observation.text)
            for _ in range(env.unwrapped.max_turns):
                plan = list(env.unwrapped.solver_actions())
                if not plan:
                    break
                response = demo_response(env, plan[: env.unwrapped.max_actions_per_turn])
                observation, _, terminated, truncated, _ = env.step(response)
                texts += [response, observation.text]
                if terminated or truncated:
                    break
        env.close()
    return texts


def grid_corpus() -> list[str]:
    """The grid tokenizer's corpus: tiny_vl's (`tiny_corpus`) plus the text games' solver play."""
    return tiny_corpus() + demo_corpus()


def train_grid_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """tiny_vl's byte-level BPE (same special tokens and chat template) with every grid cell a token of its own."""
    return train_tiny_tokenizer(corpus, isolate=GRID_CELL_PATTERN)


def build_tiny_text(cache_dir: str | Path | None = None, size: str = "default", seed: int = 0) -> Path:
    """The folder of the untrained tiny BoardQwen2 LM with the grid tokenizer (the base of `tiny_text`), built once."""
    _size(size)
    corpus = grid_corpus()
    target = Path(cache_dir or cache_root()) / f"tiny-text-grid-{size}-seed{seed}"
    stamp = {
        "model": "tiny-text-grid",
        "size": size,
        "seed": seed,
        "version": TINY_TEXT_VERSION,
        "isolate": GRID_CELL_PATTERN,
        "corpus_sha256": corpus_digest(corpus),
    }

    def build(folder: Path) -> None:
        tokenizer = train_grid_tokenizer(corpus)
        config = board_config(tiny_text_config(tokenizer, size), tokenizer, GRID_CELL_PATTERN)
        model = init_model(BoardQwen2ForCausalLM, config, seed)
        model.generation_config = _generation_config(tokenizer)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return build_once(target, stamp, build)


@dataclass(frozen=True)
class BoardReading:
    """The text analogue of tiny_vl's vision pre-training, before SFT: one board alone (the grid, as a user message)
    -> the game's demonstration `<think>` text, on boards of both text games (seeds 300,000 + k: neither
    demonstration, held-out nor corpus levels), each read after 0..`turns` turns of the demonstrations' noisy solver
    play, so later turns' boards (the player next to a pushed box) are read too. Short sequences, so the model learns
    to find the player and the box on a board before it must do so in five-turn dialogues (docs/warm_starts.md,
    "Board positions and board reading")."""

    steps: int = 500
    batch_size: int = 32
    lr: float = 1e-3
    boards: int = 4000  # per game
    seed: int = 0
    turns: int = 3  # 0: the levels' first boards only (recipe 2)


def board_examples(
    tokenizer: PreTrainedTokenizerFast, boards: int, turns: int = 0, seed: int = 0
) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) of `boards` single-board examples per text game, each level played 0..`turns` turns
    by the noisy solver (random moves with probability 0.25) before its board is read; a level solved or lost on the
    way is read at its first board."""
    rng, examples = np.random.default_rng(seed), []
    for name in TEXT_GAMES:
        env = make_text_game(name)
        for level in range(300_000, 300_000 + boards):
            observation = noisy_play(env, level, turns, rng)
            examples.append(board_example(tokenizer, env, observation.text))
        env.close()
    return examples


def noisy_play(env, level: int, turns: int, rng: np.random.Generator):
    """`env` reset to `level` and played 0..`turns` turns (drawn from `rng`) by the noisy solver (random moves with
    probability 0.25); the observation reached, or the first one when the level ends on the way."""
    observation, _ = env.reset(seed=level)
    for _ in range(int(rng.integers(0, turns + 1))):
        choice = turn_actions(env, rng, noise_eps=0.25)
        if choice is None:
            break
        after, _, terminated, truncated, _ = env.step(demo_response(env, choice[0]))
        if terminated or truncated:
            observation, _ = env.reset(seed=level)
            break
        observation = after
    return observation


def board_of(observation_text: str) -> str:
    """The grid of a text game's observation (the text after "Current state:", up to a blank line)."""
    return observation_text.split("Current state:\n")[1].split("\n\n")[0]


def board_example(tokenizer: PreTrainedTokenizerFast, env, observation_text: str) -> tuple[list[int], int]:
    """(token ids, prompt length) of one board-reading example: `env`'s board now -> its demonstration think text."""
    prompt = tokenizer(f"<|im_start|>user\n{board_of(observation_text)}<|im_end|>\n<|im_start|>assistant\n")
    answer = tokenizer(f"<think>{env.unwrapped.demo_reasoning()}</think><|im_end|>")["input_ids"]
    return prompt["input_ids"] + answer, len(prompt["input_ids"])


def board_reading_loss(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, batch: list[tuple[list[int], int]]
) -> torch.Tensor:
    """Mean cross-entropy of the `<think>` tokens of `board_example`s (ids, prompt length), right-padded together."""
    ids = torch.full((len(batch), max(len(e) for e, _ in batch)), tokenizer.pad_token_id)
    mask = torch.zeros(ids.shape)
    for row, (example, prompt) in enumerate(batch):
        ids[row, : len(example)] = torch.tensor(example)
        mask[row, prompt : len(example)] = 1
    logits = model(ids).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return -(logprobs * mask[:, 1:]).sum() / mask[:, 1:].sum()


def pretrain_boards(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, reading: BoardReading) -> list[float]:
    """Train `model` to write each board's `<think>` text (`BoardReading`); the per-step losses."""
    examples = board_examples(tokenizer, reading.boards, reading.turns, reading.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=reading.lr, weight_decay=0.01)
    rng, losses = np.random.default_rng(reading.seed), []
    model.train()
    for _ in tqdm(range(reading.steps), desc="board reading (once)", unit="step"):
        loss = board_reading_loss(
            model, tokenizer, [examples[i] for i in rng.integers(0, len(examples), reading.batch_size)]
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


# The shipped recipe: tiny_vl's `WarmStartRecipe` where text differs: no vision tower (board reading instead,
# `TINY_TEXT_READING`), float32 (the 2-core AVX2 CPU it was built on emulates bf16), and 800 SFT steps of 16 dialogues,
# 32 report episodes per pass; then `TINY_TEXT_CONTINUATION`, 1,200 more steps on the same demonstrations at a sixth of
# the learning rate (recipe 4: sokoban_text 34.8% -> 66.0% on 256 held-out episodes, docs/warm_starts.md).
TINY_TEXT_RECIPE = WarmStartRecipe(steps=800, warmup_steps=5, bf16=False, vision_steps=0, eval_episodes=32)
TINY_TEXT_CONTINUATION = replace(TINY_TEXT_RECIPE, steps=1200, lr=5e-4, warmup_steps=10)
TINY_TEXT_READING = BoardReading()
SFT_MICRO_BATCH = 8  # dialogues per forward/backward: length-sorted halves pad less (memory and speed, same gradient)


def tiny_text_stamp(
    recipe: WarmStartRecipe, reading: BoardReading, base: Path, continuation: WarmStartRecipe | None
) -> dict[str, Any]:
    """What decides the warm-started model: the recipe, the board reading, the continuation (None: none), this
    module's version, the games' configs and the base."""
    games = {name: {"id": env_id, "kwargs": kwargs} for name, (env_id, kwargs) in TEXT_GAMES.items()}
    return {
        "model": "warm-tiny-text",
        "version": TINY_TEXT_VERSION,
        "recipe": asdict(recipe),
        "board_reading": asdict(reading),
        "continuation": asdict(continuation) if continuation else None,
        "games": games,
        "base": read_stamp(base),
    }


def train_warm_tiny_text(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    folder: Path,
    recipe: WarmStartRecipe,
    reading: BoardReading,
    continuation: WarmStartRecipe | None,
) -> dict[str, Any]:
    """tiny_text's build on `model`, saved into `folder`: board reading (if `reading.steps`), SFT by `recipe`, then
    SFT by `continuation` (if any) on the same games. Its report.json is the last pass's `warm_start` report, with
    "eval_before" (the untrained model), "first_pass" (the first SFT pass's recipe, loss, time and evaluation, when
    there is a continuation) and "board_reading" (the setting and its loss)."""
    reading_losses = pretrain_boards(model, tokenizer, reading) if reading.steps else []
    first, *others = TEXT_GAMES
    games = {name: (lambda name=name: make_text_game(name)) for name in others}

    def sft(pass_recipe: WarmStartRecipe, evaluate_before: bool) -> dict[str, Any]:
        return warm_start(
            model, tokenizer, pass_recipe, folder, lambda: make_text_game(first), first, evaluate_before, games,
            micro_batch_size=SFT_MICRO_BATCH,
        )  # fmt: skip

    report = sft(recipe, True)
    if continuation is not None:
        first_pass, report = report, sft(continuation, False)
        report["eval_before"] = first_pass.pop("eval_before")
        for name, block in report["other_games"].items():
            block["eval_before"] = first_pass["other_games"][name].pop("eval_before")
        report["first_pass"] = first_pass
    report["board_reading"] = {**asdict(reading), "loss": loss_summary(reading_losses) if reading_losses else None}
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    return report


def build_warm_tiny_text(
    cache_dir: str | Path | None = None,
    recipe: WarmStartRecipe | None = None,
    reading: BoardReading | None = None,
    continuation: WarmStartRecipe | None = TINY_TEXT_CONTINUATION,
) -> Path:
    """Return the folder of the warm-started tiny text model (sokoban_text and frozenlake_text): the shipped build
    while its stamp is this recipe's, else built once into the cache (board reading, then two SFT passes: 60–100
    minutes on a 2-core CPU, with progress bars). `continuation=None` builds without the second pass."""
    recipe, reading = recipe or TINY_TEXT_RECIPE, reading or TINY_TEXT_READING
    root = Path(cache_dir or cache_root())
    base = build_tiny_text(root, size=recipe.size, seed=recipe.base_seed)
    stamp = tiny_text_stamp(recipe, reading, base, continuation)
    target = root / f"warm-tiny-text-{recipe.size}-seed{recipe.base_seed}"
    shipped = SHIPPED_DIR / target.name
    if read_stamp(shipped) == stamp:
        return shipped

    def build(folder: Path) -> None:
        train_warm_tiny_text(*load_tiny_text_lm(base), folder, recipe, reading, continuation)

    return build_once(target, stamp, build)


def cell_tokens(tokenizer: PreTrainedTokenizerFast, grid: str) -> list[str]:
    """The tokens of a text board: with the grid tokenizer, one per cell and one per newline."""
    return tokenizer.convert_ids_to_tokens(tokenizer(grid, add_special_tokens=False)["input_ids"])
