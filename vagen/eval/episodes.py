"""What one evaluated episode is, whichever way it was played (local engine, API chat loop, scripted policy).

All three ways end in an `EpisodeResult`: the dialogue (system prompt, each observation with its
images, each response) and what the environment answered. `episode_record` turns it into the plain
dict stored as the episode's JSON file; the summary reads only those dicts, so results written by an
earlier (resumed) run count exactly like fresh ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from vagen.rollout import Trajectory

RECORD_FORMAT = "vagen.eval.episode/1"


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

    @property
    def success(self) -> bool:
        return bool(self.error is None and self.turns and self.turns[-1].info.get("success", False))


def from_trajectory(trajectory: Trajectory, system_prompt: str) -> EpisodeResult:
    """The `EpisodeResult` of a token-level rollout (`collect_rollouts`)."""
    turns = [
        TurnResult(
            observation=turn.observation,
            images=list(turn.images),
            response=turn.response_text,
            reward=float(turn.reward),
            info=dict(turn.info),
            response_tokens=len(turn.response_ids),
            finish_reason=turn.finish_reason or None,
        )
        for turn in trajectory.turns
    ]
    return EpisodeResult(trajectory.seed, system_prompt, turns, end_reason=trajectory.end_reason)


def _json_value(value: Any) -> Any:
    """Info values as JSON: games may put numpy scalars or tuples there."""
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def episode_record(
    episode: EpisodeResult, *, model: str, env: str, index: int, image_paths: list[list[str]]
) -> dict[str, Any]:
    """The JSON-ready record of one episode; `image_paths[t]` are turn t's images as saved (relative paths).

    Counts the summary needs are stored per episode: `format_ok_turns` (well-formed answers),
    `invalid_action_turns` (well-formed answers naming an action the game refused).
    """
    turns = episode.turns
    format_ok = [bool(t.info.get("format_ok", False)) for t in turns]
    invalid = [ok and not t.info.get("action_is_valid", False) for ok, t in zip(format_ok, turns, strict=True)]
    tokens = [t.response_tokens for t in turns]
    messages: list[dict[str, Any]] = []
    if episode.system_prompt is not None:
        messages.append({"role": "system", "content": episode.system_prompt})
    for turn, paths in zip(turns, image_paths, strict=True):
        messages.append({"role": "user", "content": turn.observation, "images": list(paths)})
        messages.append({"role": "assistant", "content": turn.response})
    return {
        "format": RECORD_FORMAT,
        "model": model,
        "env": env,
        "index": index,
        "seed": episode.seed,
        "success": episode.success,
        "reward": float(sum(t.reward for t in turns)),
        "turns": len(turns),
        "end_reason": episode.end_reason,
        "error": episode.error,
        "format_ok_turns": sum(format_ok),
        "invalid_action_turns": sum(invalid),
        "response_tokens": None if any(n is None for n in tokens) or not tokens else int(sum(tokens)),
        "wall_time_s": float(episode.wall_time_s),
        "actions": [list(t.info.get("actions", [])) for t in turns],
        "rewards": [float(t.reward) for t in turns],
        "finish_reasons": [t.finish_reason for t in turns],
        "infos": [_json_value(t.info) for t in turns],
        "messages": messages,
    }
