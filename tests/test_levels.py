"""Level sampling: the fresh cursor, prioritised level replay's distribution (rank and staleness), its determinism,
its buffer, its checkpoint state, and the trainer's use of it; the frontier sampler's keep rule, its preference for
the distances nearest 50% success, its determinism and state, its refusals, and the trainer's use of it."""

from __future__ import annotations

import numpy as np
import pytest
from test_trainer import TEXT, config

from envs_text.bandit import BanditTextEnv
from vagen.env.base import LanguageEnv
from vagen.trainer.levels import (
    FrontierSampler,
    FrontierSettings,
    LevelSampler,
    PLRSettings,
    keep_probability,
    replay_distribution,
)


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


# ---- the frontier sampler -------------------------------------------------------------------------------------------
def five_distances(seed: int) -> int:
    """A stand-in for the solver: level k is k % 5 + 1 moves from done."""
    return seed % 5 + 1


def frontier(**settings) -> FrontierSampler:
    return FrontierSampler(0, 1000, FrontierSettings(**settings), difficulty=five_distances)


def test_keep_rule_by_hand():
    """keep = max(floor, 4·p(1 − p)), p = (s + 1) / (n + 2)."""
    assert keep_probability(0.0, 0.0, 0.1) == 1.0  # a distance never played: p = 1/2
    assert keep_probability(4.0, 8.0, 0.1) == pytest.approx(1.0)  # p = 5/10
    assert keep_probability(8.0, 8.0, 0.1) == pytest.approx(4 * 0.9 * 0.1)  # p = 9/10: 0.36
    assert keep_probability(0.0, 30.0, 0.1) == pytest.approx(4 * (1 / 32) * (31 / 32))  # 0.121
    assert keep_probability(0.0, 100.0, 0.1) == 0.1  # 4·p(1 − p) = 0.039: the floor


def test_frontier_keeps_every_new_level_until_it_knows_something():
    sampler = frontier()
    assert sampler.next_seeds(4, 0) == [1000, 1001, 1002, 1003] and sampler.looked == 4
    assert sampler.metrics() == {"levels/candidates": 4.0, "levels/distance_mean": 2.5}  # distances 1, 2, 3, 4


def test_frontier_decays_and_counts_group_success_rates():
    sampler = frontier(memory=0.5)
    seeds = sampler.next_seeds(2, 0)  # 1000 and 1001: distances 1 and 2
    sampler.update(seeds, [0.0, 0.0], 0, successes=[1.0, 0.25])
    sampler.update([1005], [0.0], 1, successes=[0.5])  # distance 1 again (looked up: not in the last batch)
    assert sampler.bins == {1: [0.5 * 1.0 + 0.5, 0.5 * 1 + 1], 2: [0.5 * 0.25, 0.5]}


def test_frontier_prefers_the_distances_nearest_half_success():
    """Distance 1 always solved, distance 3 solved half the time, the others unknown (kept like p = 1/2): distance 1,
    a fifth of the new levels, is kept with 4·(21/22)·(1/22) = 0.17 against 1, so it is about 4% of the batches."""
    sampler = frontier(memory=1.0)
    sampler.bins = {1: [20.0, 20.0], 3: [10.0, 20.0]}
    picked = [five_distances(seed) for iteration in range(50) for seed in sampler.next_seeds(8, iteration)]
    share = {d: picked.count(d) / len(picked) for d in range(1, 6)}
    assert 0 < share[1] < 0.08 and all(0.2 < share[d] < 0.3 for d in (2, 3, 4, 5))
    assert len(set(picked)) == 5 and sampler.metrics()["levels/candidates"] >= 8


def test_frontier_fills_the_batch_when_candidates_run_out():
    sampler = frontier(floor=0.01, max_candidates=1)
    sampler.bins = {d: [0.0, 1000.0] for d in range(1, 6)}  # every distance hopeless: keep 0.01
    seeds = sampler.next_seeds(4, 0)
    kept = [seed for seed in seeds if seed < 1004]  # of the 4 looked at (1000..1003), each kept with chance 0.01
    assert len(seeds) == len(set(seeds)) == 4 and sampler.looked == 4
    assert seeds[len(kept) :] == list(range(1004, 1004 + 4 - len(kept))) and sampler.cursor == 1008 - len(kept)


def test_frontier_determinism_and_resume_from_state():
    def history(sampler, iterations):
        out = []
        for it in range(iterations):
            seeds = sampler.next_seeds(4, it)
            sampler.update(seeds, [0.0] * 4, it, successes=[float(s % 3 == 0) for s in seeds])
            out.append(seeds)
        return out

    a, b = frontier(), frontier()
    assert history(a, 8) == history(b, 8)
    restored = frontier()
    restored.load_state_dict(a.state_dict())
    assert restored.bins == a.bins and history(restored, 4) == history(a, 4)


def test_frontier_refusals():
    with pytest.raises(ValueError, match="memory"):
        FrontierSettings(memory=1.5)
    with pytest.raises(ValueError, match="floor"):
        FrontierSettings(floor=0.0)
    with pytest.raises(ValueError, match="max_candidates"):
        FrontierSettings(max_candidates=0)
    with pytest.raises(ValueError, match="successes"):
        frontier().update([1000], [0.5], 0)
    with pytest.raises(ValueError, match="level_sampler='frontier'"):
        LevelSampler("frontier", 0, 0, 0, PLRSettings())  # FrontierSampler is the frontier's class


class NoSolverBandit(BanditTextEnv):
    """The bandit without its oracle: the frontier sampler has nothing to sort levels by."""

    solver_actions = LanguageEnv.solver_actions


def test_frontier_config_checks(tmp_path, monkeypatch):
    from vagen.trainer import config as checks

    assert BanditTextEnv(observation="text").supports_solver and not NoSolverBandit(observation="text").supports_solver
    monkeypatch.setattr(checks, "make_env", lambda env_id, **kwargs: NoSolverBandit(**kwargs))  # not registered
    with pytest.raises(ValueError, match="has no solver"):
        checks.validate_config(config([*TEXT, "trainer.level_sampler=frontier"], tmp_path))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="level_pool=8"):
        checks.validate_config(config([*TEXT, "trainer.level_sampler=frontier", "trainer.level_pool=8"], tmp_path))


def test_trainer_with_the_frontier_sampler_checkpoints_its_counts(tmp_path):
    from vagen.trainer.starpo import StarPOTrainer

    cfg = config([*TEXT, "trainer.level_sampler=frontier", "trainer.group_size=4"], tmp_path)
    trainer = StarPOTrainer(cfg)
    metrics = trainer.train_iteration()
    groups = cfg.trainer.groups
    assert metrics["levels/candidates"] >= groups and metrics["levels/distance_mean"] == 1.0  # the bandit: one pull
    assert sum(n for _, n in trainer.levels.bins.values()) == groups
    state = trainer.state()
    assert state["levels"]["bins"] and state["seed_cursor"] == trainer.levels.cursor
