"""The options of a training config and their checks, run before any model loads; each error says the fix.

`OPTIONS` is the one table of every option of configs/train.yaml and its groups: its type, the values it may take and
what it means. `check_options` reads it to refuse, with the option's name and range, a missing or misspelt key, a
value of the wrong type (a string where a number or a boolean belongs), a non-finite number and a number out of its
range; the cross-field checks below then say which combination to change. Numbers must be finite and booleans real
booleans: inf, nan, "maybe" or 1 never silently turn a run inert (a zero update, KL off) or wrong (NaN weights).
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import math
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from vagen.algos.advantages import ADVANTAGE_ESTIMATORS
from vagen.algos.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS
from vagen.bootstrap.demos import SFT_SOURCES, SFT_TOKENS
from vagen.diagnostics.scoring import SCOPES
from vagen.engines import ENGINES
from vagen.env import OBSERVATION_MODES, RESPONSE_FORMATS, make_env
from vagen.filtering import EMPTY_POLICIES, FILTER_STRATEGIES, SPREAD_STATS
from vagen.logging.sinks import WANDB_MODES
from vagen.models.lora import require_peft
from vagen.models.registry import MODALITIES, model_sources
from vagen.rollout.batch import ADVANTAGE_TOKENS
from vagen.rollout.context import DialogueFormatter
from vagen.rollout.validation import EVAL_SEED_BASE
from vagen.trainer.levels import LEVEL_SAMPLERS, SEED_STRIDE
from vagen.trainer.memory_plan import GIB, available_memory

CRITIC_ESTIMATORS = ("gae", "bilevel_gae")
GROUP_ESTIMATORS = ("grpo", "grpo_turn", "gigpo", "drgrpo", "rloo")
DEVICES = ("auto", "cpu", "cuda")
OLD_LOGPROBS = ("auto", "recompute", "rollout")
LR_SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_SEED = EVAL_SEED_BASE // SEED_STRIDE - 1  # run seed s trains on env seeds s·SEED_STRIDE + k, below evaluation's
REWARD = "[-1e6, 1e6]"  # rewards are summed, normalised and stored in float32: larger magnitudes swamp the rest
PENALTY, BONUS = "[-1e6, 0]", "[0, 1e6]"
TEMPERATURE = "0 | [0.01, 100]"  # 0 = greedy; logits / T with a smaller T overflow (inf, then NaN probabilities)
# Mappings passed whole to a constructor, which refuses unknown keys (the last two: scripts/evaluate.py's).
OPEN_SECTIONS = ("env.kwargs", "rollout.engine_kwargs", "env_overrides", "model_overrides")


@dataclass(frozen=True)
class Option:
    """One option: its type (`int`, `float`, `bool`, `str`, `list[str]`, `list[int]`; `| None` where null is
    allowed); the values it may take (numbers: intervals such as "(0, 1]" or "0 | [0.01, 100]", inf for no bound,
    finite values only; strings and lists of strings: the choices, or a function returning them; lists of numbers:
    the interval of each item); and a one-line meaning."""

    type: Any
    values: str | Sequence[str] | Callable[[], Sequence[str]] = ""
    doc: str = ""


# fmt: off
OPTIONS: dict[str, Option] = {
    # ---- run ---------------------------------------------------------------------------------------------------
    "seed": Option(int, f"[0, {MAX_SEED}]", "run seed (model init, sampling, shuffling); its training levels start "
                   f"at seed·{SEED_STRIDE}, below the held-out evaluation seeds ({EVAL_SEED_BASE:,})"),
    "device": Option(str, DEVICES, "auto (cuda if available) | cpu | cuda"),
    "run_dir": Option(str, "", "folder of the run's config, metrics, checkpoints and GIFs"),
    # ---- trainer -----------------------------------------------------------------------------------------------
    "trainer.iterations": Option(int, "[1, inf)", "training iterations (rollout + update)"),
    "trainer.workers": Option(int, "[1, inf)", "data-parallel replicas (N > 1: Ray actors)"),
    "trainer.groups": Option(int, "[1, inf)", "P: initial states (env seeds) per iteration"),
    "trainer.group_size": Option(int, "[1, inf)", "N: rollouts per initial state"),
    "trainer.level_pool": Option(int, f"[0, {SEED_STRIDE}]", "0: new levels every iteration; L: cycle through L"),
    "trainer.level_sampler": Option(
        str, LEVEL_SAMPLERS, "fresh levels, prioritised level replay (plr), or new levels kept by difficulty (frontier)"
    ),
    "trainer.plr.replay_prob": Option(float, "[0, 1]", "chance that a group slot replays a seen level"),
    "trainer.plr.temperature": Option(float, "(0, inf)", "β of the rank weighting (1/rank)^(1/β)"),
    "trainer.plr.staleness": Option(float, "[0, 1]", "ρ: weight of the staleness distribution"),
    "trainer.plr.buffer_size": Option(int, "[1, inf)", "levels remembered by prioritised replay"),
    "trainer.frontier.memory": Option(float, "[0, 1]", "share of a distance's success counts kept per iteration"),
    "trainer.frontier.floor": Option(float, "(0, 1]", "lowest keep probability of a new level"),
    "trainer.frontier.max_candidates": Option(int, "[1, inf)", "new levels looked at per group slot"),
    "trainer.ppo_epochs": Option(int, "[1, inf)", "passes over the batch per iteration"),
    "trainer.mini_batch_size": Option(int, "[1, inf)", "dialogues per optimizer step"),
    "trainer.micro_batch_size": Option(int, "[1, inf)", "most dialogues per forward/backward (accumulated)"),
    "trainer.lr": Option(float, "(0, 1]", "policy learning rate (AdamW: each weight moves by about lr per step)"),
    "trainer.critic_lr": Option(float, "(0, 1]", "critic learning rate (AdamW)"),
    "trainer.weight_decay": Option(float, "[0, inf)", "AdamW weight decay (each step shrinks weights by lr·decay)"),
    "trainer.adam_eps": Option(float, "(0, 1]", "policy AdamW eps (steps are lr·m/(sqrt(v)+eps): a large eps "
                               "makes every update vanish)"),
    "trainer.warmup_iterations": Option(int, "[0, inf)", "linear learning-rate warm-up, in iterations"),
    "trainer.lr_schedule": Option(str, LR_SCHEDULES, "constant | linear | cosine: the learning rates fall to 0 from "
                                  "iteration lr_decay_start to lr_decay_end"),
    "trainer.lr_decay_start": Option(float, "[0, inf)", "iteration where the learning-rate decay begins, or below 1 "
                                     "a fraction of lr_decay_end (0.75: the last quarter)"),
    "trainer.lr_decay_end": Option(int | None, "[1, inf)", "iteration where the learning rates reach 0 (null: "
                                   "trainer.iterations)"),
    "trainer.max_grad_norm": Option(float, "(0, inf)", "gradient clipping norm (0 would zero every update)"),
    "trainer.freeze_vision": Option(bool, "", "keep the vision tower's weights fixed"),
    "trainer.eval_every": Option(int, "[0, inf)", "held-out validation every this many iterations (0 = off)"),
    "trainer.eval_episodes": Option(int, "[1, inf)", "held-out levels per validation"),
    "trainer.eval_samples": Option(int, "[1, inf)", "episodes per held-out level in each validation"),
    "trainer.eval_temperature": Option(float, TEMPERATURE, "sampling temperature of validation (0 = greedy)"),
    "trainer.eval_greedy": Option(bool, "", "each validation also plays every held-out level once, greedily"),
    "trainer.eval_move_probe": Option(bool, "", "each validation also scores the first-move probe"),
    "trainer.reuse_first_forward": Option(bool, "", "the first mini-batch's old log-probs come from its forward"),
    "trainer.old_logprobs": Option(str, OLD_LOGPROBS, "the other mini-batches' old log-probs: recompute (a no-grad "
                                   "pass) | rollout (the engine's, no pass) | auto (rollout where the engine samples "
                                   "the trained function: hf, fp32, top_p 1)"),
    "trainer.bf16": Option(bool, "", "bf16 autocast for forward/backward"),
    "trainer.gradient_checkpointing": Option(bool, "", "recompute activations in backward (less memory)"),
    "trainer.memory_check": Option(bool, "", "refuse a run whose memory plan exceeds the device"),
    "trainer.lora.enabled": Option(bool, "", "train LoRA adapters instead of all weights (needs peft)"),
    "trainer.lora.r": Option(int, "[1, inf)", "LoRA rank"),
    "trainer.lora.alpha": Option(float, "(0, inf)", "LoRA scaling"),
    "trainer.lora.dropout": Option(float, "[0, 1)", "LoRA dropout"),
    "trainer.lora.target_modules": Option(list[str], "", "module names to adapt"),
    "trainer.save_every": Option(int, "[1, inf)", "checkpoint every this many iterations (and at the end)"),
    "trainer.keep_checkpoints": Option(int, "[1, inf)", "complete checkpoints kept on disk"),
    "trainer.resume": Option(str, "", "auto | never | a run folder | a checkpoint folder"),
    "trainer.viz_every": Option(int, "[0, inf)", "GIFs of sample episodes every this many iterations (0 = never)"),
    "trainer.viz_episodes": Option(int, "[1, inf)", "episodes per GIF batch"),
    "ray.address": Option(str | None, "", "null: a local Ray | auto | host:port"),
    "ray.cpus_per_worker": Option(int | None, "[1, inf)", "CPU threads per Ray worker (null: automatic)"),
    # ---- diagnostics -------------------------------------------------------------------------------------------
    "diagnostics.compute_freq": Option(int, "[0, inf)", "MI proxies every this many iterations (0 = off)"),
    "diagnostics.scopes": Option(list[str], SCOPES.names, "what the MI proxies score"),
    "diagnostics.max_prompts": Option(int, "[2, inf)", "B: prompts each reasoning is scored under (MI needs 2)"),
    "diagnostics.max_reasonings": Option(int, "[1, inf)", "Z: reasoning samples scored"),
    "diagnostics.micro_batch": Option(int, "[1, inf)", "continuations per forward when scoring"),
    "diagnostics.image_probe": Option(bool, "", "score reasoning under another state's image and a blank one"),
    "diagnostics.mi_threshold_fraction": Option(float, "[0, 1]", "MI is high above this fraction of log B"),
    "diagnostics.h_threshold": Option(float | None, "[0, inf)", "H(Z|X) per token is high above this (null: auto)"),
    "diagnostics.echo_window": Option(int, "[2, inf)", "Echo Trap and policy collapse: iterations compared "
                                      "(older vs newer half)"),
    "diagnostics.echo_spike_factor": Option(float, "(1, inf)", "Echo Trap and policy collapse: a gradient-norm spike "
                                            "is this many times the recent median"),
    # ---- logger ------------------------------------------------------------------------------------------------
    "logger.wandb_mode": Option(str, WANDB_MODES, "offline | online | disabled"),
    "logger.project": Option(str, "", "wandb project"),
    "logger.run_name": Option(str | None, "", "wandb run name (null: the run folder's name)"),
    "logger.progress": Option(bool, "", "progress bar"),
    # ---- model -------------------------------------------------------------------------------------------------
    "model.name": Option(str, "", "short name used in logs and output paths"),
    "model.source": Option(str, model_sources, "how the model folder is found or built"),
    "model.path": Option(str | None, "", "hub name or local folder (source=pretrained, lora_adapter)"),
    "model.size": Option(str | None, "", "size of an offline-built model (tiny: test | default)"),
    "model.modality": Option(str, MODALITIES, "vision | text"),
    "model.dtype": Option(str, DTYPES, "weight dtype (auto: bf16 on GPU, fp32 on CPU)"),
    # ---- algorithm ---------------------------------------------------------------------------------------------
    "algorithm.name": Option(str, "", "preset name used in logs and output paths"),
    "algorithm.advantage": Option(str, ADVANTAGE_ESTIMATORS.names, "advantage estimator"),
    "algorithm.critic": Option(bool, "", "train a value model (gae, bilevel_gae)"),
    "algorithm.gamma": Option(float, "[0, 1]", "token-level discount"),
    "algorithm.lam": Option(float, "[0, 1]", "token-level GAE lambda"),
    "algorithm.gamma_turn": Option(float, "[0, 1]", "turn-level discount"),
    "algorithm.lam_turn": Option(float, "[0, 1]", "turn-level GAE lambda"),
    "algorithm.step_weight": Option(float, "[0, inf)", "gigpo: weight of the step-level advantage"),
    "algorithm.normalize_std": Option(bool, "", "gigpo: divide both levels by their group's std"),
    "algorithm.whiten_advantages": Option(bool, "", "normalise advantages over the batch's sampled tokens"),
    "algorithm.advantage_min": Option(float | None, "(-inf, 0]", "clamp advantages from below (0 = self-imitation); a "
                                      "positive floor would push up every sampled text, the worst ones included"),
    "algorithm.advantage_tokens": Option(str, ADVANTAGE_TOKENS, "the sampled tokens that carry the advantage: all, or "
                                         "only those after each turn's </think> (no policy gradient on the reasoning)"),
    "algorithm.sft_coef": Option(float, "[0, inf)", "weight of a supervised loss on the game's solver "
                                 "demonstrations, added to every optimizer step (0 = off)"),
    "algorithm.sft_batch_size": Option(int, "[1, inf)", "demonstration dialogues per optimizer step"),
    "algorithm.sft_episodes": Option(int, "[1, inf)", "demonstrations played when the run starts (levels 0..N-1)"),
    "algorithm.sft_source": Option(str, SFT_SOURCES, "what the demonstration loss imitates: the solver's play of "
                                   "levels 0..sft_episodes-1, or its turn at the states the rollouts visited"),
    "algorithm.sft_tokens": Option(str, SFT_TOKENS, "the demonstration tokens in that loss: whole responses, or only "
                                   "each turn's reasoning through </think> (the moves left to RL)"),
    "algorithm.clip_low": Option(float, "(0, 1)", "PPO ratio clip below: 1 - clip_low"),
    "algorithm.clip_high": Option(float, "(0, inf)", "PPO ratio clip above: 1 + clip_high"),
    "algorithm.dual_clip_c": Option(float | None, "(1, inf)", "dual clip for negative advantages (null = off)"),
    "algorithm.loss_agg": Option(str, LOSS_AGGREGATIONS.names, "loss aggregation over tokens and sequences"),
    "algorithm.entropy_coef": Option(float, "[0, inf)", "entropy bonus (a negative one would push entropy down)"),
    "algorithm.kl_coef": Option(float, "[0, inf)", "KL-to-reference weight (0 removes the reference model)"),
    "algorithm.kl_kind": Option(str, KL_ESTIMATORS.names, "KL estimator"),
    "algorithm.value_clip": Option(float | None, "(0, inf)", "clipped value loss range (critic only; null = off)"),
    # ---- filter ------------------------------------------------------------------------------------------------
    "filter.strategy": Option(str, FILTER_STRATEGIES.names, "group filter by reward spread"),
    "filter.value": Option(float, "(-inf, inf)", "the strategy's parameter (the strategy checks its range)"),
    "filter.stat": Option(str, SPREAD_STATS.names, "reward spread statistic per group"),
    "filter.empty_policy": Option(str, EMPTY_POLICIES, "when no group is kept: skip | reroll | keep_all"),
    "filter.max_rerolls": Option(int, "[0, inf)", "reroll attempts before skipping"),
    # ---- rollout -----------------------------------------------------------------------------------------------
    "rollout.engine": Option(str, ENGINES.names, "generation backend"),
    "rollout.max_new_tokens": Option(int, "[1, inf)", "tokens the policy may write per turn"),
    "rollout.temperature": Option(float, TEMPERATURE, "sampling temperature during training (0 = greedy)"),
    "rollout.top_p": Option(float, "(0, 1]", "nucleus sampling (1 = off)"),
    "rollout.max_context_tokens": Option(int, "[2, inf)", "dialogue budget in tokens"),
    "rollout.engine_kwargs.max_batch_size": Option(int | None, "[1, inf)", "hf: most contexts per generate call"),
    "rollout.engine_kwargs.keep_cache": Option(bool, "", "hf: keep keys and values for the next turn"),
    "rollout.engine_kwargs.gpu_memory_utilization": Option(float, "(0, 1]", "vllm: share of the GPU it reserves"),
    "rollout.engine_kwargs.enforce_eager": Option(bool, "", "vllm: no CUDA graphs"),
    "rollout.engine_kwargs.enable_sleep_mode": Option(bool, "", "vllm: free GPU memory during the update"),
    # ---- env (the game's own constructor checks what is specific to it) -----------------------------------------
    "env.id": Option(str, "", "Gymnasium id of the game"),
    "env.name": Option(str, "", "short name used in logs and output paths"),
    "env.kwargs.observation": Option(str, OBSERVATION_MODES, "text | image | text+image"),
    "env.kwargs.response_format": Option(str, RESPONSE_FORMATS, "how the policy must format its answer"),
    "env.kwargs.action_separator": Option(str, "", "between actions inside <answer>"),
    "env.kwargs.max_actions_per_turn": Option(int, "[1, inf)", "actions the model may give in one turn"),
    "env.kwargs.max_turns": Option(int | None, "[1, inf)", "turns per episode (K)"),
    "env.kwargs.max_steps": Option(int, "[1, inf)", "action budget per episode"),
    "env.kwargs.format_penalty": Option(float, PENALTY, "added for a malformed response (a positive one would "
                                        "reward writing garbage)"),
    "env.kwargs.grounding_coef": Option(float, BONUS, "turn reward += coef · grade of <observation>"),
    "env.kwargs.worldmodel_coef": Option(float, BONUS, "turn reward += coef · grade of <prediction>"),
    "env.kwargs.reasoning_coef": Option(float, BONUS, "episode reward += coef · share of turns whose <think> "
                                         "is the demonstration's"),
    "env.kwargs.reasoning_credit": Option(str, ("exact", "facts"), "what reasoning_coef pays a turn: its <think> "
                                          "equal to the demonstration's, or the share of its facts right"),
    "env.kwargs.step_penalty": Option(float, PENALTY, "reward per executed action"),
    "env.kwargs.step_penalty_on_solve": Option(bool, "", "step penalties charged at the solve, none on a fail"),
    "env.kwargs.mark_no_effect": Option(bool, "", "the feedback marks each executed action that changed nothing"),
    "env.kwargs.distance_shaping": Option(float, BONUS, "potential-based reward per action (0 = off)"),
    "env.kwargs.placement_reward": Option(float, BONUS, "reward per correct digit"),
    "env.kwargs.low_risk_reward": Option(float, REWARD, "bandit: the safe arm's payoff"),
    "env.kwargs.high_risk_reward": Option(float, REWARD, "bandit: the risky arm's payoff"),
    "env.kwargs.high_risk_prob": Option(float, "[0, 1]", "bandit: chance that the risky arm pays"),
    "env.kwargs.tile_px": Option(int, "[8, inf)", "pixels per tile of the image (bounded by memory)"),
    "env.kwargs.cell_px": Option(int, "[16, inf)", "pixels per Sudoku cell (bounded by memory)"),
    "env.kwargs.image_size": Option(list[int], "[1, inf)", "(width, height) of the image (bounded by memory)"),
    "env.kwargs.dim_room": Option(list[int], "[5, inf)", "Sokoban room (rows, cols), walls included"),
    "env.kwargs.size": Option(int, "[2, inf)", "grid side (FrozenLake, Navigation; Sudoku: 4 or 9)"),
    "env.kwargs.num_boxes": Option(int, "[1, inf)", "Sokoban boxes (and targets)"),
    "env.kwargs.cell_separator": Option(str, "", "between the cells of a grid row in the text"),
    "env.kwargs.list_positions": Option(bool, "", "a line under the grid lists the positions"),
    "env.kwargs.reading_walls": Option(bool, "", "Sokoban: the demonstrations' reading names the box's walls"),
    "env.kwargs.wall_labels": Option(bool, "", "Sokoban, with reading_walls: vision pre-training labels walls"),
    "env.kwargs.reading_push": Option(bool, "", "Sokoban: the demonstrations' reading names the plan's first push"),
    "env.kwargs.hole_labels": Option(bool, "", "FrozenLake: vision pre-training labels each tile's hole neighbours"),
    "env.kwargs.level_set": Option(str | None, "", "Boxoban level file (null: generated rooms)"),
    "env.kwargs.num_levels": Option(int | None, "[1, inf)", "the first levels of the level set"),
    "env.kwargs.p_frozen": Option(float, "(0, 1]", "FrozenLake: chance that a random cell is frozen"),
    "env.kwargs.success_rate": Option(float, "[0, 1]", "FrozenLake: chance that a move goes where intended"),
    "env.kwargs.desc": Option(list[str] | None, "", "FrozenLake: an explicit map (null: random)"),
    "env.kwargs.num_objects": Option(int, "[1, 9]", "Navigation: objects in the room"),
    "env.kwargs.num_walls": Option(int, "[0, inf)", "Navigation: random interior wall cells"),
    "env.kwargs.num_blanks": Option(int | None, "[1, inf)", "Sudoku: blank cells (null: the size's default)"),
    "env.kwargs.num_cards": Option(int, "[2, 4]", "Cards: cards dealt per episode"),
    "env.kwargs.target": Option(int, "(-inf, inf)", "Cards: the number the formula must equal"),
    "env.kwargs.face_value": Option(str, ("ten", "rank"), "Cards: what J, Q, K count"),
    "env.kwargs.num_numbers": Option(int, "[3, 4]", "Countdown: how many numbers are given"),
    "env.kwargs.max_number": Option(int, "[2, inf)", "Countdown: largest number given"),
    "env.kwargs.max_target": Option(int, "[1, inf)", "Countdown: largest target"),
    "env.kwargs.low_risk_name": Option(str, "", "bandit: name of the safe arm"),
    "env.kwargs.high_risk_name": Option(str, "", "bandit: name of the risky arm"),
    "env.kwargs.render_mode": Option(str | None, "", "Gymnasium render mode"),
}
# fmt: on


# ---- reading the table ---------------------------------------------------------------------------------------------
def _unwrap(kind: Any) -> tuple[Any, bool]:
    """(the type without None, whether null is allowed)."""
    if isinstance(kind, UnionType) or get_origin(kind) is Union:
        args = [arg for arg in get_args(kind) if arg is not type(None)]
        return args[0], True
    return kind, False


def _parse(spec: str) -> list[tuple[float, float, bool, bool]]:
    """ "0 | [0.01, 100]" -> [(0, 0, True, True), (0.01, 100, True, True)]: (low, high, low included, high included)."""
    parts = []
    for part in spec.split("|"):
        part = part.strip()
        match = re.fullmatch(r"([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])", part)
        if match is None:
            parts.append((float(part), float(part), True, True))
        else:
            parts.append((float(match[2]), float(match[3]), match[1] == "[", match[4] == "]"))
    return parts


def _in_range(value: float, spec: str) -> bool:
    return any(
        (low < value or (closed_low and low == value)) and (value < high or (closed_high and high == value))
        for low, high, closed_low, closed_high in _parse(spec)
    )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _range_words(spec: str) -> str:
    """ "(0, 1]" -> "> 0 and <= 1", "[1, inf)" -> ">= 1", "0 | [0.01, 100]" -> "0, or >= 0.01 and <= 100"."""
    words = []
    for low, high, closed_low, closed_high in _parse(spec):
        if low == high:
            words.append(_number(low))
            continue
        bounds = []
        if low != -math.inf:
            bounds.append(f"{'>=' if closed_low else '>'} {_number(low)}")
        if high != math.inf:
            bounds.append(f"{'<=' if closed_high else '<'} {_number(high)}")
        words.append(" and ".join(bounds) if low != -math.inf or not bounds else f"a number {bounds[0]}")
    return ", or ".join(words)


def _choices(option: Option) -> list[str]:
    values = option.values() if callable(option.values) else option.values
    return list(values)


def expectation(option: Option) -> str:
    """What the option must be, in words ("a whole number >= 1", "> 0 and <= 1", "true or false", ...)."""
    kind, nullable = _unwrap(option.type)
    item = get_args(kind)[0] if get_origin(kind) is list else None
    if kind is bool:
        text = "true or false"
    elif kind is int:
        text = f"a whole number {_range_words(option.values)}".strip()
    elif kind is float:
        text = _range_words(option.values) or "a finite number"
    elif item is not None:
        what = "whole numbers " + _range_words(option.values) if item is int else f"names from {_choices(option)}"
        text = f"a non-empty list of {what}" if option.values else "a non-empty list of strings"
    else:
        text = f"one of {_choices(option)}" if option.values else "a string"
    return f"{text} (or null)" if nullable else text


def options_reference() -> str:
    """docs/options.md: every option of `OPTIONS` by section, with what it must be and what it means (a test keeps
    the page equal to this text)."""
    lines = [
        "# Training options",
        "",
        "Every option of `configs/train.yaml` and its groups, generated from `OPTIONS` in `vagen/trainer/config.py`,",
        "the table that `check_options` validates a run against before any model loads. Set any of them on the",
        "command line: `python scripts/train.py env=sokoban_visual trainer.lr=1e-4`. The keys of `env.kwargs` are",
        "the game's own constructor arguments; the ones below are those of the shipped game configs. The defaults",
        "are those files' values, then `configs/tuned/<env>-<model>-<algorithm>.yaml` where one exists (the",
        "settings measured best for that combination; `~tuned` drops them).",
    ]
    section = None
    for key, option in OPTIONS.items():
        head = key.split(".")[0] if "." in key else "run"
        if head != section:
            section = head
            lines += ["", f"## {section}", "", "| option | must be | meaning |", "|---|---|---|"]
        must = expectation(option).replace("|", "\\|")
        lines.append(f"| `{key}` | {must} | {option.doc.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


def check_value(key: str, option: Option, value: Any) -> None:
    """Raise a ValueError naming `key`, what it must be and what it means unless `value` fits `option`."""
    kind, nullable = _unwrap(option.type)
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    doc = f" {option.doc[0].upper()}{option.doc[1:]}."
    if value is None:
        if nullable:
            return
        raise ValueError(f"{key} is null but must be {expectation(option)}.{doc}")
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}={value!r} must be true or false.{doc}")
    elif kind is int:
        if not isinstance(value, int) or isinstance(value, bool) or not _in_range(value, option.values):
            raise ValueError(f"{key}={value!r} must be {expectation(option)}.{doc}")
    elif kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{key}={value!r} is not a number: it must be {expectation(option)}.{doc}")
        if not math.isfinite(value):
            raise ValueError(f"{key}={value!r} is not a finite number: it must be {expectation(option)}.{doc}")
        if not _in_range(value, option.values):
            raise ValueError(f"{key}={value!r} must be {expectation(option)}.{doc}")
    elif get_origin(kind) is list:
        _check_list(key, option, value, get_args(kind)[0], doc)
    elif not isinstance(value, str):  # e.g. run_dir=5, which Hydra reads as a number
        quoted = f"; quote it on the command line: {key}=\"'{value}'\"" if isinstance(value, (int, float)) else ""
        raise ValueError(f"{key}={value!r} must be {expectation(option)}{quoted}.{doc}")
    elif option.values and value not in _choices(option):
        raise ValueError(f"Unknown {key}={value!r}; valid: {_choices(option)}.")


def _check_list(key: str, option: Option, value: Any, item: type, doc: str) -> None:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{key}={value!r} must be {expectation(option)}.{doc}")
    for entry in value:
        if item is int:
            if not isinstance(entry, int) or isinstance(entry, bool) or not _in_range(entry, option.values):
                raise ValueError(f"{key}={value!r} must be {expectation(option)}.{doc}")
        elif not isinstance(entry, str):
            raise ValueError(f"{key}={value!r} must be {expectation(option)}.{doc}")
        elif option.values and entry not in _choices(option):
            raise ValueError(f"Unknown {key} entry {entry!r}; valid: {_choices(option)}.")


def _leaves(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _leaves(value, f"{prefix}{name}.")
    elif prefix:
        yield prefix[:-1]


def _is_open(key: str) -> bool:
    return any(key.startswith(f"{section}.") for section in OPEN_SECTIONS)


def closest_option(key: str, known: Sequence[str]) -> str:
    """ " Did you mean trainer.iterations?" for a misspelt key, or ""."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" Did you mean {close[0]}?" if close else ""


