"""Built-in policies: scripted players for demos, GIFs, smoke tests and benchmark reference rows.

Every policy has one signature, `policy(env, rng) -> str`: it reads the (possibly wrapped)
environment's current state and returns a full model-style response in that env's response
format, so it travels through exactly the same parser and `step` as a language model's output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium
import numpy as np

# relative_direction, RELATIVE_DIRECTIONS and SIDES live with the grader (which reads the same words), re-exported here.
from vagen.env.grading import RELATIVE_DIRECTIONS, SIDES, canonical_description, relative_direction  # noqa: F401
from vagen.registry import Registry

Policy = Callable[[gymnasium.Env, np.random.Generator], str]
POLICIES: Registry[Policy] = Registry("policy")


def solver_distance(env: gymnasium.Env, seed: int) -> int:
    """The solver's fewest moves from the level of `reset(seed=seed)`: the length of its plan (0: no plan). The
    frontier level sampler bins training levels by it, and the research studies held-out ones."""
    env.reset(seed=seed)
    return len(env.unwrapped.solver_actions())


def format_response(
    response_format: str,
    actions: Sequence[str],
    separator: str,
    reasoning: str,
    observation: str = "",
    prediction: str = "",
) -> str:
    """Write `actions` as a response in `response_format` (see `vagen.env.parsing.RESPONSE_FORMATS`).

    The separator is padded with spaces (`Left || Up`); `observation` / `prediction` fill the
    extra tags of the `grounding` and `worldmodeling` formats.
    """
    answer = f"<answer>{f' {separator} '.join(actions)}</answer>"
    if response_format == "no_think":
        return answer
    if response_format == "free_think":
        return f"<think>{reasoning}</think>{answer}"
    seen = f"<observation>{observation or 'the current state'}</observation><reasoning>{reasoning}</reasoning>"
    if response_format == "grounding":
        return f"<think>{seen}</think>{answer}"
    if response_format == "worldmodeling":
        guess = f"<prediction>{prediction or 'the state after these actions'}</prediction>"
        return f"<think>{seen}{guess}</think>{answer}"
    raise ValueError(f"Unknown response_format {response_format!r}; see vagen.env.parsing.RESPONSE_FORMATS.")


def describe_state(env: gymnasium.Env) -> str:
    """A one-line description of the state for scripted reasoning.

    Uses the game's own `describe_state()` when it has one, else a generic sentence: `vagen`
    knows no concrete game, so anything richer belongs to the game.
    """
    game = env.unwrapped
    describe = getattr(game, "describe_state", None)
    if callable(describe):
        return str(describe())
    return f"This is {type(game).__name__} after {getattr(game, '_turn', 0)} turn(s)."


def described_response(env: gymnasium.Env, actions: Sequence[str], reasoning: str) -> str:
    """A response in the env's format whose `<observation>` and `<prediction>` (grounding,
    worldmodeling) are what the grader scores 1: relative descriptions of the state now and after
    `actions` (the solver knows the next state; relative words are what a small vision model can ground).
    Games without `state_objects()` get their one-line `describe_state` as the observation."""
    game = env.unwrapped
    observation, prediction = describe_state(env), ""
    if game.supports_grading:
        nearby_only = game.graded_nearby_only
        observation = canonical_description(game.state_objects(), nearby_only, frame="relative")
        if game.response_format == "worldmodeling":
            prediction = canonical_description(game.objects_after(list(actions)), nearby_only, frame="relative")
    return format_response(
        game.response_format, actions, game.action_separator, reasoning, observation=observation, prediction=prediction
    )


@POLICIES.register("solver")
def solver_policy(env: gymnasium.Env, rng: np.random.Generator) -> str:
    """The game's oracle: the first `max_actions_per_turn` of `env.unwrapped.solver_actions()`."""
    game = env.unwrapped
    plan = list(game.solver_actions())
    if not plan:
        raise RuntimeError(
            f"{type(game).__name__}.solver_actions() returned no action: the state is terminal, unsolvable or "
            "too big for the game's solver. Ask a policy for a move only while the episode runs, or use 'random'."
        )
    actions = plan[: game.max_actions_per_turn]
    remaining = len(plan) - len(actions)
    plan_note = f"{remaining} more move(s) after these." if remaining else "These finish the task."
    reasoning = f"{describe_state(env)} The solver's plan starts with {', '.join(actions)}. {plan_note}"
    return described_response(env, actions, reasoning)


@POLICIES.register("random")
def random_policy(env: gymnasium.Env, rng: np.random.Generator) -> str:
    """1..max_actions_per_turn uniformly random action names; for free-form games (no
    `action_names`, e.g. Countdown) a random integer in 0..99 as the whole answer."""
    game = env.unwrapped
    names = game.action_names
    if names:
        count = int(rng.integers(1, game.max_actions_per_turn + 1))
        actions = [names[i] for i in rng.integers(0, len(names), size=count)]
    else:
        count, actions = 1, [str(int(rng.integers(0, 100)))]
    reasoning = f"{describe_state(env)} I pick {count} random action(s)."
    return format_response(
        game.response_format, actions, game.action_separator, reasoning, observation=describe_state(env)
    )
