"""Level sampling: the fresh cursor, prioritised level replay's distribution (rank and staleness), its determinism,
its buffer, its checkpoint state, and the trainer's use of it."""

from __future__ import annotations

import numpy as np
import pytest
from test_trainer import TEXT, config

from vagen.trainer.levels import LevelSampler, PLRSettings, replay_distribution


def plr(**settings) -> LevelSampler:
    return LevelSampler("plr", run_seed=0, first_seed=1000, level_pool=0, settings=PLRSettings(**settings))


def test_fresh_takes_new_levels_in_order_and_ignores_scores():
    sampler = LevelSampler("fresh", 0, 1000, 0, PLRSettings())
    assert sampler.next_seeds(3, 0) == [1000, 1001, 1002]
    sampler.update([1000, 1001, 1002], [1.0, 0.0, 2.0], 0)
    assert sampler.next_seeds(2, 1) == [1003, 1004] and sampler.metrics() == {}


def test_rank_rule():
    """Without staleness, P ∝ (1/rank)^(1/β): scores 3 > 2 > 1 > 1 (the older of equal scores ranks first)."""
    p = replay_distribution(np.array([1.0, 3.0, 1.0, 2.0]), np.zeros(4), 5, PLRSettings(temperature=0.5, staleness=0.0))
    weights = np.array([1 / 3**2, 1.0, 1 / 4**2, 1 / 2**2])
    assert p == pytest.approx(weights / weights.sum())


def test_staleness_rule():
    """With ρ = 1, P ∝ c − C_i: levels played longer ago are replayed more; the mixture is linear in ρ."""
    last = np.array([9, 5, 0])
    p = replay_distribution(np.array([0.5, 0.2, 0.1]), last, 10, PLRSettings(staleness=1.0))
    assert p == pytest.approx(np.array([1, 5, 10]) / 16)
    half = replay_distribution(np.array([0.5, 0.2, 0.1]), last, 10, PLRSettings(staleness=0.5))
    by_score = replay_distribution(np.array([0.5, 0.2, 0.1]), last, 10, PLRSettings(staleness=0.0))
    assert half == pytest.approx(0.5 * p + 0.5 * by_score)


def test_replays_only_once_enough_levels_are_known_and_never_twice_in_a_batch():
    sampler = plr(replay_prob=1.0)
    assert sampler.next_seeds(4, 0) == [1000, 1001, 1002, 1003]  # nothing known yet: all new
    sampler.update([1000, 1001, 1002, 1003], [0.5, 0.0, 0.4, 0.1], 0)
    seeds = sampler.next_seeds(4, 1)
    assert sorted(seeds) == [1000, 1001, 1002, 1003]  # replay_prob 1: every slot replays, each level once


def test_determinism_and_resume_from_state():
    """Same run seed and history: the same levels; a sampler restored from state_dict continues identically."""

    def history(sampler, iterations):
        out = []
        for it in range(iterations):
            seeds = sampler.next_seeds(4, it)
            sampler.update(seeds, [((s * 7919) % 11) / 10 for s in seeds], it)
            out.append(seeds)
        return out

    a, b = plr(buffer_size=6), plr(buffer_size=6)
    assert history(a, 8) == history(b, 8)
    restored = plr(buffer_size=6)
    restored.load_state_dict(a.state_dict())
    assert history(restored, 4) == history(a, 4)
    assert any(s < a.cursor - 4 for seeds in history(plr(buffer_size=6), 8)[2:] for s in seeds)  # it does replay


def test_buffer_keeps_the_best_scores_and_drops_the_stalest_of_equals():
    sampler = plr(buffer_size=3)
    sampler.update([1, 2, 3], [0.0, 0.5, 0.0], iteration=0)
    sampler.update([4], [0.0], iteration=1)  # four levels: a 0.0 played at iteration 0 goes (the older of 1 and 3)
    assert set(sampler.scores) == {2, 3, 4}
    sampler.update([5], [0.9], iteration=2)
    assert set(sampler.scores) == {2, 4, 5} and sampler.metrics()["levels/buffer_nonzero"] == 2


def test_replayed_levels_are_rescored_and_restamped():
    sampler = plr()
    sampler.update([1, 2], [0.5, 0.1], iteration=0)
    sampler.update([1], [0.0], iteration=3)
    assert sampler.scores[1] == 0.0 and sampler.last_played[1] == 3 and list(sampler.scores) == [2, 1]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="replay_prob"):
        PLRSettings(replay_prob=1.5)
    with pytest.raises(ValueError, match="temperature"):
        PLRSettings(temperature=0)
    with pytest.raises(ValueError, match="level_pool=4"):
        LevelSampler("plr", 0, 0, 4, PLRSettings())
    with pytest.raises(ValueError, match="level_sampler='best'"):
        LevelSampler("best", 0, 0, 0, PLRSettings())


def test_trainer_with_plr_replays_levels_with_reward_spread_and_checkpoints_the_buffer(tmp_path):
    from vagen.trainer.starpo import StarPOTrainer

    cfg = config([*TEXT, "trainer.level_sampler=plr", "trainer.plr.replay_prob=1.0", "trainer.group_size=4"], tmp_path)
    trainer = StarPOTrainer(cfg)
    played = []
    for _ in range(3):
        metrics = trainer.train_iteration()
        played.append(sorted({t.seed for t in trainer.last_trajectories}))
    assert played[0] == [0, 1] and metrics["levels/buffer"] >= 2
    assert played[1] == [0, 1]  # replay_prob 1 and two known levels: both replayed
    state = trainer.state()
    assert state["levels"]["levels"] and state["seed_cursor"] == trainer.levels.cursor