def check_options(cfg: Any) -> None:
    """Every option of `OPTIONS` present (those in `OPEN_SECTIONS` where given) and of its type and range; no key the
    table does not know in the sections it owns. Top-level sections it does not own (a script's own, such as
    grad_noise's `noise:`) are left to their script."""
    owned = {key.split(".")[0] for key in OPTIONS}
    for key in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        if key.split(".")[0] in owned and key not in OPTIONS and not _is_open(key):
            raise ValueError(
                f"Unknown option {key!r} (added with +?).{closest_option(key, list(OPTIONS))} Every option is "
                "documented in configs/ (train.yaml and its groups)."
            )
    missing = object()
    for key, option in OPTIONS.items():
        value = OmegaConf.select(cfg, key, default=missing)
        if value is missing:
            if _is_open(key):
                continue
            raise ValueError(f"Option {key} is missing (removed with ~?); it is the {option.doc}. Restore it.")
        check_value(key, option, value)


# ---- checks across options ----------------------------------------------------------------------------------------
def _choice(value: Any, valid: list[str], key: str) -> None:
    if value not in valid:
        raise ValueError(f"Unknown {key}={value!r}; valid: {valid}.")


def _check_optimizer(trainer: Any) -> None:
    if trainer.max_grad_norm <= trainer.adam_eps:
        raise ValueError(
            f"trainer.max_grad_norm={trainer.max_grad_norm} must exceed trainer.adam_eps={trainer.adam_eps}: gradients "
            "clipped below eps make every AdamW step about lr·g/eps, i.e. no update. Raise trainer.max_grad_norm "
            "(1.0 is usual)."
        )
    for lr_key in ("lr", "critic_lr"):
        if trainer[lr_key] * trainer.weight_decay >= 1:
            raise ValueError(
                f"trainer.{lr_key}={trainer[lr_key]} times trainer.weight_decay={trainer.weight_decay} must be < 1: "
                "AdamW multiplies every weight by 1 - lr·weight_decay each step. Lower trainer.weight_decay."
            )
    given = trainer.lr_decay_start
    if given >= 1 and given != int(given):
        raise ValueError(
            f"trainer.lr_decay_start={given} is neither an iteration (a whole number) nor a fraction of the decay's "
            "end (below 1). Write an iteration such as 117, or a fraction such as 0.75."
        )
    start, end = lr_decay_start(trainer), lr_decay_end(trainer)
    if trainer.lr_schedule != "constant" and end <= start:
        raise ValueError(
            f"trainer.lr_schedule={trainer.lr_schedule} decays from iteration {start} (trainer.lr_decay_start={given}) "
            f"to iteration {end} (trainer.lr_decay_end, or trainer.iterations where it is null): an empty decay. Set "
            "trainer.lr_decay_end above trainer.lr_decay_start."
        )


