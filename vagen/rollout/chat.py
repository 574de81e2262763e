"""A chat-message agent loop, for agents that answer in text: API models and the built-in scripted policies.

It plays the evaluator's API and scripted cells, the warm-start report's random and solver baselines, and the
GIFs of `scripts/viz.py mode=gif`; every episode ends in an `EpisodeResult`. (Local models play through the
token-level loop, `collect_rollouts`, whose trajectories `vagen.eval.episodes.from_trajectory` converts.)

Each turn, every live episode's dialogue goes to a *responder* in one call (`respond(episodes) ->
replies`), so an API responder sends them all concurrently (`ApiEngine.generate_chat`). A reply with
an `error` ends that episode at once, recorded as failed, while the others go on: one failing request
never costs the rest of the batch, let alone the run.

Dialogues are kept as chat messages in the API engine's format (`{"role", "content", "images"}`,
one `<image>` placeholder per image), the same shape an `Observation` has.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from PIL import Image

from vagen.engines.base import SamplingParams, derive_seed
from vagen.env.policies import POLICIES


@dataclass
class TurnResult:
    """One answered turn: what the agent saw and wrote, and what the environment did with it.

    response_tokens: sampled tokens (local engines), the server's completion count (API), None for
        scripted policies or servers that report no usage.
    """

    observation: str
    images: list[Image.Image]
    response: str
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    response_tokens: int | None = None
    finish_reason: str | None = None


@dataclass
class EpisodeResult:
    """One episode from `env.reset(seed=seed)`. `error` is set when it could not be played to its end
    (an API request that finally failed, a policy that raised); its turns are those answered before."""

    seed: int
    system_prompt: str | None
    turns: list[TurnResult] = field(default_factory=list)
    end_reason: str = ""
    error: str | None = None
    wall_time_s: float = 0.0
    final_observation: str | None = None  # the state the episode ended in (None: it ended on an error)
    final_images: list[Image.Image] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return bool(self.error is None and self.turns and self.turns[-1].info.get("success", False))


@dataclass
class Reply:
    """One agent answer: its text, the tokens it cost (None when unknown), or why there is none."""

    text: str = ""
    tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class LiveEpisode:
    """An episode being played: its env, the dialogue so far, and a private RNG for scripted policies."""

    env: gymnasium.Env
    result: EpisodeResult
    messages: list[dict[str, Any]]
    rng: np.random.Generator
    done: bool = False
    pending: Any = field(default=None, repr=False)  # the observation the next reply answers


Responder = Callable[[list[LiveEpisode]], list[Reply]]


def _start(make_env: Callable[[], gymnasium.Env], index: int, seed: int, system_prompt: str | None) -> LiveEpisode:
    env = make_env()
    observation, _ = env.reset(seed=seed)
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    messages.append({"role": "user", "content": observation.text, "images": list(observation.images)})
    rng = np.random.default_rng(derive_seed(index, seed))  # its own identity: samples of one seed differ
    episode = LiveEpisode(env, EpisodeResult(seed, system_prompt), messages, rng)
    episode.pending = observation
    return episode


def _advance(episode: LiveEpisode, reply: Reply) -> None:
    """Step the env with the reply (or end the episode on an error) and append the next observation."""
    if reply.error is not None:
        episode.result.error, episode.result.end_reason, episode.done = reply.error, "error", True
        return
    observation = episode.pending
    next_observation, reward, terminated, truncated, info = episode.env.step(reply.text)
    episode.result.turns.append(
        TurnResult(
            observation=observation.text,
            images=list(observation.images),
            response=reply.text,
            reward=float(reward),
            info=dict(info),
            response_tokens=reply.tokens,
            finish_reason=reply.finish_reason,
        )
    )
    episode.messages.append({"role": "assistant", "content": reply.text})
    if terminated or truncated:
        reason = "success" if info.get("success") else ("terminated" if terminated else "max_turns")
        episode.result.end_reason, episode.done = reason, True
        episode.result.final_observation = next_observation.text
        episode.result.final_images = list(next_observation.images)
        return
    episode.messages.append({"role": "user", "content": next_observation.text, "images": list(next_observation.images)})
    episode.pending = next_observation


def play_chat_episodes(
    make_env: Callable[[], gymnasium.Env],
    seeds: Sequence[int],
    respond: Responder,
    system_prompt: str | None,
    indices: Sequence[int] | None = None,
) -> list[EpisodeResult]:
    """Play one episode per seed to its end, asking `respond` once per turn for all live episodes.

    `indices` (default 0, 1, ...) name the episodes: with their seeds they key each one's scripted-policy RNG.
    `wall_time_s` of each result is the batch's wall time divided by its episodes (they run together).
    """
    started = time.monotonic()
    indices = range(len(seeds)) if indices is None else indices
    episodes = [_start(make_env, index, seed, system_prompt) for index, seed in zip(indices, seeds, strict=True)]
    while live := [episode for episode in episodes if not episode.done]:
        replies = respond(live)
        assert len(replies) == len(live), "a responder returns one reply per live episode"
        for episode, reply in zip(live, replies, strict=True):
            _advance(episode, reply)
    share = (time.monotonic() - started) / max(len(episodes), 1)
    for episode in episodes:
        episode.result.wall_time_s = share
        episode.env.close()
    return [episode.result for episode in episodes]


def api_responder(engine: Any, sampling: SamplingParams) -> Responder:
    """Replies from an API engine (`generate_chat`); its retries, concurrency and errors are the engine's, and a
    conversation it cannot encode fails its own episode only."""

    def respond(episodes: list[LiveEpisode]) -> list[Reply]:
        generations = engine.generate_chat([episode.messages for episode in episodes], sampling, malformed="record")
        return [Reply(g.text, g.completion_tokens, g.finish_reason, g.error) for g in generations]

    return respond


def policy_responder(name: str) -> Responder:
    """Replies from a built-in policy (`vagen.env.policies.POLICIES`: solver, random). A policy that raises
    (e.g. a solver facing a state too big for it) fails that episode only."""
    policy = POLICIES.get(name)

    def respond(episodes: list[LiveEpisode]) -> list[Reply]:
        replies = []
        for episode in episodes:
            try:
                replies.append(Reply(policy(episode.env, episode.rng)))
            except Exception as error:  # recorded per episode: the benchmark reports it, the run goes on
                replies.append(Reply(error=f"policy {name!r} failed: {type(error).__name__}: {error}"))
        return replies

    return respond
