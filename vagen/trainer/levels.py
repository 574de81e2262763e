"""Which levels (env seeds) an iteration trains on: new ones in order, a fixed pool, or prioritised level replay.

Prioritised level replay (PLR; Jiang, Grefenstette & Rocktäschel 2021, arXiv:2010.03934) spends rollouts where the
learning signal is: a level whose last group's rewards varied (some rollouts solved it, some did not) gives GRPO-style
estimators a non-zero gradient, while an always-solved or never-solved level gives none. Each seen level keeps a score
S_i (the reward spread of its last group) and the iteration C_i it was last played. Each group slot of an iteration
replays a seen level with probability `replay_prob` (once at least `groups` levels are known), else takes the next new
level. Replayed levels are drawn without replacement from

    P_replay = (1 − ρ)·P_S + ρ·P_C,   P_S ∝ (1 / rank(S_i))^(1/β),   P_C ∝ c − C_i

(rank 1 = highest score, ties broken by the older level first; c = the current iteration; ρ = `staleness`, β =
`temperature`). The buffer keeps the `buffer_size` best-scored levels. Every draw comes from a generator seeded by
(run seed, iteration), so a resumed run replays exactly the levels an uninterrupted one would. Held-out evaluation
never sees these seeds (evaluation seeds start at 1e9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vagen.engines.base import derive_seed

SEED_STRIDE = 100_000  # env seeds of run seed s start at s * SEED_STRIDE; evaluation uses seeds >= 1e9

LEVEL_STREAM = 2  # derive_seed(run seed, iteration, stream): the loop's streams 0 and 1 are sampling and shuffling
LEVEL_SAMPLERS = ("fresh", "plr")


@dataclass(frozen=True)
class PLRSettings:
    """replay_prob: chance that a group slot replays a seen level. temperature: β of the rank weighting (smaller:
    sharper on the best-scored levels). staleness: ρ, the weight of the staleness distribution. buffer_size: levels
    remembered."""

    replay_prob: float = 0.5
    temperature: float = 0.3
    staleness: float = 0.1
    buffer_size: int = 256

    def __post_init__(self) -> None:
        if not 0.0 <= self.replay_prob <= 1.0 or not 0.0 <= self.staleness <= 1.0:
            raise ValueError(
                f"trainer.plr.replay_prob={self.replay_prob} and trainer.plr.staleness={self.staleness} must lie in "
                "[0, 1]."
            )
        if not self.temperature > 0:
            raise ValueError(f"trainer.plr.temperature={self.temperature} must be > 0 (it is β in (1/rank)^(1/β)).")
        if isinstance(self.buffer_size, bool) or not isinstance(self.buffer_size, int) or self.buffer_size < 1:
            raise ValueError(f"trainer.plr.buffer_size={self.buffer_size!r} must be a whole number >= 1.")


def replay_distribution(scores: np.ndarray, last_played: np.ndarray, iteration: int, settings: PLRSettings):
    """P_replay over the buffer's levels (float64, sums to 1). scores, last_played: [L] in the buffer's order (oldest
    first). Rank by score, descending; equal scores rank the older level first (a stable sort)."""
    order = np.argsort(-scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    by_score = (1.0 / ranks) ** (1.0 / settings.temperature)
    by_score /= by_score.sum()
    staleness = (iteration - last_played).astype(np.float64)
    by_age = staleness / staleness.sum() if staleness.sum() > 0 else np.full(len(scores), 1.0 / len(scores))
    return (1.0 - settings.staleness) * by_score + settings.staleness * by_age


class LevelSampler:
    """The training levels of each iteration, and what the loop tells it about them afterwards.

    kind: `fresh` (new levels from the cursor, or a fixed pool when `level_pool` > 0) or `plr`.
    """

    def __init__(self, kind: str, run_seed: int, first_seed: int, level_pool: int, settings: PLRSettings) -> None:
        if kind not in LEVEL_SAMPLERS:
            raise ValueError(f"Unknown trainer.level_sampler={kind!r}; valid: {list(LEVEL_SAMPLERS)}.")
        if kind == "plr" and level_pool:
            raise ValueError(
                f"trainer.level_sampler=plr chooses its own levels; trainer.level_pool={level_pool} would fix them. "
                "Set trainer.level_pool=0, or trainer.level_sampler=fresh."
            )
        self.kind, self.run_seed, self.first_seed, self.level_pool = kind, run_seed, first_seed, level_pool
        self.settings = settings
        self.cursor = first_seed  # the next new level
        self.scores: dict[int, float] = {}  # seed -> score of its last group (insertion order = first seen)
        self.last_played: dict[int, int] = {}

    def next_seeds(self, groups: int, iteration: int) -> list[int]:
        """The env seeds of this iteration's `groups` groups, each seed at most once."""
        if self.kind == "fresh" or len(self.scores) < groups:
            return self._new(groups)
        rng = np.random.default_rng(derive_seed(self.run_seed, iteration, LEVEL_STREAM))
        replays = int(rng.binomial(groups, self.settings.replay_prob))
        seeds = list(self.scores)
        probabilities = replay_distribution(
            np.array([self.scores[s] for s in seeds]),
            np.array([self.last_played[s] for s in seeds]),
            iteration,
            self.settings,
        )
        chosen = rng.choice(len(seeds), size=replays, replace=False, p=probabilities) if replays else []
        return [seeds[i] for i in chosen] + self._new(groups - replays)

    def _new(self, count: int) -> list[int]:
        if self.level_pool:  # a fixed training set, cycled
            seeds = [self.first_seed + (self.cursor - self.first_seed + k) % self.level_pool for k in range(count)]
        else:
            seeds = list(range(self.cursor, self.cursor + count))
        self.cursor += count
        return seeds

    def update(self, seeds: list[int], scores: list[float], iteration: int) -> None:
        """Record each played level's score (its group's reward spread) and when it was played; keep the best."""
        if self.kind != "plr":
            return
        for seed, score in zip(seeds, scores, strict=True):
            self.scores.pop(seed, None)  # re-inserted last: insertion order is the tie-break by age
            self.scores[seed], self.last_played[seed] = float(score), iteration
        while len(self.scores) > self.settings.buffer_size:
            # Evict the lowest score; among equals the stalest (the one played longest ago).
            worst = min(self.scores, key=lambda s: (self.scores[s], self.last_played[s]))
            del self.scores[worst], self.last_played[worst]

    def metrics(self) -> dict[str, float]:
        if self.kind != "plr":
            return {}
        scores = list(self.scores.values())
        return {
            "levels/buffer": float(len(scores)),
            "levels/buffer_score_mean": float(np.mean(scores)) if scores else 0.0,
            "levels/buffer_nonzero": float(np.count_nonzero(scores)),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "levels": [[seed, self.scores[seed], self.last_played[seed]] for seed in self.scores],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.scores = {int(seed): float(score) for seed, score, _ in state.get("levels", [])}
        self.last_played = {int(seed): int(played) for seed, _, played in state.get("levels", [])}
