"""One environment checker, built from single-property checks and run on every registered env in CI.

Each `check_*` function tests one property of the protocol in `vagen.env.base` and raises
`EnvCheckError` naming the property when it is violated; `check_env` runs them all. Use it on your
own environments before training on them.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium

from vagen.env.base import INFO_KEYS
from vagen.env.observation import IMAGE_PLACEHOLDER, Observation
from vagen.env.registry import make_env

HOSTILE_RESPONSES = (
    "",
    "garbage",
    "<think>unclosed",
    "<answer></answer>",
    "<think><think>nested</think></think><answer>x</answer>",
    "<answer>" + "A" * 100_000 + "</answer>",
    "<think>\x00\x07\x1b[31m</think><answer>\u202e\ufeff😀</answer>",
)


class EnvCheckError(AssertionError):
    """An environment violates the VAGEN environment protocol."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise EnvCheckError(message)


def observation_digest(obs: Observation) -> bytes:
    """Bytes that identify an observation exactly: its text and every pixel of every image."""
    parts = [obs.text.encode("utf-8")]
    for image in obs.images:
        parts.append(f"{image.mode}{image.size}".encode())
        parts.append(image.tobytes())
    return b"\x1f".join(parts)


def episode_digest(env_id: str, kwargs: dict[str, Any], seed: int, turns: int = 4) -> str:
    """SHA-256 of an episode played with responses sampled from the seeded action space.

    Module-level and argument-only so that it can run in a freshly spawned process: equal
    digests across processes show the episode depends on the seed alone.
    """
    env = make_env(env_id, **kwargs)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    digest = hashlib.sha256(observation_digest(obs))
    for _ in range(turns):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        digest.update(observation_digest(obs))
        digest.update(repr((round(reward, 9), terminated, truncated, info["success"], info["actions"])).encode())
        if terminated or truncated:
            break
    return digest.hexdigest()


def check_reset(env: gymnasium.Env, seed: int) -> None:
    """reset returns an `Observation` inside the observation space and an info dict with every INFO_KEYS key."""
    obs, info = env.reset(seed=seed)
    _require(isinstance(obs, Observation), f"reset returned {type(obs).__name__}, expected Observation")
    _require(env.observation_space.contains(obs), "reset's observation is outside observation_space")
    missing = [key for key in INFO_KEYS if key not in info]
    _require(not missing, f"reset's info lacks keys {missing}")
    _require(info["success"] is False, "an episode must not start solved")


def check_observation_mode(env: gymnasium.Env, seed: int) -> None:
    """Text mode attaches no image; image modes attach RGB images, one placeholder each."""
    obs, _ = env.reset(seed=seed)
    mode = env.unwrapped.observation_mode
    _require(obs.text.count(IMAGE_PLACEHOLDER) == len(obs.images), "placeholder count != image count")
    if mode == "text":
        _require(not obs.images, "observation='text' must attach no image")
    else:
        _require(len(obs.images) >= 1, f"observation={mode!r} must attach an image")
        for image in obs.images:
            _require(image.mode == "RGB", f"images must be RGB, got {image.mode}")
            _require(min(image.size) > 0, "an image has zero size")


def check_determinism(cases: list[tuple[str, dict[str, Any], int]]) -> None:
    """Same seed and same responses give the same episode, in this process and in a fresh one.

    Takes many (env_id, kwargs, seed) cases so that one spawned process serves them all.
    """
    here = [episode_digest(*case) for case in cases]
    for case, digest in zip(cases, here, strict=True):
        _require(digest == episode_digest(*case), f"{case}: two runs with the same seed differ in one process")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        there = pool.starmap(episode_digest, cases)
    for case, mine, theirs in zip(cases, here, there, strict=True):
        _require(mine == theirs, f"{case}: the same seed gives a different episode in a freshly spawned process")


def check_seeds_vary(env: gymnasium.Env, seed: int, tries: int = 8) -> None:
    """Different seeds give different initial states. Only a warning: a fixed map is legitimate,
    but an env that ignores its seed by mistake looks exactly like this."""
    firsts = {observation_digest(env.reset(seed=seed + k)[0]) for k in range(tries)}
    if len(firsts) == 1:
        warnings.warn(f"{tries} different seeds all gave the same initial observation; is the seed used?", stacklevel=2)


def check_step_contract(env: gymnasium.Env, seed: int, episodes: int = 5) -> None:
    """Random play: finite float rewards, bool flags, never both terminated and truncated, success implies
    terminated, at most max_turns turns, and stepping a finished episode raises."""
    env.action_space.seed(seed)
    max_turns = env.unwrapped.max_turns
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        turns = 0
        while turns < max_turns:
            turns += 1
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            _require(isinstance(obs, Observation), "step must return an Observation")
            _require(isinstance(reward, float) and math.isfinite(reward), f"reward {reward!r} is not a finite float")
            _require(isinstance(terminated, bool) and isinstance(truncated, bool), "flags must be bools")
            _require(not (terminated and truncated), "an episode cannot be both terminated and truncated")
            _require(not info["success"] or terminated, "success must terminate the episode")
            _require(not [k for k in INFO_KEYS if k not in info], "step's info lacks INFO_KEYS")
            if terminated or truncated:
                break
        _require(terminated or truncated, f"episode still running after max_turns={max_turns} turns")
        try:
            env.step(env.action_space.sample())
        except RuntimeError:
            pass
        else:
            raise EnvCheckError("step after the end of an episode must raise RuntimeError")


def check_malformed_responses(env: gymnasium.Env, seed: int) -> None:
    """Hostile or malformed responses never raise; they cost exactly the format penalty and count as a turn."""
    penalty = env.unwrapped.format_penalty
    for response in HOSTILE_RESPONSES:
        env.reset(seed=seed)
        _, reward, _, _, info = env.step(response)
        _require(
            info["format_ok"] is False or info["action_is_valid"] is False,
            f"malformed response {response[:40]!r} was accepted",
        )
        _require(info["actions"] == [], f"malformed response {response[:40]!r} executed actions")
        _require(math.isclose(reward, penalty), f"malformed response cost {reward}, expected the penalty {penalty}")
        _require(info["error"], "info['error'] must say what was wrong")
        _require(env.unwrapped._turn == 1, "a malformed response must still count as a turn")


CHECKS: tuple[Callable[[gymnasium.Env, int], None], ...] = (
    check_reset,
    check_observation_mode,
    check_seeds_vary,
    check_step_contract,
    check_malformed_responses,
)


def check_env(env_id: str, seed: int = 0, cross_process: bool = True, **kwargs: Any) -> None:
    """Run every check on `make_env(env_id, **kwargs)`; raise `EnvCheckError` on the first violation."""
    env = make_env(env_id, **kwargs)
    for check in CHECKS:
        try:
            check(env, seed)
        except EnvCheckError as error:
            raise EnvCheckError(f"{env_id} {kwargs}: {check.__name__}: {error}") from None
    if cross_process:
        check_determinism([(env_id, kwargs, seed)])
