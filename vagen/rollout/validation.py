"""Held-out validation: the current policy plays fixed evaluation seeds, and the episodes are summarised.

Evaluation seeds
----------------
Episode k is `env.reset(seed=EVAL_SEED_BASE + offset + k)`. Training draws env seeds from
`seed * 100_000` upward (`vagen.trainer.levels.SEED_STRIDE`), far below 1e9 for any run seed under
10_000, so evaluation episodes are never training episodes, and every model meets the same levels.
The trainer's in-run validation (`trainer.eval_every`) and `scripts/evaluate.py` use the same seeds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import gymnasium

from vagen.engines.base import Engine, SamplingParams
from vagen.rollout.context import DialogueFormatter
from vagen.rollout.loop import RolloutSpec, collect_rollouts
from vagen.rollout.trajectory import Trajectory

EVAL_SEED_BASE = 1_000_000_000
"""Evaluation env seeds start here; training seeds stay below it (see the module docstring)."""
Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile
VALIDATION_SAMPLING_SEED = 1234  # one fixed sampling seed: the same policy always gets the same score


def eval_seeds(episodes: int, offset: int = 0) -> list[int]:
    """The env seeds of episodes 0..episodes-1: `EVAL_SEED_BASE + offset + k`."""
    if episodes < 1 or offset < 0:
        raise ValueError(f"episodes must be >= 1 and seed_offset >= 0, got {episodes} and {offset}.")
    return [EVAL_SEED_BASE + offset + k for k in range(episodes)]


def wilson_interval(successes: float, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion; (nan, nan) when there are no trials.

    successes may be fractional: the success rate of several samples per trial, times the trials."""
    if trials == 0:
        return math.nan, math.nan
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # Rounding can put an end a hair inside p at p = 0 or 1; the interval always contains p.
    return max(0.0, min(p, centre - half_width)), min(1.0, max(p, centre + half_width))


def paired_change(
    before: dict[int, float], after: dict[int, float], z: float = Z_95
) -> tuple[float, float, float, int]:
    """Mean over the seeds both sides played of (after − before success rate per seed), its 95% interval over those
    seeds (normal approximation), and their count.

    Pairing by level removes the between-level variance that two separate intervals each carry, so a change two
    overlapping Wilson intervals cannot show can be shown here; each side's sampling noise stays in the differences.
    Two runs compared with one shared `before` share its noise too: compare them through their mean `after`."""
    seeds = sorted(before.keys() & after.keys())
    if len(seeds) < 2:
        raise ValueError(f"a paired change needs at least 2 seeds played by both sides, got {len(seeds)}.")
    mean, low, high = mean_interval([after[seed] - before[seed] for seed in seeds], z)
    return mean, low, high, len(seeds)