def lr_decay_end(trainer: Any) -> int:
    """The iteration where a decaying learning rate reaches 0: `trainer.lr_decay_end`, else `trainer.iterations`."""
    return trainer.iterations if trainer.lr_decay_end is None else trainer.lr_decay_end


def lr_decay_start(trainer: Any) -> int:
    """The iteration where the decay begins: `trainer.lr_decay_start`, or below 1 that fraction of `lr_decay_end`
    (rounded, and at least one iteration before it), so a decay over the last quarter of any budget is `0.75`, and a
    run too short for one (2 iterations) trains at the full rate instead of stopping on an empty decay."""
    start, end = trainer.lr_decay_start, lr_decay_end(trainer)
    return max(0, min(round(start * end), end - 1)) if start < 1 else int(start)


def _check_levels(trainer: Any) -> None:
    pool = trainer.level_pool
    if not (pool == 0 or trainer.groups <= pool <= SEED_STRIDE):
        raise ValueError(
            f"trainer.level_pool={pool!r} must be 0 (new levels every iteration) or a whole number from "
            f"trainer.groups={trainer.groups} (so one batch never plays a level twice) to {SEED_STRIDE}."
        )
    if trainer.level_sampler == "frontier" and pool:
        raise ValueError(
            f"trainer.level_sampler=frontier chooses among new levels; trainer.level_pool={pool} would fix them. Set "
            "trainer.level_pool=0, or trainer.level_sampler=fresh."
        )
    if trainer.level_sampler != "plr":
        return
    plr = trainer.plr
    if plr.buffer_size < trainer.groups:
        raise ValueError(
            f"trainer.plr.buffer_size={plr.buffer_size} is below trainer.groups={trainer.groups}: replay starts once "
            f"the buffer holds a batch of levels, so it would never replay. Raise it to at least {trainer.groups}."
        )
    # With no staleness term, (1/rank)^(1/β) must stay above 0 for the lowest rank, or fewer levels than a batch
    # replays can have any probability left and the draw fails mid-run.
    if plr.staleness == 0 and math.log(plr.buffer_size) / plr.temperature > 700:
        lowest = math.log(plr.buffer_size) / 700
        raise ValueError(
            f"trainer.plr.temperature={plr.temperature} with trainer.plr.staleness=0 gives the lower-ranked of "
            f"{plr.buffer_size} levels probability 0 (underflow); raise the temperature above {lowest:.3g} or set "
            "trainer.plr.staleness > 0."
        )


