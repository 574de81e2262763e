"""Warm-start the tiny visual default model by supervised fine-tuning on noisy solver demonstrations.

An untrained tiny Qwen2.5-VL never writes a well-formed answer, so RL from it has no signal. This
module plays visual Sokoban with the game's solver, writes each turn as a short model-style
response (`<think>` where the box and target are, relative to the player `</think><answer>` the
solver's next moves `</answer>`), and trains the model on those responses with exactly the
context layout the rollout uses (`DialogueFormatter`), so RL starts from a policy that plays.

Why noise: a model trained only on perfect play has never seen a state off the solver's path and
cannot recover from its own first mistake (DAgger's covariate shift). With probability
`noise_eps` a turn plays random actions instead; that turn stays in the dialogue as context (the
model sees the consequence) but is masked out of the loss, and the solver replans from the new
state on the next turn, which is what the model learns to imitate.

Why relative directions in the think text: the model has no absolute position embedding (mRoPE
and the vision tower's 2-D rope are relative), so "box is up-left of me" is a thing its attention
can compute from the image, whereas "(row 2, col 3)" is not.

Why the vision tower is pre-trained first (`pretrain_vision`) and then frozen: trained end to end,
it gets ~100× smaller gradients than the text layers, and the model learns the format but ignores
the image (version 1 of this recipe played no better than random).

The result is cached with `build_once`, keyed by the recipe and the base model's stamp; a
`report.json` in the folder records the held-out success rates and the training curve.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from vagen.engines.base import SamplingParams
from vagen.engines.hf import HFEngine
from vagen.env import make_env
from vagen.env.policies import POLICIES, format_response
from vagen.models.cache import build_once, cache_root, read_stamp
from vagen.models.processor import save_processor
from vagen.models.tiny import build_tiny_vl, load_tiny_vl
from vagen.rollout import DialogueFormatter, RolloutSpec, Trajectory, Turn, collect_rollouts, trajectories_to_batch
from vagen.rollout.batch import TokenBatch
from vagen.rollout.validation import episode_metrics
from vagen.trainer.forward import policy_forward

# Bump when anything below changes what a build produces (think text, masking, evaluation), so caches rebuild.
WARMSTART_VERSION = 2
NOISY_TURN_KEY = "demo_noisy"  # set in Turn.info of demo turns whose actions were random (masked out of the loss)
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
HELD_OUT_FIRST_SEED = 1_000_000  # training seeds are 0..train_episodes-1: never overlapping
# Finished builds committed with the package (weights, processor, report.json and the stamp of the recipe that
# built them), so first contact skips the ~15-minute build; used only while the recipe is unchanged.
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"


@dataclass(frozen=True)
class WarmStartRecipe:
    """Everything that decides what the warm-started model is (all of it goes into the cache stamp)."""

    size: str = "default"  # tiny model size (`vagen.models.tiny.TINY_SIZES`)
    base_seed: int = 0  # seed of the untrained base model's weights
    train_episodes: int = 2400  # demonstration episodes (seeds 0..train_episodes-1)
    noise_eps: float = 0.25  # probability that a demo turn plays random actions instead of the solver's
    steps: int = 240  # optimizer steps
    batch_size: int = 16  # dialogues per step
    lr: float = 3e-3  # peak AdamW learning rate
    warmup_steps: int = 10  # linear warm-up, then cosine decay to lr_floor·lr
    lr_floor: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0  # data order, noise and dropout
    bf16: bool = True  # bf16 autocast for the training forward passes (CPU AMX or GPU)
    vision_steps: int = 400  # image-only pre-training steps of the vision tower (`pretrain_vision`)
    vision_batch_size: int = 64  # images per vision pre-training step
    vision_lr: float = 3e-3
    vision_lr_scale: float = 0.0  # vision tower's SFT learning rate relative to `lr` (0: frozen after pre-training)
    eval_episodes: int = 128  # held-out seeds HELD_OUT_FIRST_SEED.. for the report
    eval_temperature: float = 0.5
    max_new_tokens: int = 48


@dataclass
class Demo:
    """One demonstration: the trajectory plus which turns are noise."""

    trajectory: Trajectory
    noisy_turns: list[bool] = field(default_factory=list)
    grids: list[np.ndarray] = field(default_factory=list)  # each turn's observed (H, W) tile codes


# ---- demonstrations ----------------------------------------------------------------------------
def make_sokoban_visual(**overrides: Any):
    """The sokoban_visual env of configs/env/sokoban_visual.yaml (6×6, 1 box, 28-px tiles, 5 turns × 3 actions)."""
    return make_env("vagen/Sokoban-v0", **{**SOKOBAN_VISUAL, **overrides})


def _direction(delta_row: int, delta_col: int) -> str:
    """'up-left', 'down', … for a (row, col) offset; 'here' for none."""
    vertical = "up" if delta_row < 0 else "down" if delta_row > 0 else ""
    horizontal = "left" if delta_col < 0 else "right" if delta_col > 0 else ""
    return "-".join(part for part in (vertical, horizontal) if part) or "here"


def _sokoban_objects(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, col) of the player, of the unplaced boxes (n, 2) and of the free targets (m, 2), row-major."""
    from envs_text import sokoban as codes  # an env package; imported lazily so vagen never needs it at import

    player = np.argwhere(np.isin(grid, (codes.PLAYER, codes.PLAYER_ON_TARGET)))[0]
    boxes = np.argwhere(grid == codes.BOX)
    targets = np.argwhere(np.isin(grid, (codes.TARGET, codes.PLAYER_ON_TARGET)))
    return player, boxes, targets


