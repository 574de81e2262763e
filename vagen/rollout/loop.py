"""The multi-turn agent loop: P groups × N rollouts × up to K turns, one batched generate per turn."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import gymnasium

from vagen.engines.base import Context, Engine, SamplingParams, derive_seed
from vagen.env.observation import Observation
from vagen.rollout.context import DialogueFormatter
from vagen.rollout.trajectory import Trajectory, Turn


@dataclass(frozen=True)
class RolloutSpec:
    """How many episodes to play and within which budgets."""

    group_seeds: list[int]  # one env seed per group: the N rollouts of a group share it
    group_size: int  # N rollouts per group
    max_context_tokens: int  # dialogue budget; an episode that would exceed it ends as truncated
    env_name: str = ""
    first_group_id: int = 0  # group id of group_seeds[0]: a worker playing groups 8..15 of a batch starts at 8

    def __post_init__(self) -> None:
        if self.group_size < 1 or not self.group_seeds:
            raise ValueError("A rollout needs at least one group seed and group_size >= 1.")


@dataclass
class _Episode:
    env: gymnasium.Env
    trajectory: Trajectory
    rollout_index: int  # which of its group's N rollouts
    ids: list[int]
    images: list
    done: bool = False

    def context(self, sampling_seed: int | None, turn_index: int) -> Context:
        """The next prompt (copies: the lists grow), seeded by (call seed, group, env seed, rollout, turn) and
        never by its position in the batch, so a worker playing a share of the groups samples what one process
        playing all of them would."""
        trajectory = self.trajectory
        keys = (trajectory.group_id, trajectory.seed, self.rollout_index, turn_index)
        seed = None if sampling_seed is None else derive_seed(sampling_seed, *keys)
        return Context(list(self.ids), list(self.images), seed=seed)


def _prompt_ids(encode: Callable[[Observation], list[int]], obs: Observation, trajectory: Trajectory) -> list[int]:
    """Encode an observation, naming the episode and turn if its images and pad tokens disagree."""
    try:
        return encode(obs)
    except ValueError as error:
        raise ValueError(
            f"{trajectory.env_name or 'env'} group {trajectory.group_id} seed {trajectory.seed}, "
            f"turn {len(trajectory.turns) + 1}: {error}"
        ) from error


def _turn(obs: Observation, prompt: list[int], env: gymnasium.Env) -> Turn:
    """A new turn from its observation, with the state it was made in (`LanguageEnv.state_key`, if the env has one)."""
    state_key = getattr(env.unwrapped, "state_key", lambda: None)()
    return Turn(observation=obs.text, images=list(obs.images), prompt_ids=prompt, state_key=state_key)


def _start(env: gymnasium.Env, trajectory: Trajectory, rollout_index: int, formatter: DialogueFormatter) -> _Episode:
    obs, _ = env.reset(seed=trajectory.seed)
    prompt = _prompt_ids(formatter.first_prompt, obs, trajectory)
    trajectory.turns.append(_turn(obs, prompt, env))
    return _Episode(env, trajectory, rollout_index, list(prompt), list(obs.images))


def collect_rollouts(
    make_env: Callable[[], gymnasium.Env],
    engine: Engine,
    formatter: DialogueFormatter,
    spec: RolloutSpec,
    sampling: SamplingParams,
) -> list[Trajectory]:
    """Play every episode to its end, generating for all live episodes of a turn in one batch.

    Context budget policy: before generating, an episode whose context plus `max_new_tokens` would
    exceed `max_context_tokens` ends as truncated (`end_reason="context_budget"`); the turn whose
    observation did not fit is dropped, so every kept turn has a response.
    """
    episodes = []
    for group_id, seed in enumerate(spec.group_seeds, start=spec.first_group_id):
        for rollout_index in range(spec.group_size):
            trajectory = Trajectory(group_id=group_id, seed=seed, env_name=spec.env_name)
            episodes.append(_start(make_env(), trajectory, rollout_index, formatter))
    stops = sorted(set(sampling.stop_token_ids) | set(formatter.stop_token_ids()))
    sampling = replace(sampling, stop_token_ids=stops)
    turn_index = 0
    while True:
        for episode in episodes:
            if not episode.done and len(episode.ids) + sampling.max_new_tokens > spec.max_context_tokens:
                _end_for_budget(episode)
        live = [episode for episode in episodes if not episode.done]
        if not live:
            engine.forget()  # no dialogue goes on: the engine need not keep their last turn through the update
            return [episode.trajectory for episode in episodes]
        contexts = [episode.context(sampling.seed, turn_index) for episode in live]
        generations = engine.generate(contexts, sampling)
        for episode, generation in zip(live, generations, strict=True):
            _advance(episode, generation, formatter)
        turn_index += 1


def _end_for_budget(episode: _Episode) -> None:
    trajectory = episode.trajectory
    dropped = trajectory.turns.pop()  # its observation never got a response: the state the episode ended in
    trajectory.final_observation, trajectory.final_images = dropped.observation, dropped.images
    trajectory.truncated, trajectory.end_reason, episode.done = True, "context_budget", True
    if not trajectory.turns:
        raise ValueError(
            f"The first prompt of {trajectory.env_name or 'the env'} (seed {trajectory.seed}) plus max_new_tokens "
            "does not fit max_context_tokens; raise rollout.max_context_tokens or lower max_new_tokens."
        )


def _advance(episode: _Episode, generation, formatter: DialogueFormatter) -> None:
    """Record the response, step the env, and append the next observation's ids."""
    turn = episode.trajectory.turns[-1]
    turn.response_ids = list(generation.token_ids)
    turn.response_logprobs = list(generation.logprobs)
    turn.finish_reason = generation.finish_reason
    turn.response_text = formatter.tokenizer.decode(turn.response_ids, skip_special_tokens=True)
    turn.close_ids = formatter.close_ids(turn.response_ids, generation.finish_reason)
    obs, reward, terminated, truncated, info = episode.env.step(turn.response_text)
    turn.reward, turn.info = reward, info
    episode.ids += turn.response_ids + turn.close_ids
    if terminated or truncated:
        trajectory = episode.trajectory
        trajectory.terminated, trajectory.truncated = terminated, truncated
        trajectory.end_reason = "success" if info["success"] else ("terminated" if terminated else "max_turns")
        trajectory.final_observation, trajectory.final_images = obs.text, list(obs.images)
        episode.done = True
        return
    prompt = _prompt_ids(formatter.next_prompt, obs, episode.trajectory)
    episode.trajectory.turns.append(_turn(obs, prompt, episode.env))
    episode.ids += prompt
    episode.images += list(obs.images)
