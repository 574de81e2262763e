"""Demonstrations for supervised warm starts: any game's solver, written as the model would write it.

Each turn's response is the game's `demo_reasoning()` in `<think>` and the solver's next moves in
`<answer>`, in the env's own response format, tokenised and laid out exactly as `collect_rollouts`
would record a model's episode (`DialogueFormatter`), so SFT trains the very ids RL will sample.

Why noise: a model trained only on perfect play has never seen a state off the solver's path and
cannot recover from its own first mistake (DAgger's covariate shift). With probability `noise_eps`
a turn plays random actions instead; that turn stays in the dialogue as context (the model sees the
consequence) but is masked out of the loss, and the solver replans from the new state on the next
turn, which is what the model learns to imitate. (`imitate_noise` keeps the random turns in the loss instead:
a suboptimal demonstrator, whose model sees the board well but acts badly.)

`visited_demos` labels the states a policy's own episodes reached instead (DAgger): the solver's turn after the
policy's own dialogue up to there (`algorithm.sft_source=visited`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import gymnasium
import numpy as np

from vagen.env.policies import described_response
from vagen.rollout import DialogueFormatter, Trajectory, Turn, trajectories_to_batch
from vagen.rollout.batch import TokenBatch

SFT_SOURCES = ("solver", "visited")  # `algorithm.sft_source`: what the demonstration loss beside RL imitates
SFT_TOKENS = ("all", "think")  # `algorithm.sft_tokens`: the demonstration's whole responses, or each turn's reasoning


@dataclass
class Demo:
    """One demonstration: the trajectory, which turns are noise, and each turn's key cells and grid shape."""

    trajectory: Trajectory
    noisy_turns: list[bool] = field(default_factory=list)
    key_cells: list[list[tuple[int, int]]] = field(default_factory=list)  # `LanguageEnv.key_cells()` per turn
    grid_shapes: list[tuple[int, int]] = field(default_factory=list)  # (H, W) of the board per turn
    tile_facts: list[np.ndarray | None] = field(default_factory=list)  # `LanguageEnv.tile_facts()` per turn


def demo_response(env: gymnasium.Env, actions: list[str]) -> str:
    """The game's demonstration reasoning and `actions`, in the env's response format; the grounding and
    worldmodeling formats also describe the state now and after `actions` (see `described_response`)."""
    return described_response(env, actions, env.unwrapped.demo_reasoning())


def turn_actions(env: gymnasium.Env, rng: np.random.Generator, noise_eps: float) -> tuple[list[str], bool] | None:
    """The solver's next moves (or, with probability noise_eps, random ones); None when the solver is stuck."""
    game = env.unwrapped
    plan = list(game.solver_actions())
    if not plan:
        return None  # unsolvable (e.g. a box pushed into a corner by noise): nothing left to imitate
    if rng.random() < noise_eps:
        count = int(rng.integers(1, game.max_actions_per_turn + 1))
        return [game.action_names[int(i)] for i in rng.integers(len(game.action_names), size=count)], True
    return plan[: game.max_actions_per_turn], False


def _board(env: gymnasium.Env) -> tuple[list[tuple[int, int]], tuple[int, int], np.ndarray | None]:
    """Key cells, grid shape and tile facts of the current state; none for games without a board."""
    game = env.unwrapped
    try:
        return game.key_cells(), tuple(game.grid().shape), game.tile_facts()
    except (NotImplementedError, AttributeError):
        return [], (0, 0), None


def _demo_turn(env: gymnasium.Env, formatter: DialogueFormatter, actions: list[str], shown: Turn) -> Turn:
    """`shown` (its observation, images and prompt ids) answered by the demonstration response of `actions` from the
    env's current state: its ids followed by the end-of-message token the engine stops on (the model learns to stop)."""
    text = demo_response(env, actions)
    end_ids = formatter.close_ids([], "length")[:1]
    response_ids = formatter.tokenizer(text, add_special_tokens=False)["input_ids"] + end_ids
    return replace(
        shown,
        response_ids=response_ids,
        response_text=text,
        finish_reason="stop",
        response_logprobs=[0.0] * len(response_ids),
        close_ids=formatter.close_ids(response_ids, "stop"),
        reward=0.0,
        info={},
    )


