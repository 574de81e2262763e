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

RARELY = 0.1  # mass on the optimal moves below which a state counts as one where the policy rarely tries them


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
    """The mean mass on optimal moves, the share of states whose preferred move is optimal, the share of states whose
    optimal moves together get less than `RARELY` (there a group of 8 samples misses every optimal move in over 43%
    of groups, 0.9^8: RL can hardly learn what it does not try), and the mass of a policy that picks uniformly
    (chance)."""
    uniform = np.full_like(preferences, 1.0 / preferences.shape[1])
    masses = optimal_mass(preferences, optimal)
    return {
        "optimal_mass": float(masses.mean()),
        "top_optimal": float(optimal[np.arange(len(optimal)), preferences.argmax(axis=1)].mean()),
        "rarely_optimal": float((masses < RARELY).mean()),
        "chance": float(optimal_mass(uniform, optimal).mean()),
        "states": float(len(optimal)),
    }
