"""A policy's preference among first moves on the probe's states (`vagen.rollout.move_probe`), and its summary.

Each state's one-action responses are scored as continuations of one prompt forward (`cross_scores`); the softmax
over actions is the preference. Its mass on the optimal moves says how well the policy decides, without the sampling
noise of played episodes, so the same states under two models show a change of 0.01.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vagen.diagnostics.scoring import Reasoning, ScoringJob, ScoringPrompt, cross_scores
from vagen.rollout.move_probe import ProbeState


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
    """(S,) the preference mass on each state's optimal actions; `preferences` (S, A), `optimal` (S, A) bool."""
    return (preferences * optimal).sum(axis=1)


def probe_summary(preferences: np.ndarray, optimal: np.ndarray) -> dict[str, float]:
    """The mean mass on optimal moves, the share of states whose preferred move is optimal, and the mass of a
    policy that picks uniformly (chance)."""
    uniform = np.full_like(preferences, 1.0 / preferences.shape[1])
    return {
        "optimal_mass": float(optimal_mass(preferences, optimal).mean()),
        "top_optimal": float(optimal[np.arange(len(optimal)), preferences.argmax(axis=1)].mean()),
        "chance": float(optimal_mass(uniform, optimal).mean()),
        "states": float(len(optimal)),
    }
