"""GiGPO step-level credit: worked examples against hand-computed advantages, its properties, the games' state keys,
the batch's anchor ids, and the fallback for a game without a key."""

from __future__ import annotations

import math

import pytest
import torch
from test_trainer import TEXT, VISUAL, config

from vagen.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageParams, anchor_group_stats
from vagen.env import make_env
from vagen.rollout import trajectories_to_batch
from vagen.rollout.trajectory import Trajectory, Turn
from vagen.trainer.config import warn_without_state_key

gigpo = ADVANTAGE_ESTIMATORS.get("gigpo")


def rows(episodes: list[list[tuple[float, int]]], groups: list[int]) -> AdvantageInputs:
    """Each episode is a list of turns (reward, anchor state id; -1 = no key), laid out as [obs][2 sampled]... per
    turn, right-padded; the reward sits on each turn's last sampled token."""
    length = 1 + 3 * max(len(e) for e in episodes) + 1
    mask = torch.zeros(len(episodes), length)
    rewards, states = torch.zeros_like(mask), torch.full(mask.shape, -1, dtype=torch.long)
    for b, episode in enumerate(episodes):
        for k, (reward, state) in enumerate(episode):
            start = 1 + 3 * k
            mask[b, start : start + 2] = 1
            rewards[b, start + 1] = reward
            states[b, start : start + 2] = state
    return AdvantageInputs(
        token_rewards=rewards, response_mask=mask, group_index=torch.tensor(groups), turn_states=states
    )


def per_turn(advantages: torch.Tensor, episodes) -> list[list[float]]:
    return [[round(float(advantages[b, 1 + 3 * k]), 4) for k in range(len(e))] for b, e in enumerate(episodes)]


# Group 0: A plays states 10 → 11 and scores 1 on its second turn; B plays 10 → 12 → 11 and scores nothing.
# γ_T = 0.5. Returns-to-go: A (0.5, 1), B (0, 0, 0). Anchor 10 = {A0, B0}, anchor 11 = {A1, B2} (turn 1 and turn 2:
# grouped across turn indices), anchor 12 = {B1} alone.
EPISODES = [[(0.0, 10), (1.0, 11)], [(0.0, 10), (0.0, 12), (0.0, 11)]]


def test_worked_example_mean_norm():
    """F = 1: A^E = ±0.5; anchor 10: 0.5 and 0 around 0.25; anchor 11: 1 and 0 around 0.5; anchor 12 alone: 0."""
    params = AdvantageParams(gamma_turn=0.5, normalize_std=False)
    advantages, returns = gigpo(rows(EPISODES, [0, 0]), params)
    assert per_turn(advantages, EPISODES) == [[0.5 + 0.25, 0.5 + 0.5], [-0.5 - 0.25, -0.5 + 0.0, -0.5 - 0.5]]
    assert torch.equal(returns, advantages)


def test_worked_example_mean_std_norm():
    """F = Bessel std: every pair {x, y} normalises to ±1/√2; the anchor of one still gives 0."""
    advantages, _ = gigpo(rows(EPISODES, [0, 0]), AdvantageParams(gamma_turn=0.5))
    h = 1 / math.sqrt(2)
    expected = [[h + h, h + h], [-h - h, -h + 0.0, -h - h]]
    got = per_turn(advantages, EPISODES)
    assert [len(t) for t in got] == [2, 3]
    assert [a for t in got for a in t] == pytest.approx([a for t in expected for a in t], abs=1e-4)


def test_step_weight_scales_only_the_step_level():
    params = AdvantageParams(gamma_turn=0.5, normalize_std=False, step_weight=0.0)
    advantages, _ = gigpo(rows(EPISODES, [0, 0]), params)
    assert per_turn(advantages, EPISODES) == [[0.5, 0.5], [-0.5, -0.5, -0.5]]


def test_anchor_groups_of_one_and_turns_without_a_key_get_only_the_episode_level():
    """No state repeats (or no key at all): GiGPO is GRPO exactly."""
    unique = [[(0.0, 1), (1.0, 2)], [(0.0, 3), (0.0, 4)], [(2.0, -1)]]
    inputs = rows(unique, [0, 0, 0])
    grpo, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inputs, AdvantageParams())
    advantages, _ = gigpo(inputs, AdvantageParams())
    assert torch.allclose(advantages, grpo)
    no_states = AdvantageInputs(inputs.token_rewards, inputs.response_mask, group_index=inputs.group_index)
    assert torch.allclose(gigpo(no_states, AdvantageParams())[0], grpo)