def mean_interval(values: list[float], z: float = Z_95) -> tuple[float, float, float]:
    """The mean of `values` and its 95% interval (normal approximation, over the values); zero width for one value."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, mean, mean
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    half_width = z * math.sqrt(variance / len(values))
    return mean, mean - half_width, mean + half_width


def change_text(mean: float, low: float, high: float) -> str:
    """A change in success rate and its interval, in percentage points: `+7.4 pts [+3.1, +11.7]`."""
    return f"{mean * 100:+.1f} pts [{low * 100:+.1f}, {high * 100:+.1f}]"


def distance_bins(distances: list[int], min_levels: int) -> list[tuple[int, int]]:
    """Neighbouring distances merged, from the shortest, until each bin holds at least `min_levels` levels; a last
    bin short of that joins the one before it."""
    levels = Counter(distances)
    bins: list[tuple[int, int]] = []
    count, low = 0, None
    for distance in sorted(levels):
        low = distance if low is None else low
        count += levels[distance]
        if count >= min_levels:
            bins.append((low, distance))
            count, low = 0, None
    if low is not None:  # a short last bin
        if bins:
            bins[-1] = (bins[-1][0], max(levels))
        else:
            bins.append((low, max(levels)))
    return bins


def episode_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """success, reward (mean return), turns per episode and format_ok (fraction of turns) of played episodes."""
    turns = [turn for t in trajectories for turn in t.turns]
    return {
        "success": sum(t.success for t in trajectories) / len(trajectories),
        "reward": sum(t.total_reward for t in trajectories) / len(trajectories),
        "turns": len(turns) / len(trajectories),
        "format_ok": sum(bool(turn.info.get("format_ok")) for turn in turns) / max(len(turns), 1),
    }


def actions_per_turn(trajectories: list[Trajectory]) -> float:
    """Mean number of actions the env executed per turn. RL that learns to write fewer moves per turn (a shorter
    answer risks less in a failing group) runs out of turns while its per-move choices improve: this shows it."""
    turns = [turn for t in trajectories for turn in t.turns]
    return sum(len(turn.info.get("actions", ())) for turn in turns) / max(len(turns), 1)


def validation_episodes(
    make_env: Callable[[], gymnasium.Env],
    engine: Engine,
    formatter: DialogueFormatter,
    *,
    episodes: range,
    temperature: float,
    max_new_tokens: int,
    max_context_tokens: int,
    env_name: str = "",
    samples: int = 1,
    batch_episodes: int | None = None,
) -> list[Trajectory]:
    """Play evaluation episodes `episodes` (e.g. range(64), or a worker's range(32, 64)): episode k on seed
    `EVAL_SEED_BASE + k`, as group k, `samples` times. Sampling uses a fixed seed and each episode's own stream, so
    validating the same weights gives the same episodes however they are split, and sample 0 is the episode that
    `samples=1` plays. `batch_episodes` caps the episodes played at once (whole levels, at least one; None: all), and
    with them the dialogues whose keys and values the engine keeps between turns."""
    levels = max(1, batch_episodes // samples if batch_episodes else len(episodes))
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=VALIDATION_SAMPLING_SEED)
    trajectories = []
    for start in range(episodes.start, episodes.stop, levels):
        part = range(start, min(start + levels, episodes.stop))
        spec = RolloutSpec(
            group_seeds=eval_seeds(len(part), part.start),
            group_size=samples,
            max_context_tokens=max_context_tokens,
            env_name=env_name,
            first_group_id=part.start,
        )
        trajectories += collect_rollouts(make_env, engine, formatter, spec, sampling)
    return trajectories


def success_by_level(trajectories: list[Trajectory]) -> dict[int, float]:
    """Each env seed's success rate over the episodes that played it."""
    wins: dict[int, list[bool]] = {}
    for t in trajectories:
        wins.setdefault(t.seed, []).append(t.success)
    return {seed: sum(w) / len(w) for seed, w in wins.items()}


def reading_metrics(make_env: Callable[[], gymnasium.Env], trajectories: list[Trajectory]) -> dict[str, float]:
    """`val/reading_exact`: the share of the played turns whose `<think>` is the demonstration's reading of the state
    the turn saw (`reasoning_matches`), and `val/reading_facts`, the share of that reading's facts it states rightly
    (games with `reading_facts`). Each episode is replayed from `reset(seed)` with its responses to recover the
    states. RL rewards the moves, not the words: a reading that drifts away from the board while success holds shows
    here, where the MI proxies (which ask only whether the reasoning depends on the input) may not. Nothing for a
    game without demonstration reasoning."""
    env = make_env()
    game = env.unwrapped
    if not game.supports_demo_reasoning:
        return {}
    exact, facts = [], []
    for trajectory in trajectories:
        env.reset(seed=trajectory.seed)
        for turn in trajectory.turns:
            think = game.parse(turn.response_text).think
            exact.append(game.reasoning_matches(think))
            if game.supports_reading_facts:
                facts.append(game.reading_facts(think))
            env.step(turn.response_text)
    metrics = {"val/reading_exact": sum(exact) / max(len(exact), 1)}
    if facts:
        metrics["val/reading_facts"] = sum(facts) / len(facts)
    return metrics


def validation_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """`val/` metrics of played evaluation episodes, with the 95% interval of the success rate. The interval counts
    levels, not episodes: samples of one level are not independent."""
    metrics = episode_metrics(trajectories)
    by_level = success_by_level(trajectories)
    low, high = wilson_interval(sum(by_level.values()), len(by_level))
    metrics.update(
        actions_per_turn=actions_per_turn(trajectories),
        success_ci_low=low,
        success_ci_high=high,
        episodes=float(len(trajectories)),
        levels=float(len(by_level)),
    )
    return {f"val/{name}": value for name, value in metrics.items()}
