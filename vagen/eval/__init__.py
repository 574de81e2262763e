"""Benchmarking: models (local, vLLM, API) and built-in policies on environments, with tables, GIFs and plots."""

from vagen.eval.episodes import episode_record
from vagen.eval.models import ModelSpec, resolve_models
from vagen.eval.runner import EVAL_MODES, EvalReport, check_mode, evaluate, rename_overrides
from vagen.eval.storage import CellStore
from vagen.eval.summary import (
    markdown_table,
    outcomes_by_seed,
    plot_success,
    success_by_seed,
    summarize_cell,
    write_summary,
)
from vagen.rollout.chat import EpisodeResult, Reply, TurnResult, api_responder, play_chat_episodes, policy_responder
from vagen.rollout.validation import EVAL_SEED_BASE, change_text, eval_seeds, paired_change, wilson_interval

__all__ = [
    "EVAL_MODES",
    "EVAL_SEED_BASE",
    "CellStore",
    "EpisodeResult",
    "EvalReport",
    "ModelSpec",
    "Reply",
    "TurnResult",
    "api_responder",
    "change_text",
    "check_mode",
    "episode_record",
    "eval_seeds",
    "evaluate",
    "markdown_table",
    "outcomes_by_seed",
    "paired_change",
    "play_chat_episodes",
    "plot_success",
    "policy_responder",
    "rename_overrides",
    "resolve_models",
    "success_by_seed",
    "summarize_cell",
    "wilson_interval",
    "write_summary",
]