def test_states_are_matched_within_their_ids_only_and_masked_positions_do_not_matter():
    """Ids are taken as given (the batch makes them per group); rewards and ids off the mask change nothing."""
    inputs = rows(EPISODES, [0, 0])
    noisy_rewards = inputs.token_rewards + (1 - inputs.response_mask) * 7.0
    noisy_states = torch.where(inputs.response_mask.bool(), inputs.turn_states, torch.full_like(inputs.turn_states, 11))
    noisy = AdvantageInputs(
        noisy_rewards, inputs.response_mask, group_index=inputs.group_index, turn_states=noisy_states
    )
    params = AdvantageParams(gamma_turn=0.5)
    assert torch.allclose(gigpo(noisy, params)[0], gigpo(inputs, params)[0])
    assert float(gigpo(inputs, params)[0][inputs.response_mask == 0].abs().sum()) == 0.0


def test_anchor_group_stats():
    """5 turns, 4 of them in anchors shared with another turn; keyed anchors 10 (2), 11 (2), 12 (1): mean 5/3."""
    inputs = rows(EPISODES, [0, 0])
    from vagen.algos.advantages import turn_ids_from_mask

    stats = anchor_group_stats(inputs.turn_states, turn_ids_from_mask(inputs.response_mask), inputs.response_mask)
    assert float(stats["step_group_share"]) == pytest.approx(4 / 5)
    assert float(stats["step_group_size"]) == pytest.approx(5 / 3)


def test_sokoban_state_key_is_the_position_and_returns_after_a_round_trip():
    """A move that pushes nothing, then its reverse: the same state, so the same key (turns at different indices)."""
    env, seen = make_env("vagen/Sokoban-v0", max_turns=5), 0
    answer = "<think>x</think><answer>{}</answer>"
    for seed in range(10):
        for there, back in (("Left", "Right"), ("Right", "Left"), ("Up", "Down"), ("Down", "Up")):
            env.reset(seed=seed)
            start = env.unwrapped.state_key()
            env.step(answer.format(there))
            player, boxes = env.unwrapped.state_key()
            if player != start[0] and boxes == start[1]:
                env.step(answer.format(back))
                assert env.unwrapped.state_key() == start
                seen += 1
            else:
                assert (player, boxes) == start or boxes != start[1]  # blocked, or a push moved a box
    assert seen > 5


KEYED = ["vagen/Sokoban-v0", "vagen/FrozenLake-v0", "vagen/Navigation-v0", "vagen/Sudoku-v0"]


@pytest.mark.parametrize("env_id", KEYED)
def test_games_with_a_key_give_equal_keys_for_equal_resets(env_id):
    first, second = make_env(env_id), make_env(env_id)
    first.reset(seed=5), second.reset(seed=5)
    assert first.unwrapped.state_key() is not None
    assert first.unwrapped.state_key() == second.unwrapped.state_key()


def _turn(key, response=(5, 6)) -> Turn:
    return Turn(observation="o", images=[], prompt_ids=[1, 2], response_ids=list(response), state_key=key)


def test_batch_anchor_ids_are_per_group_and_state():
    """The same key in one group shares an id (at any turn index); in another group it does not; None gives -1."""
    a = Trajectory(group_id=0, seed=1, env_name="t", turns=[_turn("s"), _turn("t")])
    b = Trajectory(group_id=0, seed=1, env_name="t", turns=[_turn("t"), _turn(None)])
    c = Trajectory(group_id=1, seed=2, env_name="t", turns=[_turn("s")])
    for trajectory in (a, b, c):
        for turn in trajectory.turns:
            turn.response_logprobs = [0.0] * len(turn.response_ids)
    batch = trajectories_to_batch([a, b, c], pad_token_id=0)

    def ids(row):
        turns = range(int(batch.turn_ids[row].max()) + 1)
        return [int(batch.turn_states[row][batch.turn_ids[row] == k][0]) for k in turns]

    assert ids(0)[1] == ids(1)[0] and ids(0)[0] != ids(0)[1]
    assert ids(1)[1] == -1
    assert ids(2)[0] not in (ids(0)[0], ids(0)[1])
    assert bool((batch.turn_states[batch.response_mask == 0] == -1).all())


def test_a_game_without_a_key_falls_back_with_one_warning():
    with pytest.warns(UserWarning, match="no state_key.*falls back"):
        assert warn_without_state_key(config([*TEXT, "algorithm=gigpo"]))
    assert not warn_without_state_key(config([*VISUAL, "algorithm=gigpo"]))
    assert not warn_without_state_key(config([*TEXT, "algorithm=grpo"]))


def test_gigpo_preset_trains_with_step_groups_logged():
    from vagen.trainer.starpo import StarPOTrainer

    trainer = StarPOTrainer(config([*VISUAL, "algorithm=gigpo", "trainer.group_size=4", "trainer.mini_batch_size=8"]))
    before = {n: p.detach().clone() for n, p in trainer.learner.model.named_parameters()}
    metrics = trainer.train_iteration()
    assert {"rollout/step_group_share", "rollout/step_group_size"} <= metrics.keys()
    # Every group's rollouts start from one level: their first turns at least share an anchor state.
    assert metrics["rollout/step_group_share"] > 0 and metrics["rollout/step_group_size"] >= 1
    assert all(math.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(p, before[n]) for n, p in trainer.learner.model.named_parameters())