def sokoban_think(grid: np.ndarray) -> str:
    """Where the (first unplaced) box is from the player and where its target is from the box.

    grid: (H, W) uint8 Sokoban tile codes (`envs_text.sokoban`). Relative words only (see module doc).
    """
    player, boxes, targets = _sokoban_objects(grid)
    if not len(boxes) or not len(targets):
        return "all boxes are on targets."
    box, target = boxes[0], targets[0]
    box_dir = _direction(*(box - player))
    target_dir = _direction(*(target - box))
    return f"box is {box_dir} of me, target is {target_dir} of box."


def demo_response(env, actions: list[str]) -> str:
    """A free_think response: the state's think text and `actions` in the env's answer format."""
    game = env.unwrapped
    return format_response(game.response_format, actions, game.action_separator, sokoban_think(game.grid()))


def _turn_actions(env, rng: np.random.Generator, noise_eps: float) -> tuple[list[str], bool] | None:
    """The solver's next moves (or, with probability noise_eps, random ones); None when the solver is stuck."""
    game = env.unwrapped
    plan = list(game.solver_actions())
    if not plan:
        return None  # unsolvable (a box pushed into a corner by noise): nothing left to imitate
    if rng.random() < noise_eps:
        count = int(rng.integers(1, game.max_actions_per_turn + 1))
        return [game.action_names[int(i)] for i in rng.integers(len(game.action_names), size=count)], True
    return plan[: game.max_actions_per_turn], False


def play_demo(env, formatter: DialogueFormatter, seed: int, noise_eps: float, rng: np.random.Generator) -> Demo:
    """Play one episode with the (noisy) solver, recorded as the rollout would record a model's episode.

    Each turn's response ids are the tokenised demo response followed by the end-of-message token
    (the model learns to stop); `close_ids` and the next prompt come from `formatter`, so the ids
    are those `collect_rollouts` would build had the model sampled this response.
    """
    tokenizer = formatter.tokenizer
    end_ids = formatter.close_ids([], "length")[:1]  # the end-of-message token the engine stops on
    trajectory, noisy, grids = Trajectory(group_id=seed, seed=seed, env_name="sokoban_visual"), [], []
    observation, _ = env.reset(seed=seed)
    prompt = formatter.first_prompt(observation)
    while True:
        choice = _turn_actions(env, rng, noise_eps)
        if choice is None:
            trajectory.end_reason = "unsolvable"
            return Demo(trajectory, noisy, grids)
        actions, is_noise = choice
        text = demo_response(env, actions)
        response_ids = tokenizer(text, add_special_tokens=False)["input_ids"] + end_ids
        turn = Turn(observation=observation.text, images=list(observation.images), prompt_ids=prompt)
        turn.response_ids, turn.response_text, turn.finish_reason = response_ids, text, "stop"
        turn.response_logprobs = [0.0] * len(response_ids)
        turn.close_ids = formatter.close_ids(response_ids, "stop")
        grids.append(env.unwrapped.grid().copy())
        observation, turn.reward, terminated, truncated, turn.info = env.step(text)
        trajectory.turns.append(turn)
        noisy.append(is_noise)
        if terminated or truncated:
            trajectory.terminated, trajectory.truncated = terminated, truncated
            trajectory.end_reason = "success" if turn.info["success"] else "max_turns"
            return Demo(trajectory, noisy, grids)
        prompt = formatter.next_prompt(observation)


def demonstrations(
    formatter: DialogueFormatter, seeds: range | list[int], noise_eps: float, seed: int = 0
) -> list[Demo]:
    """Noisy-solver demos of sokoban_visual for `seeds`; demos whose first turn was already stuck are dropped."""
    env, rng = make_sokoban_visual(), np.random.default_rng(seed)
    demos = [play_demo(env, formatter, s, noise_eps, rng) for s in seeds]
    env.close()
    return [demo for demo in demos if demo.trajectory.turns and not all(demo.noisy_turns)]