def _check_algorithm(cfg: Any) -> None:
    algo, trainer, filt = cfg.algorithm, cfg.trainer, cfg.filter
    if algo.advantage in CRITIC_ESTIMATORS and not algo.critic:
        raise ValueError(
            f"algorithm.advantage={algo.advantage} needs a value model: set algorithm.critic=true "
            "(or use algorithm=ppo / starpo_s), or pick a critic-free estimator such as grpo."
        )
    if algo.advantage in GROUP_ESTIMATORS and trainer.group_size < 2:
        raise ValueError(
            f"algorithm.advantage={algo.advantage} compares rollouts within a group, so "
            f"trainer.group_size={trainer.group_size} must be >= 2."
        )
    if filt.strategy != "none" and trainer.group_size < 2:
        raise ValueError(
            f"filter.strategy={filt.strategy} ranks groups by reward spread, which needs "
            "trainer.group_size >= 2 (or use filter=none)."
        )
    # Options that shape the demonstration loss, set away from their default while the loss is off.
    shaping = {"sft_source": ("visited", "what"), "sft_tokens": ("think", "which tokens")}
    for key, (value, says) in shaping.items():
        if algo[key] == value and algo.sft_coef == 0:
            raise ValueError(
                f"algorithm.{key}={value} says {says} the demonstration loss imitates, but algorithm.sft_coef=0 turns "
                f"that loss off: set algorithm.sft_coef > 0 (e.g. 1), or drop {key}."
            )
    if algo.sft_tokens == "think" and cfg.env.kwargs.get("response_format") == "no_think":
        raise ValueError(
            "algorithm.sft_tokens=think imitates only each demonstration turn's <think> text, but "
            "env.kwargs.response_format=no_think writes none, so the loss would have no tokens: use sft_tokens=all, "
            "or a response format with a <think> part (free_think)."
        )
    if algo.advantage_tokens == "answer" and cfg.env.kwargs.get("response_format") == "no_think":
        raise ValueError(
            "algorithm.advantage_tokens=answer withholds the advantage from each turn's <think> text, but "
            "env.kwargs.response_format=no_think writes none, so it would change nothing: use advantage_tokens=all, "
            "or a response format with a <think> part (free_think)."
        )
    # The strategy checks its own parameter (with its own fix in the message): ask it now, on a dummy group.
    FILTER_STRATEGIES.get(filt.strategy)(
        torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.bool), float(filt.value)
    )