def play_demo(
    env: gymnasium.Env, formatter: DialogueFormatter, seed: int, noise_eps: float, rng: np.random.Generator, name: str
) -> Demo:
    """Play one episode with the (noisy) solver, recorded as the rollout would record a model's episode.

    Each turn's response ids are the tokenised demo response followed by the end-of-message token
    (the model learns to stop); `close_ids` and the next prompt come from `formatter`.
    """
    demo = Demo(Trajectory(group_id=seed, seed=seed, env_name=name))
    observation, _ = env.reset(seed=seed)
    prompt = formatter.first_prompt(observation)
    while True:
        choice = turn_actions(env, rng, noise_eps)
        if choice is None:
            demo.trajectory.end_reason = "unsolvable"
            return demo
        actions, is_noise = choice
        turn = _demo_turn(env, formatter, actions, Turn(observation.text, list(observation.images), prompt))
        cells, shape, facts = _board(env)
        demo.key_cells.append(cells)
        demo.grid_shapes.append(shape)
        demo.tile_facts.append(facts)
        observation, turn.reward, terminated, truncated, turn.info = env.step(turn.response_text)
        demo.trajectory.turns.append(turn)
        demo.noisy_turns.append(is_noise)
        if terminated or truncated:
            demo.trajectory.terminated, demo.trajectory.truncated = terminated, truncated
            demo.trajectory.end_reason = "success" if turn.info["success"] else "max_turns"
            return demo
        prompt = formatter.next_prompt(observation)


def demonstrations(
    make_env: Callable[[], gymnasium.Env],
    formatter: DialogueFormatter,
    seeds: range | list[int],
    noise_eps: float,
    seed: int = 0,
    name: str = "env",
    keep_all_noise: bool = False,
) -> list[Demo]:
    """Noisy-solver demos for `seeds`; demos that never started are dropped, and so are those whose every turn was
    noise unless `keep_all_noise` (a demonstrator that imitates its noise learns from those too)."""
    env, rng = make_env(), np.random.default_rng(seed)
    demos = [play_demo(env, formatter, s, noise_eps, rng, name) for s in seeds]
    env.close()
    return [demo for demo in demos if demo.trajectory.turns and (keep_all_noise or not all(demo.noisy_turns))]


def visited_demos(
    make_env: Callable[[], gymnasium.Env], formatter: DialogueFormatter, trajectories: list[Trajectory]
) -> list[Demo]:
    """The solver's turn at every state the policy's own `trajectories` visited (DAgger's labels): one demo per turn
    whose state the solver can still solve, its dialogue the policy's own turns up to it (context, out of the loss)
    and then the demonstration response, for the prompt the policy saw there. Each episode is replayed from its seed
    with the policy's responses; where a replayed state is not the recorded one (`Turn.state_key`), its later turns
    get no label."""
    env, rng = make_env(), np.random.default_rng(0)  # noise_eps 0: the draws decide nothing
    demos = []
    for trajectory in trajectories:
        env.reset(seed=trajectory.seed)
        for index, turn in enumerate(trajectory.turns):
            if env.unwrapped.state_key() != turn.state_key:
                break
            choice = turn_actions(env, rng, 0.0)
            if choice is not None:
                turns = [*trajectory.turns[:index], _demo_turn(env, formatter, choice[0], turn)]
                labelled = replace(trajectory, turns=turns, final_observation="", final_images=[])
                demos.append(Demo(labelled, noisy_turns=[True] * index + [False]))
            env.step(turn.response_text)
    env.close()
    return demos


def sft_batch(demos: list[Demo], pad_token_id: int, imitate_noise: bool = False) -> TokenBatch:
    """`trajectories_to_batch` of the demos with the noisy turns' responses taken out of the loss mask, unless
    `imitate_noise`: then the model learns the noisy solver itself, a suboptimal demonstrator for RL to improve on."""
    batch = trajectories_to_batch([demo.trajectory for demo in demos], pad_token_id)
    if imitate_noise:
        return batch
    for row, demo in enumerate(demos):
        for (start, end), is_noise in zip(demo.trajectory.response_spans(), demo.noisy_turns, strict=True):
            if is_noise:
                batch.response_mask[row, start:end] = 0.0
    return batch
