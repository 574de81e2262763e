"""What one evaluated episode is, whichever way it was played (local engine, API chat loop, scripted policy).

All three ways end in an `EpisodeResult`: the dialogue (system prompt, each observation with its
images, each response) and what the environment answered. `episode_record` turns it into the plain
dict stored as the episode's JSON file; the summary reads only those dicts, so results written by an
earlier (resumed) run count exactly like fresh ones. `record_problem` checks a stored dict before it is
trusted: a record edited or damaged into another shape (`"success": "no"`) is played again, never counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from vagen.rollout import Trajectory
from vagen.rollout.chat import EpisodeResult, TurnResult

RECORD_FORMAT = "vagen.eval.episode/1"


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
    return EpisodeResult(
        trajectory.seed,
        system_prompt,
        turns,
        end_reason=trajectory.end_reason,
        final_observation=trajectory.final_observation,
        final_images=list(trajectory.final_images),
    )


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
    episode: EpisodeResult,
    *,
    model: str,
    env: str,
    index: int,
    image_paths: list[list[str]],
    final_image_paths: list[str] = (),
) -> dict[str, Any]:
    """The JSON-ready record of one episode; `image_paths[t]` are turn t's images as saved (relative paths), and
    `final_image_paths` those of the state it ended in (`final_observation`, which its GIF draws).

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
        "final_observation": None
        if episode.final_observation is None
        else {"content": episode.final_observation, "images": list(final_image_paths)},
    }


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str) and isinstance(value.get("content"), str)


_FIELDS: dict[str, Callable[[Any], bool]] = {
    "model": lambda v: isinstance(v, str),
    "env": lambda v: isinstance(v, str),
    "index": _is_count,
    "seed": _is_count,
    "success": lambda v: isinstance(v, bool),
    "reward": _is_number,
    "turns": _is_count,
    "end_reason": lambda v: isinstance(v, str),
    "error": lambda v: v is None or isinstance(v, str),
    "format_ok_turns": _is_count,
    "invalid_action_turns": _is_count,
    "response_tokens": lambda v: v is None or _is_count(v),
    "wall_time_s": lambda v: _is_number(v) and v >= 0,
    "actions": lambda v: isinstance(v, list),
    "rewards": lambda v: isinstance(v, list) and all(_is_number(r) for r in v),
    "finish_reasons": lambda v: isinstance(v, list),
    "infos": lambda v: isinstance(v, list) and all(isinstance(i, dict) for i in v),
    "messages": lambda v: isinstance(v, list) and all(_is_message(m) for m in v),
}


def record_problem(record: Any) -> str | None:
    """Why `record` is not an episode record as `episode_record` writes it, or None when it is: every field of its
    type, per-turn lists one entry per turn, counts within the turns, and `success` what its error and last turn's
    info say (so that neither a hand edit nor a damaged file changes what the summary counts)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for name, valid in _FIELDS.items():
        if name not in record or not valid(record[name]):
            return f"field {name!r} is missing or of the wrong type ({record.get(name)!r:.60})"
    turns = record["turns"]
    replies = sum(message["role"] == "assistant" for message in record["messages"])
    lengths = [len(record[name]) for name in ("actions", "rewards", "finish_reasons", "infos")]
    if lengths != [turns] * 4 or replies != turns:
        return f"its per-turn lists and replies ({lengths}, {replies}) disagree with turns={turns}"
    if not record["invalid_action_turns"] <= record["format_ok_turns"] <= turns:
        return "its format_ok_turns / invalid_action_turns exceed its turns"
    if not math.isclose(record["reward"], sum(record["rewards"]), rel_tol=1e-6, abs_tol=1e-6):
        return f"reward={record['reward']} is not the sum of its rewards"
    solved = record["error"] is None and turns > 0 and bool(record["infos"][-1].get("success", False))
    if record["success"] != solved:
        return f"success={record['success']} disagrees with its error and last turn's info"
    final = record.get("final_observation")  # absent in records written before it was kept: their GIFs lack it
    if final is not None and not (
        isinstance(final, dict) and isinstance(final.get("content"), str) and isinstance(final.get("images"), list)
    ):
        return f"final_observation is not a message ({final!r:.60})"
    return None
