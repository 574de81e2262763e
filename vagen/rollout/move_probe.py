"""The states of the first-move probe: held-out starts, each action's one-action demonstration response, and which
actions are optimal (the scoring is `vagen.diagnostics.move_preference`).

Held-out success is a sampled outcome: 256 episodes put a ±6-point interval on it, so a policy whose decisions got a
little better reads as "no measurable change". The probe takes the sampling out. At a held-out start it writes, for
every action of the game, the response a demonstration would give there with that one action (`described_response`:
the game's demonstration reasoning, then the action, in the env's response format). Scored under a policy, the
softmax over those responses is its preference among first moves given a correct reading of the state, and the
solver says which moves are optimal (they shorten its fewest-moves plan by one, or solve). Games need named moves
(`action_names`; not a free-form answer such as a Cards or Countdown formula), `solver_actions()`, `demo_reasoning()`
and deterministic moves (not slippery FrozenLake).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium
from PIL import Image

from vagen.env.policies import described_response
from vagen.rollout.context import DialogueFormatter


@dataclass(frozen=True)
class ProbeState:
    """A held-out start: its first prompt, the one-action demonstration response of each action (`action_names`
    order) as token ids, and which of those actions are optimal."""

    seed: int
    prompt_ids: list[int]
    images: list[Image.Image]
    responses: list[list[int]]
    optimal: list[bool]


def check_probeable(env: gymnasium.Env) -> None:
    """Raise a ValueError naming what is missing when the game has no finite set of moves (its answer is one
    free-form action, e.g. a formula), no solver or no demonstration reasoning, or moves that slip at random."""
    env.reset(seed=0)
    if not env.unwrapped.action_names:
        raise ValueError(f"{type(env.unwrapped).__name__} answers with one free-form action (action_names is None): "
                         "there is no finite set of moves to compare, so the first-move probe cannot score it (games "
                         "with named moves, such as Sokoban and FrozenLake, can).")  # fmt: skip
    try:
        env.unwrapped.solver_actions()
        env.unwrapped.demo_reasoning()
    except NotImplementedError as missing:
        raise ValueError(f"{missing} The first-move probe needs the game's optimal moves and its demonstration's "
                         "reading of the state (Sokoban and FrozenLake have both).") from None  # fmt: skip
    # Optimality is read off the state one step leads to; on slippery ice that state is one random draw.
    if getattr(env.unwrapped, "success_rate", 1.0) < 1.0:
        raise ValueError(f"success_rate={env.unwrapped.success_rate:g}: moves slip at random, so one step does not "
                         "say whether a move is optimal. The first-move probe needs deterministic moves "
                         "(env.kwargs.success_rate=1.0).")  # fmt: skip


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
    """The probe's states at `seeds` (starts with nothing to decide are left out)."""
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
