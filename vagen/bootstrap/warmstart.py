"""Supervised warm starts: fine-tune a model on any game's solver demonstrations before RL (`scripts/sft.py`).

An untrained model never writes a well-formed answer, so RL from it has no signal. This module trains a
model on noisy solver demonstrations (`vagen.bootstrap.demos`) with exactly the context layout the rollout
uses, evaluates it on held-out seeds before and after, and saves a model folder with a `report.json`.
The visual default `tiny_vl` is one use of it (`build_warm_tiny_vl`: the tiny Qwen2.5-VL on sokoban_visual and
frozenlake_visual), cached by recipe and shipped with the package.

Why the vision tower is pre-trained first (`pretrain_vision`) and then frozen: trained end to end,
it gets ~100x smaller gradients than the text layers, and the model learns the format but ignores
the image (version 1 of this recipe played no better than random). The pre-training labels are the
directions, from every image tile, of the cells the game's `key_cells()` names (player, box, target).

The result is cached with `build_once`, keyed by the recipe and the base model's stamp.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from vagen.algos.losses import aggregation_share
from vagen.bootstrap.demos import Demo, demonstrations, sft_batch
from vagen.bootstrap.tiny import build_tiny_vl, load_tiny_vl
from vagen.engines.hf import HFEngine
from vagen.env import make_env
from vagen.env.policies import RELATIVE_DIRECTIONS, relative_direction
from vagen.forward import policy_forward
from vagen.models.cache import build_once, cache_root, read_stamp
from vagen.models.precision import emulated_bf16_warning
from vagen.models.processor import save_processor
from vagen.rollout import DialogueFormatter
from vagen.rollout.batch import TokenBatch
from vagen.rollout.chat import play_chat_episodes, policy_responder
from vagen.rollout.validation import episode_metrics, eval_seeds, validation_episodes

# Bump when anything below changes what a build produces (think text, masking, evaluation), so caches rebuild.
WARMSTART_VERSION = 3  # 3: tiny_vl is warm-started on FrozenLake as well as Sokoban
SOKOBAN_VISUAL = {
    "observation": "image",
    "dim_room": (6, 6),
    "num_boxes": 1,
    "max_steps": 100,
    "tile_px": 28,
    "max_turns": 5,
    "max_actions_per_turn": 3,
    "response_format": "free_think",
}
FROZENLAKE_VISUAL = {  # configs/env/frozenlake_visual.yaml
    "observation": "image",
    "size": 4,
    "p_frozen": 0.8,
    "success_rate": 1.0,
    "max_steps": 100,
    "tile_px": 28,
    "max_turns": 5,
    "max_actions_per_turn": 3,
    "response_format": "free_think",
}
# Finished builds committed with the package (weights, processor, report.json and the stamp of the recipe that
# built them), so first contact skips the ~25-minute build; used only while the recipe is unchanged.
# The tiny_vl recipe's games: configs/env/sokoban_visual.yaml, then configs/env/frozenlake_visual.yaml.
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"


@dataclass(frozen=True)
class WarmStartRecipe:
    """Everything that decides what the warm-started model is (all of it goes into the cache stamp)."""

    size: str = "default"  # tiny model size (`vagen.bootstrap.tiny.TINY_SIZES`)
    base_seed: int = 0  # seed of the untrained base model's weights
    train_episodes: int = 2400  # demonstration episodes per game (seeds 0..train_episodes-1)
    noise_eps: float = 0.25  # probability that a demo turn plays random actions instead of the solver's
    imitate_noise: bool = False  # train on the noisy turns too (default: they are context only, masked from the loss)
    steps: int = 480  # optimizer steps (over the demos of every game)
    batch_size: int = 16  # dialogues per step
    lr: float = 3e-3  # peak AdamW learning rate
    warmup_steps: int = 10  # linear warm-up, then cosine decay to lr_floor·lr
    lr_floor: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0  # data order, noise and dropout
    bf16: bool = True  # bf16 autocast for the training forward passes (fast on GPUs and AVX512-BF16/AMX CPUs only)
    vision_steps: int = 400  # image-only pre-training steps of the vision tower (`pretrain_vision`)
    vision_batch_size: int = 64  # images per vision pre-training step
    vision_lr: float = 3e-3
    vision_lr_scale: float = 0.0  # vision tower's SFT learning rate relative to `lr` (0: frozen after pre-training)
    eval_episodes: int = 128  # the report's held-out episodes: the evaluator's seeds 1e9 + k (`eval_seeds`)
    eval_temperature: float = 0.5
    max_new_tokens: int = 48


# ---- demonstrations ----------------------------------------------------------------------------
def make_sokoban_visual(**overrides: Any):
    """The sokoban_visual env of configs/env/sokoban_visual.yaml (6×6, 1 box, 28-px tiles, 5 turns × 3 actions)."""
    return make_env("vagen/Sokoban-v0", **{**SOKOBAN_VISUAL, **overrides})


def make_frozenlake_visual(**overrides: Any):
    """The frozenlake_visual env of configs/env/frozenlake_visual.yaml (random 4×4 maps, not slippery)."""
    return make_env("vagen/FrozenLake-v0", **{**FROZENLAKE_VISUAL, **overrides})


# ---- vision pre-training -----------------------------------------------------------------------
def tile_direction_labels(shape: tuple[int, int], key_cells: list[tuple[int, int]]) -> np.ndarray:
    """For every tile of an (H, W) board (row-major), the `RELATIVE_DIRECTIONS` index of each key cell seen from it.

    Returns (H·W, K) int64 for K key cells (the game's `key_cells()`, e.g. player, box, target).
    """
    tiles = np.argwhere(np.ones(shape, dtype=bool))  # (H·W, 2) row-major, as the merged image tokens
    labels = np.zeros((len(tiles), len(key_cells)), dtype=np.int64)
    for column, cell in enumerate(key_cells):
        labels[:, column] = [RELATIVE_DIRECTIONS.index(relative_direction(*(np.array(cell) - tile))) for tile in tiles]
    return labels


def probe_columns(demos: list[Demo]) -> dict[str, tuple[int, int]]:
    """Each game's (start, stop) columns in the vision probe's labels: one column per key cell, then one per tile fact
    (`LanguageEnv.tile_facts`), games side by side in order of first appearance, so a warm start on several games
    gives each game's key cells their own head."""
    columns: dict[str, tuple[int, int]] = {}
    for demo in demos:
        name = demo.trajectory.env_name
        if name not in columns and demo.key_cells:
            start = max((stop for _, stop in columns.values()), default=0)
            facts = demo.tile_facts[0] if demo.tile_facts else None
            columns[name] = (start, start + len(demo.key_cells[0]) + (0 if facts is None else facts.shape[1]))
    return columns


def probe_labels(
    shape: tuple[int, int],
    key_cells: list[tuple[int, int]],
    columns: tuple[int, int],
    width: int,
    facts: np.ndarray | None = None,
) -> np.ndarray:
    """`tile_direction_labels`, then the tile `facts` if any, placed in the game's `columns` of a (H·W, width) array;
    the other games' columns are -100, which cross-entropy ignores."""
    labels = np.full((shape[0] * shape[1], width), -100, dtype=np.int64)
    own = tile_direction_labels(shape, key_cells)
    labels[:, columns[0] : columns[1]] = own if facts is None else np.concatenate([own, facts], axis=1)
    return labels


def pretrain_vision(
    model: torch.nn.Module,
    processor: Any,
    demos: list[Demo],
    recipe: WarmStartRecipe,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train the vision tower alone so that each image token knows where the player, box and target are from it.

    Why: trained end to end through the text model, the vision tower gets ~100× smaller gradients
    than the text layers and the SFT plateaus at guessing the direction words (the image is
    ignored). Here a throw-away linear probe reads `RELATIVE_DIRECTIONS` labels of the game's key cells
    off every merged image token (one token is one 28-px tile), a dense signal that the vision tower's
    2-D rope attention learns in a few hundred cheap image-only steps; SFT then only has to copy
    the feature from the player's / box's token into the think text. Returns the loss of every step.
    """
    images = [image for demo in demos for image in demo.trajectory.images]
    columns = probe_columns(demos)
    width = max((stop for _, stop in columns.values()), default=0)
    boards = [  # probe_labels' arguments, one per image
        (shape, cells, columns[demo.trajectory.env_name], width, facts)
        for demo in demos
        for shape, cells, facts in zip(demo.grid_shapes, demo.key_cells, demo.tile_facts, strict=True)
    ]
    if len(images) != len(boards) or not boards or any(not cells for _, cells, *_ in boards):
        raise ValueError(
            "Vision pre-training needs one image per turn and a game with key_cells(); set vision_steps=0 for this env."
        )
    visual = model.model.visual
    probe = torch.nn.Linear(visual.merger.mlp[-1].out_features, width * len(RELATIVE_DIRECTIONS))
    parameters = list(visual.parameters()) + list(probe.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=recipe.vision_lr, weight_decay=recipe.weight_decay)
    generator, losses = np.random.default_rng(recipe.seed), []
    # eval mode: the tiny model has no dropout, and transformers' vision attention in train mode is ~25× slower on CPU
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        for _ in range(recipe.vision_steps):
            rows = generator.integers(len(images), size=recipe.vision_batch_size)
            processed = processor.image_processor(images=[images[i] for i in rows], return_tensors="pt")
            tokens = visual(processed["pixel_values"], grid_thw=processed["image_grid_thw"]).pooler_output  # (n, D)
            labels = torch.as_tensor(np.concatenate([probe_labels(*boards[i]) for i in rows]))  # (n, width)
            assert tokens.shape[0] == labels.shape[0], "one merged image token per tile"
            logits = probe(tokens).view(-1, len(RELATIVE_DIRECTIONS))
            loss = torch.nn.functional.cross_entropy(logits, labels.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, recipe.grad_clip)
            optimizer.step()
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(len(losses), losses[-1])
    return losses


# ---- supervised fine-tuning --------------------------------------------------------------------
def sft_loss(model: torch.nn.Module, batch: TokenBatch, processor: Any) -> torch.Tensor:
    """Mean cross-entropy of the response tokens: -Σ log π · mask / Σ mask (a scalar)."""
    logprobs, _ = policy_forward(model, batch, processor)
    mask = batch.response_mask.to(logprobs.device)
    return -(logprobs * mask).sum() / mask.sum()


def backward_sft_batch(
    model: torch.nn.Module,
    batch: TokenBatch,
    processor: Any,
    micro_batch_size: int | None,
    bf16: bool,
    weight: float = 1.0,
    rows: torch.Tensor | None = None,
) -> float:
    """Backpropagate `weight · sft_loss(batch)` in length-sorted micro-batches of at most `micro_batch_size`
    dialogues, each weighted by its share of the batch's tokens (`aggregation_share`, as the RL update accumulates),
    so the accumulated gradient is the whole batch's; returns the (unweighted) loss.

    `rows` (default: all) backpropagates only those rows' shares of it: a data-parallel replica's part, which the
    replicas' summed gradients complete.

    Micro-batches bound the activation memory: SmolLM2-135M on 16 Sokoban dialogues (~750 tokens) needs more than
    24 GB in one pass, 4 dialogues a quarter of it."""
    device = next(model.parameters()).device
    rows = torch.arange(len(batch)) if rows is None else rows
    total = 0.0
    for micro in batch.micro_batches(rows, micro_batch_size or len(batch)):
        part = batch.select(micro)
        with _autocast(bf16, device):
            loss = sft_loss(model, part, processor)
        share = aggregation_share(part.response_mask, batch.response_mask, "token-mean")
        (loss * share * weight).backward()
        total += float(loss.detach() * share)
    return total


def lr_factor(step: int, total: int, warmup: int, floor: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay from 1 to `floor` at step `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _autocast(enabled: bool, device: torch.device):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def sft_parameter_groups(model: torch.nn.Module, recipe: WarmStartRecipe) -> list[dict[str, Any]]:
    """AdamW groups: the text model at `lr`, the vision tower at `vision_lr_scale·lr` (left out when 0).

    After `pretrain_vision` the image tokens already carry the directions; a frozen vision tower
    keeps them while the text model learns to read them (and skips the vision backward pass).
    """
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]  # only adapters under LoRA
    vision = [p for name, p in trainable if name.startswith("model.visual.")]
    text = [p for name, p in trainable if not name.startswith("model.visual.")]
    groups = [{"params": text, "lr": recipe.lr}]
    if recipe.vision_lr_scale > 0:
        groups.append({"params": vision, "lr": recipe.lr * recipe.vision_lr_scale})
    else:
        for parameter in vision:
            parameter.requires_grad_(False)
    return groups


def train_sft(
    model: torch.nn.Module,
    processor: Any,
    demos: list[Demo],
    recipe: WarmStartRecipe,
    on_step: Callable[[int, float], None] | None = None,
    pad_id: int | None = None,
    micro_batch_size: int | None = None,
) -> list[float]:
    """AdamW on `sft_loss` over shuffled mini-batches of demos; returns the loss of every step.

    `micro_batch_size` (dialogues per forward/backward, None: the whole batch) bounds memory, not the result: the
    gradient is accumulated to the whole batch's (`backward_sft_batch`), so it is not part of the recipe.

    `on_step(step, loss)` is called after each step (progress printing). `processor` is what the forward takes
    (an image processor or a tokenizer); `pad_id` defaults to `processor.tokenizer`'s.
    """
    if not demos:
        raise ValueError("No demonstrations to train on; raise train_episodes.")
    emulated = recipe.bf16 and emulated_bf16_warning("sft.bf16", next(model.parameters()).device)
    if emulated:
        warnings.warn(emulated, stacklevel=2)
    generator = np.random.default_rng(recipe.seed)
    was_trainable = [p.requires_grad for p in model.parameters()]  # before sft_parameter_groups freezes the vision
    optimizer = torch.optim.AdamW(sft_parameter_groups(model, recipe), lr=recipe.lr, weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, recipe.steps, recipe.warmup_steps, recipe.lr_floor)
    )
    if pad_id is None:
        pad_id = processor.tokenizer.pad_token_id
    order: list[int] = []
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        for _ in range(recipe.steps):
            if len(order) < recipe.batch_size:
                order += generator.permutation(len(demos)).tolist()
            rows, order = order[: recipe.batch_size], order[recipe.batch_size :]
            batch = sft_batch([demos[i] for i in rows], pad_id, recipe.imitate_noise)
            optimizer.zero_grad(set_to_none=True)
            loss = backward_sft_batch(model, batch, processor, micro_batch_size, recipe.bf16)
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
            optimizer.step()
            schedule.step()
            losses.append(loss)
            if on_step is not None:
                on_step(len(losses), losses[-1])
    for parameter, trainable in zip(model.parameters(), was_trainable, strict=True):
        parameter.requires_grad_(trainable)  # a frozen vision tower is frozen for this SFT only
    return losses


# ---- evaluation --------------------------------------------------------------------------------
EnvFactory = Callable[[], Any]


class EvaluationSettings(Protocol):
    """What a report's evaluation reads of a recipe (`WarmStartRecipe`, `TextHolesRecipe`)."""

    eval_episodes: int
    eval_temperature: float
    max_new_tokens: int


def evaluate_model(
    model: torch.nn.Module,
    processor: Any,
    episodes: int,
    temperature: float,
    max_new_tokens: int = 48,
    make: EnvFactory | None = None,
    env_name: str = "sokoban_visual",
) -> dict[str, float]:
    """Success rate, format-ok rate (over turns) and mean turns of the model on the first `episodes` held-out
    episodes of `make` (sokoban_visual): the trainer's validation episodes, which `scripts/evaluate.py` plays too."""
    tokenizer, image_processor = getattr(processor, "tokenizer", processor), getattr(processor, "image_processor", None)
    trajectories = validation_episodes(
        make or make_sokoban_visual,
        HFEngine(model, image_processor or tokenizer),
        DialogueFormatter(tokenizer, image_processor),
        episodes=range(episodes),
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        max_context_tokens=4096,
        env_name=env_name,
    )
    metrics = episode_metrics(trajectories)
    return {key: metrics[key] for key in ("success", "format_ok", "turns")}


def evaluate_scripted(policy: str, episodes: int, make: EnvFactory | None = None) -> dict[str, float]:
    """Success rate of a built-in policy (`random`, `solver`) on the first `episodes` held-out seeds of `make`
    (sokoban_visual), played by the evaluator's chat loop, so episode k's random stream is keyed as there."""
    make = make if make is not None else lambda: make_sokoban_visual(observation="text")
    results = play_chat_episodes(make, eval_seeds(episodes), policy_responder(policy), system_prompt=None)
    return {"success": float(np.mean([result.success for result in results]))}


def evaluate_all(
    model: torch.nn.Module,
    processor: Any,
    recipe: EvaluationSettings,
    make: EnvFactory | None = None,
    env_name: str = "sokoban_visual",
    scripted: bool = True,
) -> dict[str, Any]:
    """The report's evaluation block: the model greedy and at the recipe's temperature (and random, solver)."""
    episodes = recipe.eval_episodes
    seeds = eval_seeds(episodes)
    # A bar per pass: an untrained model writes max_new_tokens every turn, so a pass can take minutes.
    bar = tqdm(total=2, desc=f"held-out evaluation on {env_name} ({episodes} episodes per pass)", unit="pass")

    def model_at(temperature: float) -> dict[str, float]:
        result = evaluate_model(model, processor, episodes, temperature, recipe.max_new_tokens, make, env_name)
        bar.update(1)
        return result

    block: dict[str, Any] = {
        "seeds": [seeds[0], seeds[-1]],
        "greedy": model_at(0.0),
        f"temperature_{recipe.eval_temperature:g}": model_at(recipe.eval_temperature),
    }
    bar.close()
    if scripted:
        block["random"] = evaluate_scripted("random", episodes, make=make)
        block["solver"] = evaluate_scripted("solver", episodes, make=make)
    return block


# ---- build and load ----------------------------------------------------------------------------
def loss_summary(losses: list[float]) -> dict[str, Any]:
    tenth = max(1, len(losses) // 10)
    return {
        "first": losses[0],
        "last_10pct_mean": float(np.mean(losses[-tenth:])),
        "every_10pct": [float(np.mean(losses[i : i + tenth])) for i in range(0, len(losses), tenth)],
    }


def warm_start(
    model: torch.nn.Module,
    processor: Any,
    recipe: WarmStartRecipe,
    folder: Path,
    make: EnvFactory | None = None,
    env_name: str = "sokoban_visual",
    evaluate_before: bool = False,
    other_games: dict[str, EnvFactory] | None = None,
    save: Callable[[torch.nn.Module, Path], Any] | None = None,
    micro_batch_size: int | None = None,
) -> dict[str, Any]:
    """Train `model` by the recipe on `make`'s demonstrations, save it into `folder` with its `report.json`.

    `save(model, folder)` writes the trained model (default: `save_pretrained`, the whole model; a LoRA warm start
    passes one that writes only the adapter).

    `processor` is the VL processor (tokenizer + image processor) or a text model's tokenizer. A progress bar
    with an ETA covers the vision pre-training and SFT steps (the long part). With `evaluate_before`, the report
    also holds the held-out evaluation of the model before SFT ("eval_before").

    `other_games` ({env name: factory}) warm-starts one model on several games at once: `train_episodes`
    demonstrations of each, shuffled together into the same `steps`, each game with its own vision-probe columns.
    The report's "eval"/"eval_before" are `env_name`'s; "other_games" holds the same blocks for each other game.
    `micro_batch_size`: see `train_sft`.
    """
    started = last = time.perf_counter()

    def lap() -> float:
        """Seconds since the previous lap: each phase timed on its own."""
        nonlocal last
        now = time.perf_counter()
        elapsed, last = now - last, now
        return elapsed

    games = {env_name: make or make_sokoban_visual, **(other_games or {})}
    tokenizer, image_processor = getattr(processor, "tokenizer", processor), getattr(processor, "image_processor", None)
    before = (
        {name: evaluate_all(model, processor, recipe, game, name, scripted=False) for name, game in games.items()}
        if evaluate_before
        else {}
    )
    seconds = {"eval_before": lap()}
    formatter = DialogueFormatter(tokenizer, image_processor)
    episodes = range(recipe.train_episodes)
    demos = [
        demo
        for name, game in games.items()
        for demo in demonstrations(
            game, formatter, episodes, recipe.noise_eps, recipe.seed, name, keep_all_noise=recipe.imitate_noise
        )
    ]
    seconds["demos"] = lap()
    vision_steps = recipe.vision_steps if image_processor is not None else 0
    bar = tqdm(total=vision_steps + recipe.steps, desc=f"warm start on {' + '.join(games)} (once)", unit="step")

    def on_step(step: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    vision_losses = pretrain_vision(model, processor, demos, recipe, on_step) if vision_steps else []
    seconds["vision"] = lap()
    losses = train_sft(
        model, image_processor or tokenizer, demos, recipe, on_step, tokenizer.pad_token_id, micro_batch_size
    )
    bar.close()
    seconds["train"] = lap()
    model.eval()
    if save is None:
        model.save_pretrained(folder)
    else:
        save(model, folder)
    if image_processor is not None:
        save_processor(processor, folder)
    else:
        tokenizer.save_pretrained(folder)
    seconds["save"] = lap()
    report = {
        "recipe": asdict(recipe),
        "env": env_name,
        "demos": {
            "episodes": len(demos),
            "solver_turns": sum(n.count(False) for n in (d.noisy_turns for d in demos)),
            "noisy_turns": sum(n.count(True) for n in (d.noisy_turns for d in demos)),
            "success": float(np.mean([d.trajectory.success for d in demos])),
        },
        "vision_loss": loss_summary(vision_losses) if vision_losses else None,
        "train_loss": loss_summary(losses),
        "micro_batch_size": micro_batch_size,  # memory only: the recipe's gradient either way
        "seconds": seconds,
    }
    blocks = {}
    for name, game in games.items():
        block = {"eval_before": before[name]} if name in before else {}
        blocks[name] = block | {"eval": evaluate_all(model, processor, recipe, game, name)}
    seconds["eval"] = lap()
    report |= blocks.pop(env_name)
    if blocks:
        report["other_games"] = blocks
    report["seconds"]["total"] = time.perf_counter() - started
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    return report


def build_warm_tiny_vl(cache_dir: str | Path | None = None, recipe: WarmStartRecipe | None = None) -> Path:
    """Return the folder of the warm-started tiny Qwen2.5-VL (sokoban_visual and frozenlake_visual), training it once
    (minutes on CPU).

    The folder holds what `load_tiny_vl` reads plus `report.json`. It is rebuilt when the recipe,
    this module's version or the base model (its tokenizer corpus, size, seed) changes.
    """
    recipe = recipe or WarmStartRecipe()
    root = Path(cache_dir or cache_root())
    base = build_tiny_vl(root, size=recipe.size, seed=recipe.base_seed)
    stamp = {"model": "warm-tiny-vl", "version": WARMSTART_VERSION, "recipe": asdict(recipe), "base": read_stamp(base)}
    target = root / f"warm-tiny-vl-{recipe.size}-seed{recipe.base_seed}"
    shipped = SHIPPED_DIR / target.name
    if read_stamp(shipped) == stamp:
        return shipped  # the build of exactly this recipe and base that ships with the package
    games = {"frozenlake_visual": make_frozenlake_visual}
    return build_once(target, stamp, lambda folder: warm_start(*load_tiny_vl(base), recipe, folder, other_games=games))


def load_warm_tiny_vl(cache_dir: str | Path | None = None, recipe: WarmStartRecipe | None = None, **load_kwargs):
    """The warm-started model (eval mode) and its processor, building them first if needed."""
    return load_tiny_vl(build_warm_tiny_vl(cache_dir, recipe), **load_kwargs)


def read_report(folder: str | Path) -> dict[str, Any]:
    """The `report.json` a warm-start build wrote into `folder`."""
    return json.loads((Path(folder) / "report.json").read_text())