def _check_batches(cfg: Any) -> None:
    trainer, rollout, diagnostics = cfg.trainer, cfg.rollout, cfg.diagnostics
    if trainer.micro_batch_size > trainer.mini_batch_size:
        raise ValueError(
            f"trainer.micro_batch_size={trainer.micro_batch_size} exceeds trainer.mini_batch_size="
            f"{trainer.mini_batch_size}; make it at most the mini-batch (micro-batches accumulate into one)."
        )
    if rollout.max_new_tokens >= rollout.max_context_tokens:
        raise ValueError("rollout.max_new_tokens must be smaller than rollout.max_context_tokens.")
    if diagnostics.echo_window % 2:
        raise ValueError(
            f"diagnostics.echo_window={diagnostics.echo_window} must be even: the Echo Trap monitor compares its "
            "older half with its newer half."
        )
    if trainer.lora.enabled and trainer.lora.dropout > 0:
        raise ValueError(
            f"trainer.lora.dropout={trainer.lora.dropout} would have no effect: RL updates run without dropout, so "
            "that the old and new log-probs come from the same function and the first PPO ratio is exactly 1. "
            "Set trainer.lora.dropout=0."
        )


# Bytes one token position of a batch holds at least: the padded ids, masks, rewards, log-probs (rollout, old,
# reference), values, advantages and returns of `TokenBatch`, and the trajectories' token lists.
BYTES_PER_TOKEN = 128
BYTES_PER_DRAW = 8  # the hf engine draws its (contexts, max_new_tokens) float64 sampling stream up front
BYTES_PER_PIXEL = 16  # an observation image in a batch: PIL's 4 bytes per RGB pixel + float32 pixel values