def sft_batch(demos: list[Demo], pad_token_id: int) -> TokenBatch:
    """`trajectories_to_batch` of the demos with the noisy turns' responses taken out of the loss mask."""
    batch = trajectories_to_batch([demo.trajectory for demo in demos], pad_token_id)
    for row, demo in enumerate(demos):
        for (start, end), is_noise in zip(demo.trajectory.response_spans(), demo.noisy_turns, strict=True):
            if is_noise:
                batch.response_mask[row, start:end] = 0.0
    return batch


# ---- vision pre-training -----------------------------------------------------------------------
# The classes of `_direction`, in a fixed order: the labels of the vision probe.
DIRECTIONS = ("here", "up", "down", "left", "right", "up-left", "up-right", "down-left", "down-right")


def tile_direction_labels(grid: np.ndarray) -> np.ndarray:
    """For every tile (row-major), the `DIRECTIONS` index of the player, the box and the target seen from it.

    grid: (H, W) uint8 tile codes. Returns (H·W, 3) int64. The box is the first unplaced one (the one
    `sokoban_think` names), or a placed one when all are placed; the target likewise.
    """
    from envs_text import sokoban as codes

    player, boxes, targets = _sokoban_objects(grid)
    boxes = boxes if len(boxes) else np.argwhere(grid == codes.BOX_ON_TARGET)
    targets = targets if len(targets) else boxes
    tiles = np.argwhere(np.ones(grid.shape, dtype=bool))  # (H·W, 2) row-major, as the merged image tokens
    labels = np.zeros((len(tiles), 3), dtype=np.int64)
    for column, thing in enumerate((player, boxes[0], targets[0])):
        labels[:, column] = [DIRECTIONS.index(_direction(*(thing - tile))) for tile in tiles]
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
    ignored). Here a throw-away linear probe reads `DIRECTIONS` labels for all three objects off
    every merged image token (one token is one 28-px tile), a dense signal that the vision tower's
    2-D rope attention learns in a few hundred cheap image-only steps; SFT then only has to copy
    the feature from the player's / box's token into the think text. Returns the loss of every step.
    """
    images = [image for demo in demos for image in demo.trajectory.images]
    grids = [grid for demo in demos for grid in demo.grids]
    assert len(images) == len(grids)
    visual = model.model.visual
    probe = torch.nn.Linear(visual.merger.mlp[-1].out_features, 3 * len(DIRECTIONS))
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
            labels = torch.as_tensor(np.concatenate([tile_direction_labels(grids[i]) for i in rows]))  # (n, 3)
            assert tokens.shape[0] == labels.shape[0], "one merged image token per tile"
            logits = probe(tokens).view(-1, len(DIRECTIONS))
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
    vision = [p for name, p in model.named_parameters() if name.startswith("model.visual.")]
    text = [p for name, p in model.named_parameters() if not name.startswith("model.visual.")]
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
) -> list[float]:
    """AdamW on `sft_loss` over shuffled mini-batches of demos; returns the loss of every step.

    `on_step(step, loss)` is called after each step (progress printing).
    """
    if not demos:
        raise ValueError("No demonstrations to train on; raise train_episodes.")
    generator = np.random.default_rng(recipe.seed)
    optimizer = torch.optim.AdamW(sft_parameter_groups(model, recipe), lr=recipe.lr, weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, recipe.steps, recipe.warmup_steps, recipe.lr_floor)
    )
    pad_id = processor.tokenizer.pad_token_id
    device = next(model.parameters()).device
    order: list[int] = []
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        for _ in range(recipe.steps):
            if len(order) < recipe.batch_size:
                order += generator.permutation(len(demos)).tolist()
            rows, order = order[: recipe.batch_size], order[recipe.batch_size :]
            with _autocast(recipe.bf16, device):
                loss = sft_loss(model, sft_batch([demos[i] for i in rows], pad_id), processor)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(len(losses), losses[-1])
    for parameter in model.parameters():
        parameter.requires_grad_(True)  # a frozen vision tower is frozen for this SFT only
    return losses


# ---- evaluation --------------------------------------------------------------------------------
def evaluate_model(
    model: torch.nn.Module, processor: Any, seeds: list[int], temperature: float, max_new_tokens: int = 48
) -> dict[str, float]:
    """Success rate, format-ok rate (over turns) and mean turns of the model on sokoban_visual `seeds`."""
    formatter = DialogueFormatter(processor.tokenizer, processor.image_processor)
    spec = RolloutSpec(group_seeds=list(seeds), group_size=1, max_context_tokens=4096, env_name="sokoban_visual")
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=1234)
    trajectories = collect_rollouts(make_sokoban_visual, HFEngine(model, processor), formatter, spec, sampling)
    metrics = episode_metrics(trajectories)
    return {key: metrics[key] for key in ("success", "format_ok", "turns")}


def evaluate_scripted(policy: str, seeds: list[int], seed: int = 0) -> dict[str, float]:
    """Success rate of a built-in policy (`random`, `solver`) on sokoban_visual `seeds`."""
    env, act, rng = make_sokoban_visual(observation="text"), POLICIES.get(policy), np.random.default_rng(seed)
    successes = []
    for episode_seed in seeds:
        env.reset(seed=episode_seed)
        done, info = False, {"success": False}
        while not done:
            if policy == "solver" and not env.unwrapped.solver_actions():
                break
            _, _, terminated, truncated, info = env.step(act(env, rng))
            done = terminated or truncated
        successes.append(info["success"])
    env.close()
    return {"success": float(np.mean(successes))}


def held_out_seeds(count: int) -> list[int]:
    """Evaluation seeds, disjoint from every training seed."""
    return list(range(HELD_OUT_FIRST_SEED, HELD_OUT_FIRST_SEED + count))


def evaluate_all(model: torch.nn.Module, processor: Any, recipe: WarmStartRecipe) -> dict[str, Any]:
    """The report's evaluation block: the model greedy and at the recipe's temperature, random, solver."""
    seeds = held_out_seeds(recipe.eval_episodes)
    return {
        "seeds": [seeds[0], seeds[-1]],
        "greedy": evaluate_model(model, processor, seeds, 0.0, recipe.max_new_tokens),
        f"temperature_{recipe.eval_temperature:g}": evaluate_model(
            model, processor, seeds, recipe.eval_temperature, recipe.max_new_tokens
        ),
        "random": evaluate_scripted("random", seeds),
        "solver": evaluate_scripted("solver", seeds),
    }


# ---- build and load ----------------------------------------------------------------------------
def _loss_summary(losses: list[float]) -> dict[str, Any]:
    tenth = max(1, len(losses) // 10)
    return {
        "first": losses[0],
        "last_10pct_mean": float(np.mean(losses[-tenth:])),
        "every_10pct": [float(np.mean(losses[i : i + tenth])) for i in range(0, len(losses), tenth)],
    }


def warm_start(base: Path, recipe: WarmStartRecipe, folder: Path) -> dict[str, Any]:
    """Train the model in `base` by the recipe, save it into `folder` with its `report.json`; return the report.

    A progress bar with an ETA covers the vision pre-training and SFT steps (the long part of a build).
    """
    started = time.perf_counter()
    model, processor = load_tiny_vl(base)
    formatter = DialogueFormatter(processor.tokenizer, processor.image_processor)
    demos = demonstrations(formatter, range(recipe.train_episodes), recipe.noise_eps, recipe.seed)
    demo_seconds = time.perf_counter() - started
    bar = tqdm(total=recipe.vision_steps + recipe.steps, desc=f"building tiny_vl ({recipe.size}, once)", unit="step")

    def on_step(step: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    vision_losses = pretrain_vision(model, processor, demos, recipe, on_step) if recipe.vision_steps else []
    vision_seconds = time.perf_counter() - started - demo_seconds
    losses = train_sft(model, processor, demos, recipe, on_step)
    bar.close()
    train_seconds = time.perf_counter() - started - demo_seconds - vision_seconds
    model.eval()
    model.save_pretrained(folder)
    save_processor(processor, folder)
    report = {
        "recipe": asdict(recipe),
        "demos": {
            "episodes": len(demos),
            "solver_turns": sum(n.count(False) for n in (d.noisy_turns for d in demos)),
            "noisy_turns": sum(n.count(True) for n in (d.noisy_turns for d in demos)),
            "success": float(np.mean([d.trajectory.success for d in demos])),
        },
        "vision_loss": _loss_summary(vision_losses) if vision_losses else None,
        "train_loss": _loss_summary(losses),
        "seconds": {"demos": demo_seconds, "vision": vision_seconds, "train": train_seconds},
    }
    report["eval"] = evaluate_all(model, processor, recipe)
    report["seconds"]["total"] = time.perf_counter() - started
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    return report


def build_warm_tiny_vl(cache_dir: str | Path | None = None, recipe: WarmStartRecipe | None = None) -> Path:
    """Return the folder of the warm-started tiny Qwen2.5-VL, training it once (several minutes on CPU).

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
    return build_once(target, stamp, lambda folder: warm_start(base, recipe, folder))


def load_warm_tiny_vl(cache_dir: str | Path | None = None, recipe: WarmStartRecipe | None = None, **load_kwargs):
    """The warm-started model (eval mode) and its processor, building them first if needed."""
    return load_tiny_vl(build_warm_tiny_vl(cache_dir, recipe), **load_kwargs)


def read_report(folder: str | Path) -> dict[str, Any]:
    """The `report.json` a warm-start build wrote into `folder`."""
    return json.loads((Path(folder) / "report.json").read_text())
