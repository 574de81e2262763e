"""Which first move a policy prefers on held-out states, teacher-forced: what training changed in its decisions,
without sampling noise.

Held-out success is a sampled outcome: 256 episodes put a ±6-point interval on it, so a policy whose decisions got a
little better reads as "no measurable change". This probe takes the sampling out. On fixed held-out states it writes,
for every action of the game, the one-action response a demonstration would give there (`described_response`: the
game's demonstration reasoning, then that action, in the env's response format) and scores each under the policy
(`cross_scores`: one prompt forward per state, the responses as batched continuations). The softmax over the actions
is the policy's preference among first moves given a correct reading of the state. Its mass on the solver's optimal
moves (those that shorten the fewest-moves plan by one, or solve) says how well the policy decides, and the same
states scored under two models give a paired change (`paired_mass_change`). Games need `solver_actions()` and
`demo_reasoning()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import torch
from PIL import Image

from vagen.diagnostics.scoring import Reasoning, ScoringJob, ScoringPrompt, cross_scores
from vagen.env.policies import described_response
from vagen.eval.summary import paired_change
from vagen.rollout import DialogueFormatter


@dataclass(frozen=True)
class ProbeState:
    """A held-out start state: its first prompt, the one-action demonstration response of each action
    (`action_names` order) as token ids, and which of those actions are optimal."""

    seed: int
    prompt_ids: list[int]
    images: list[Image.Image]
    responses: list[list[int]]
    optimal: list[bool]


def check_probeable(env: gymnasium.Env) -> None:
    """Raise a ValueError naming what is missing when the game has no solver or no demonstration reasoning."""
    env.reset(seed=0)
    try:
        env.unwrapped.solver_actions()
        env.unwrapped.demo_reasoning()
    except NotImplementedError as missing:
        raise ValueError(f"{missing} The probe needs the game's optimal moves and its demonstration's reading of the "
                         "state (Sokoban and FrozenLake have both).") from None  # fmt: skip


def optimal_first_actions(env: gymnasium.Env, seed: int) -> list[bool] | None:
    """For each action of the game at `reset(seed)`: does it solve, or shorten the solver's plan by one? None where
    the start is already solved or has no plan (nothing to decide)."""
    env.reset(seed=seed)
    game = env.unwrapped
    distance = len(game.solver_actions())
    if distance == 0:
        return None
    optimal = []
    for action in game.action_names:
        env.reset(seed=seed)
        _, _, _, _, info = env.step(described_response(env, [action], game.demo_reasoning()))
        optimal.append(bool(info["success"]) or len(game.solver_actions()) == distance - 1)
    return optimal


def probe_states(
    make_env: Callable[[], gymnasium.Env], formatter: DialogueFormatter, seeds: Sequence[int]
) -> list[ProbeState]:
    """The probe's states at `seeds` (states with nothing to decide are left out)."""
    env, states = make_env(), []
    for seed in seeds:
        optimal = optimal_first_actions(env, seed)
        if optimal is None:
            continue
        observation, _ = env.reset(seed=seed)
        reasoning = env.unwrapped.demo_reasoning()
        texts = [described_response(env, [action], reasoning) for action in env.unwrapped.action_names]
        responses = [formatter.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        prompt = formatter.first_prompt(observation)
        states.append(ProbeState(seed, prompt, list(observation.images), responses, optimal))
    env.close()
    return states


def move_preferences(model: torch.nn.Module, processor: Any, states: Sequence[ProbeState]) -> np.ndarray:
    """(S, A) float64: per state, the softmax over actions of the policy's log-prob of each one-action response."""
    rows = []
    for state in states:
        job = ScoringJob(
            [ScoringPrompt(state.prompt_ids, state.images, identity=0)],
            [Reasoning(ids, (0, len(ids)), source=0) for ids in state.responses],
        )
        scores, _ = cross_scores(model, processor, job, micro_batch=len(state.responses))
        rows.append(torch.softmax(scores[:, 0].double(), dim=0).numpy())
    return np.stack(rows)


def optimal_mass(preferences: np.ndarray, optimal: np.ndarray) -> np.ndarray:
    """(S,) the preference mass on each state's optimal actions; `optimal` (S, A) bool."""
    return (preferences * optimal).sum(axis=1)


def probe_summary(preferences: np.ndarray, optimal: np.ndarray) -> dict[str, float]:
    """Mean mass on optimal moves, the share of states whose preferred move is optimal, and both for a policy
    that picks uniformly (chance)."""
    uniform = np.full_like(preferences, 1.0 / preferences.shape[1])
    return {
        "optimal_mass": float(optimal_mass(preferences, optimal).mean()),
        "top_move_optimal": float(optimal[np.arange(len(optimal)), preferences.argmax(axis=1)].mean()),
        "chance": float(optimal_mass(uniform, optimal).mean()),
        "states": float(len(optimal)),
    }


def paired_mass_change(
    seeds: Sequence[int], before: np.ndarray, after: np.ndarray, optimal: np.ndarray
) -> tuple[float, float, float, int]:
    """Mean per-state change of the mass on optimal moves from `before` to `after` (both (S, A) on the same states),
    with its 95% interval over states (`paired_change`)."""
    mass_before, mass_after = optimal_mass(before, optimal), optimal_mass(after, optimal)
    return paired_change(dict(zip(seeds, mass_before, strict=True)), dict(zip(seeds, mass_after, strict=True)))