def check_batch_memory(cfg: Any, image_pixels: int = 0) -> None:
    """Refuse, from the memory this machine has, a batch that cannot fit before anything allocates it: dialogues ×
    `rollout.max_context_tokens` positions, the sampling draws of `rollout.max_new_tokens`, and every turn's image
    (`image_pixels` per observation). A lower bound, model aside (the memory plan adds the model's part)."""
    available = available_memory("cpu")
    if available is None:
        return
    budget, where = available
    trainer, rollout = cfg.trainer, cfg.rollout
    dialogues = max(trainer.groups * trainer.group_size, trainer.eval_episodes * trainer.eval_samples)
    turns = int(cfg.env.kwargs.get("max_turns") or 1)
    parts = {  # what takes the memory -> (bytes per dialogue, the option to lower)
        f"rollout.max_context_tokens={rollout.max_context_tokens}": (
            rollout.max_context_tokens * BYTES_PER_TOKEN,
            "rollout.max_context_tokens",
        ),
        f"rollout.max_new_tokens={rollout.max_new_tokens}": (
            rollout.max_new_tokens * BYTES_PER_DRAW,
            "rollout.max_new_tokens",
        ),
        f"The {image_pixels}-pixel images of env={cfg.env.name}": (
            turns * image_pixels * BYTES_PER_PIXEL,
            "the image size (env.kwargs.tile_px, cell_px or image_size) or env.kwargs.max_turns",
        ),
    }
    need = dialogues * sum(size for size, _ in parts.values())
    if need > budget:
        biggest = max(parts, key=lambda name: parts[name][0])
        raise ValueError(
            f"{biggest}: a batch of {dialogues} dialogues (trainer.groups × trainer.group_size, or "
            f"trainer.eval_episodes × trainer.eval_samples) needs at least {need / GIB:,.1f} GiB for its token tensors "
            f"and images, but {where} is {budget / GIB:.1f} GiB. Lower {parts[biggest][1]}, or the number of dialogues."
        )


