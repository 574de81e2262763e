"""Which levels (env seeds) an iteration trains on: new ones in order, a fixed pool, prioritised level replay, or new
levels kept where the policy's success is nearest 50% (the frontier sampler, at the end of this module).

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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vagen.engines.base import derive_seed

SEED_STRIDE = 100_000  # env seeds of run seed s start at s * SEED_STRIDE; evaluation uses seeds >= 1e9

LEVEL_STREAM = 2  # derive_seed(run seed, iteration, stream): the loop's streams 0 and 1 are sampling and shuffling
LEVEL_SAMPLERS = ("fresh", "plr", "frontier")


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
        if kind == "frontier":
            raise ValueError(
                f"trainer.level_sampler={kind!r} is FrontierSampler, not a LevelSampler kind; build either with "
                "vagen.trainer.starpo.level_sampler(cfg)."
            )
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

    def update(
        self, seeds: list[int], scores: list[float], iteration: int, successes: list[float] | None = None
    ) -> None:
        """Record each played level's score (its group's reward spread) and when it was played; keep the best.
        (`successes`, each group's success rate, is what the frontier sampler reads instead.)"""
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


# ---- the frontier sampler ------------------------------------------------------------------------------------------
# A level teaches a group-relative estimator something only when its group's outcomes differ. With N rollouts at
# success rate p, all N agree with probability p^N + (1 − p)^N: 0.8% at p = 0.5, 43% at p = 0.9 (N = 8). PLR scores each
# level by its own last group, a noisy 8-sample estimate that often does not repeat. This sampler pools the evidence
# over levels of one difficulty instead: the solver's distance from the level's start (its fewest moves to solve).
# Each distance d keeps a success estimate p_d = (s_d + 1) / (n_d + 2) over the groups played there (s_d: summed
# group success rates, n_d: groups; both multiplied by `memory` every iteration, so the estimate follows the policy),
# and each new level from the cursor is kept with probability
#
#     keep(d) = max(floor, 4 · p_d · (1 − p_d))
#
# (1 at p_d = 0.5 or for an unseen distance), until the batch is full. Levels are never replayed: every training level
# is new, from the same distribution as the held-out seeds, only re-weighted by difficulty.


@dataclass(frozen=True)
class FrontierSettings:
    """memory: the share of a distance's success counts carried into the next iteration. floor: the lowest keep
    probability, so every distance keeps being played. max_candidates: new levels looked at per group slot before the
    rest of the batch is taken as it comes."""

    memory: float = 0.9
    floor: float = 0.1
    max_candidates: int = 32

    def __post_init__(self) -> None:
        if not 0.0 <= self.memory <= 1.0 or not 0.0 < self.floor <= 1.0:
            raise ValueError(
                f"trainer.frontier.memory={self.memory} must lie in [0, 1] and trainer.frontier.floor={self.floor} "
                "in (0, 1]."
            )
        if isinstance(self.max_candidates, bool) or not isinstance(self.max_candidates, int) or self.max_candidates < 1:
            raise ValueError(f"trainer.frontier.max_candidates={self.max_candidates!r} must be a whole number >= 1.")


def keep_probability(successes: float, groups: float, floor: float) -> float:
    """max(floor, 4·p(1 − p)) with p = (successes + 1) / (groups + 2): 1 at p = 0.5 and for a distance never played."""
    p = (successes + 1.0) / (groups + 2.0)
    return max(floor, 4.0 * p * (1.0 - p))


class FrontierSampler:
    """New levels in cursor order, each kept with `keep_probability` of its solver distance (`difficulty(seed)`).
    The same protocol as `LevelSampler`: next_seeds, update (reads `successes`), metrics, state_dict."""

    def __init__(
        self, run_seed: int, first_seed: int, settings: FrontierSettings, difficulty: Callable[[int], int]
    ) -> None:
        self.run_seed, self.settings, self.difficulty = run_seed, settings, difficulty
        self.cursor = first_seed
        self.bins: dict[int, list[float]] = {}  # distance -> [summed group success rates, groups], decayed
        self.looked = 0  # candidates the last batch looked at
        self.batch: dict[int, int] = {}  # the last batch's seeds -> distances

    def keep(self, distance: int) -> float:
        successes, groups = self.bins.get(distance, (0.0, 0.0))
        return keep_probability(successes, groups, self.settings.floor)

    def next_seeds(self, groups: int, iteration: int) -> list[int]:
        rng = np.random.default_rng(derive_seed(self.run_seed, iteration, LEVEL_STREAM))
        self.batch, self.looked = {}, 0
        while len(self.batch) < groups and self.looked < groups * self.settings.max_candidates:
            seed, self.cursor, self.looked = self.cursor, self.cursor + 1, self.looked + 1
            distance = self.difficulty(seed)
            if rng.random() < self.keep(distance):
                self.batch[seed] = distance
        while len(self.batch) < groups:  # out of candidates: the rest as they come
            self.batch[self.cursor] = self.difficulty(self.cursor)
            self.cursor += 1
        return list(self.batch)

    def update(
        self, seeds: list[int], scores: list[float], iteration: int, successes: list[float] | None = None
    ) -> None:
        """Decay every distance's counts by `memory`, then add each played level's group success rate."""
        if successes is None:
            raise ValueError("The frontier sampler learns from each group's success rate: pass successes=.")
        for counts in self.bins.values():
            counts[0] *= self.settings.memory
            counts[1] *= self.settings.memory
        for seed, rate in zip(seeds, successes, strict=True):
            distance = self.batch[seed] if seed in self.batch else self.difficulty(seed)
            counts = self.bins.setdefault(distance, [0.0, 0.0])
            counts[0] += float(rate)
            counts[1] += 1.0

    def metrics(self) -> dict[str, float]:
        distances = list(self.batch.values())
        return {
            "levels/candidates": float(self.looked),
            "levels/distance_mean": float(np.mean(distances)) if distances else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "bins": [[d, s, n] for d, (s, n) in sorted(self.bins.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.bins = {int(d): [float(s), float(n)] for d, s, n in state.get("bins", [])}