def check_environment(cfg: Any) -> None:
    """What the machine must provide: the device, the engine and its options, a folder to resume, peft."""
    if cfg.device == "cuda" and cfg.trainer.workers == 1 and not torch.cuda.is_available():
        raise ValueError(
            "device=cuda but torch finds no CUDA GPU here (torch.cuda.is_available() is False); use device=auto "
            "(cuda where there is one) or device=cpu."
        )
    rollout = cfg.rollout
    if rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "rollout.engine=vllm needs vLLM, which is not installed: pip install -e .[gpu]; or rollout=hf."
        )
    if rollout.engine == "hf":  # its options are its constructor's (vLLM passes its own on to vllm.LLM)
        names = [name for name in inspect.signature(ENGINES.get("hf")).parameters if name not in ("model", "processor")]
        for name in rollout.engine_kwargs:
            if name not in names:
                raise ValueError(
                    f"rollout.engine_kwargs.{name} is not an option of rollout.engine={rollout.engine} (its options: "
                    f"{names}).{closest_option(name, names)}"
                )
    on_gpu = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if rollout.engine == "vllm" and rollout.engine_kwargs.get("enable_sleep_mode") and not on_gpu:
        raise ValueError(
            "rollout.engine_kwargs.enable_sleep_mode=true frees GPU memory during the update, and vLLM has sleep mode "
            "on CUDA/ROCm only; set it to false on CPU."
        )
    resume = cfg.trainer.resume
    if resume not in ("auto", "never") and not Path(resume).is_dir():
        raise ValueError(f"trainer.resume={resume!r} is not a folder; use auto, never, a run folder or a checkpoint.")
    check_workers(cfg)
    if cfg.trainer.lora.enabled:
        require_peft("trainer.lora.enabled")


def check_env(cfg: Any) -> None:
    """Build the env of `cfg` (its constructor refuses what is specific to the game, and sizes that cannot fit in
    memory), check that a batch of its images fits (`check_batch_memory`) before the first is drawn, then reset it
    once; and that the game has the solver the frontier sampler needs, and the solver and demonstration reasoning that
    `algorithm.sft_coef` trains on."""
    env_cfg = cfg.env
    kwargs = OmegaConf.to_container(env_cfg.kwargs, resolve=True)
    try:
        env = make_env(env_cfg.id, **kwargs)
    except TypeError as error:
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(error))
        if unknown is None:
            raise ValueError(f"env={env_cfg.name} ({env_cfg.id}) refuses its env.kwargs: {error}") from None
        documented = [key.split(".")[-1] for key in OPTIONS if key.startswith("env.kwargs.")]
        hint = closest_option(unknown[1], documented)
        raise ValueError(
            f"env.kwargs.{unknown[1]} is not an option of env={env_cfg.name} ({env_cfg.id}).{hint} Its options are "
            f"documented in configs/env/{env_cfg.name}.yaml."
        ) from None
    except ValueError as error:  # an unknown env.id, or a value the game refuses
        raise ValueError(f"env={env_cfg.name}: {error}") from None
    shows_images = kwargs.get("observation", "text") != "text"
    planned = getattr(env.unwrapped, "image_pixels", 0) if shows_images else 0  # set by the visual envs
    check_batch_memory(cfg, planned)
    try:
        observation, _ = env.reset(seed=cfg.seed)
    except ValueError as error:
        raise ValueError(f"env={env_cfg.name} ({env_cfg.id}) refuses its env.kwargs: {error}") from None
    drawn = max((image.width * image.height for image in observation.images), default=0)
    if drawn > planned:
        check_batch_memory(cfg, drawn)
    game = env.unwrapped
    if cfg.trainer.level_sampler == "frontier" and not game.supports_solver:
        raise ValueError(
            f"trainer.level_sampler=frontier sorts levels by the solver's distance, and env={env_cfg.name} has no "
            "solver (solver_actions). Use trainer.level_sampler=plr or fresh for this game."
        )
    lacking = [
        name
        for name, has in (("solver_actions", game.supports_solver), ("demo_reasoning", game.supports_demo_reasoning))
        if not has
    ]
    if cfg.algorithm.sft_coef > 0 and lacking:
        raise ValueError(
            f"algorithm.sft_coef={cfg.algorithm.sft_coef} trains on solver demonstrations of env={env_cfg.name}, but "
            f"{type(game).__name__} has no {' and no '.join(lacking)}(). Set algorithm.sft_coef=0, or implement "
            "solver_actions() and demo_reasoning() for the game."
        )
    if cfg.algorithm.sft_source == "visited" and game.state_key() is None:
        raise ValueError(
            f"algorithm.sft_source=visited replays each episode to label its states and checks them by state_key(), "
            f"which {type(game).__name__} does not give. Use algorithm.sft_source=solver, or implement state_key()."
        )
    env.close()


# ---- the check before a run ----------------------------------------------------------------------------------------
def check_overrides(config_dir: str, config_name: str, overrides: list[str]) -> None:
    """Compose the command line's overrides once, turning Hydra's error for a misspelt option (which advises
    `+key=...`, adding a key nothing reads) into a ValueError that names the closest real option; a key added with `+`
    must be new and belong to a mapping passed whole to a constructor (`OPEN_SECTIONS`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    plain = [o for o in overrides if not o.startswith(("hydra.", "+", "~", "-")) and "=" in o]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        try:
            composed = compose(config_name, overrides=plain)
        except HydraException as error:
            match = re.search(r"Could not override '([^']+)'", str(error))
            if match is None:  # e.g. model=<no such config>: Hydra's message already lists the valid ones
                raise ValueError(str(error).split("\nConfig search path")[0]) from None
            key = match.group(1)
            if key in OPTIONS:  # a documented option that the composed yamls (this env's, say) do not set
                raise ValueError(
                    f"{key} is an option that the chosen configs do not set, so it is added, not overridden: "
                    f"write +{key}=... (docs/options.md)."
                ) from None
            known = list(_leaves(OmegaConf.to_container(compose(config_name), resolve=False)))
            raise ValueError(
                f"Unknown option {key!r}.{closest_option(key, known)} Every option is documented in configs/ "
                "(train.yaml and its groups)."
            ) from None
    known = list(_leaves(OmegaConf.to_container(composed, resolve=False)))
    for override in overrides:
        if not override.startswith("+") or "=" not in override or override.startswith("++"):
            continue
        key = override[1:].split("=", 1)[0]
        if OmegaConf.select(composed, key, default=None) is not None:
            raise ValueError(f"{key} is already an option: set it without the + ({override[1:]}).")
        if not _is_open(key):
            raise ValueError(
                f"Unknown option {key!r} (added with +).{closest_option(key, known)} Only keys of "
                f"{', '.join(OPEN_SECTIONS[:2])} can be added; every option is documented in configs/."
            )


def tuned_line(config_dir: str, choice: str | None, cfg: Any) -> str | None:
    """The line a run prints when configs/tuned/<choice>.yaml (train.yaml's `tuned` entry: <env>-<model>-<algorithm>)
    set some of its options: each with the value the run uses (the command line may have overridden it); None where
    no such file exists or `~tuned` dropped it."""
    if choice is None:
        return None
    path = Path(config_dir) / "tuned" / f"{choice}.yaml"
    if not path.is_file():
        return None
    values = {key: OmegaConf.select(cfg, key) for key in _leaves(OmegaConf.to_container(OmegaConf.load(path)))}
    settings = " ".join(f"{key}={str(v).lower() if isinstance(v, bool) else v}" for key, v in values.items())
    return f"Tuned for {choice} (configs/tuned/{path.name}): {settings}. key=value overrides one; ~tuned drops all."


def check_model_reads_env(cfg: Any) -> None:
    """Raise when the env shows images to a text-only model (cfg.env, cfg.model as in configs/)."""
    observation = cfg.env.kwargs.get("observation", "text")
    if observation != "text" and cfg.model.modality == "text":
        raise ValueError(
            f"env={cfg.env.name} shows images (observation={observation}) but model={cfg.model.name} reads text "
            f"only: use the text variant of the env (e.g. env={cfg.env.name.replace('_visual', '_text')}) or a "
            "vision-language model (model=tiny_vl, model=qwen2_5_vl_3b)."
        )


def check_workers(cfg: Any) -> None:
    """`trainer.workers > 1` needs Ray and at least one whole group per worker."""
    workers, groups = cfg.trainer.workers, cfg.trainer.groups
    if workers == 1:
        return
    if groups < workers:
        raise ValueError(
            f"trainer.workers={workers} exceeds trainer.groups={groups}: groups are never split, so each worker needs "
            f"one; raise trainer.groups to at least {workers} or lower trainer.workers."
        )
    try:
        import ray  # noqa: F401
    except ImportError as error:
        message = f"trainer.workers={workers} runs on Ray, which is not installed: pip install -e .[ray]."
        raise ValueError(message) from error


def validate_config(cfg: Any) -> None:
    """Raise `ValueError` for an option out of its type or range (`OPTIONS`) or an incompatible combination, naming
    the option to change; then build the env once. Everything here runs before any model loads."""
    if OmegaConf.select(cfg, "rollout.engine") == "api":  # an engine, but not one that can train
        raise ValueError(
            "rollout.engine=api cannot train: a chat server answers text, not the sampled token ids and log-probs "
            "training needs. Use rollout=hf or rollout=vllm; to benchmark a served model, run "
            "scripts/evaluate.py engine=api engine.model=<name>."
        )
    check_options(cfg)
    trainer = cfg.trainer
    _check_optimizer(trainer)
    _check_levels(trainer)
    _check_algorithm(cfg)
    _check_batches(cfg)
    check_model_reads_env(cfg)
    check_environment(cfg)
    check_env(cfg)


def warn_without_state_key(cfg: Any) -> bool:
    """Warn (once, here) when `algorithm.advantage=gigpo` meets a game without `state_key()`: every turn then lacks an
    anchor state and GiGPO is its episode level alone (GRPO's advantage, or its mean_norm). Returns whether it
    warned."""
    if cfg.algorithm.advantage != "gigpo":
        return False
    env = make_env(cfg.env.id, **cfg.env.kwargs)
    env.reset(seed=cfg.seed)
    if env.unwrapped.state_key() is not None:
        return False
    warnings.warn(
        f"env={cfg.env.name} has no state_key(), so algorithm.advantage=gigpo finds no anchor states and falls back "
        "to its episode-level advantage. Implement LanguageEnv.state_key for the game to get step credit, or choose "
        "algorithm=grpo to say so.",
        stacklevel=2,
    )
    return True


def check_prompt_fits(cfg: Any, tokenizer: Any, image_processor: Any | None) -> int:
    """Length of the first prompt of the env; raises if it and one response overflow the context budget."""
    env = make_env(cfg.env.id, **cfg.env.kwargs)
    observation, _ = env.reset(seed=cfg.seed)
    prompt = DialogueFormatter(tokenizer, image_processor).first_prompt(observation)
    needed = len(prompt) + cfg.rollout.max_new_tokens
    if needed > cfg.rollout.max_context_tokens:
        raise ValueError(
            f"The first prompt of env={cfg.env.name} is {len(prompt)} tokens; with rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens} it needs {needed} > rollout.max_context_tokens="
            f"{cfg.rollout.max_context_tokens}. Raise rollout.max_context_tokens to at least {needed}."
        )
    return len(prompt)
