"""Advantage estimators: each against a plain-Python loop, closed-form examples, and masking properties."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from vagen.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    masked_whiten,
    turn_end_mask,
    turn_ids_from_mask,
)

SHAPES = [(1, 7), (3, 16), (6, 40)]
SEEDS = [0, 1, 2]


def random_multiturn_batch(seed: int, batch: int, length: int, num_groups: int = 2) -> AdvantageInputs:
    """Rows laid out as [prompt obs][turn][obs][turn]...[padding], with random rewards and values."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for row in range(batch):
        t = rng.randint(0, 2)  # prompt / first observation
        while t < length:
            turn_length = rng.randint(1, 5)
            mask[row, t : t + turn_length] = True
            t += turn_length + rng.randint(1, 3)  # observation gap between turns
            if rng.random() < 0.2:
                break  # trailing padding
    rewards = torch.randn(batch, length, generator=gen) * (torch.rand(batch, length, generator=gen) < 0.4)
    values = torch.randn(batch, length, generator=gen)
    groups = torch.randint(0, num_groups, (batch,), generator=gen)
    return AdvantageInputs(token_rewards=rewards * mask, response_mask=mask, values=values, group_index=groups)


def rows(inputs: AdvantageInputs) -> list[tuple[list[int], list[float], list[float]]]:
    """Per row: sampled positions, the full reward list, the full value list (plain Python)."""
    out = []
    for b in range(inputs.token_rewards.shape[0]):
        positions = [t for t in range(inputs.token_rewards.shape[1]) if bool(inputs.response_mask[b, t])]
        out.append((positions, inputs.token_rewards[b].tolist(), inputs.values[b].tolist()))
    return out


def split_turns(positions: list[int]) -> list[list[int]]:
    turns: list[list[int]] = []
    for t in positions:
        if turns and turns[-1][-1] == t - 1:
            turns[-1].append(t)
        else:
            turns.append([t])
    return turns


def loop_gae_over(positions, rewards, values, gamma, lam) -> dict[int, float]:
    """Textbook GAE over an ordered list of positions; nothing after the last one."""
    advantages, next_value, next_adv = {}, 0.0, 0.0
    for t in reversed(positions):
        delta = rewards[t] + gamma * next_value - values[t]
        next_adv = delta + gamma * lam * next_adv
        next_value = values[t]
        advantages[t] = next_adv
    return advantages


def reference_gae(inputs, gamma, lam) -> torch.Tensor:
    out = torch.zeros_like(inputs.token_rewards)
    for b, (positions, rewards, values) in enumerate(rows(inputs)):
        for t, a in loop_gae_over(positions, rewards, values, gamma, lam).items():
            out[b, t] = a
    return out


def reference_bilevel(inputs, gamma, lam, gamma_turn, lam_turn) -> torch.Tensor:
    out = torch.zeros_like(inputs.token_rewards)
    for b, (positions, rewards, values) in enumerate(rows(inputs)):
        turns = split_turns(positions)
        turn_returns, next_w, next_a = [0.0] * len(turns), 0.0, 0.0
        for k in reversed(range(len(turns))):
            w = values[turns[k][-1]]
            delta = sum(rewards[t] for t in turns[k]) + gamma_turn * next_w - w
            next_a = delta + gamma_turn * lam_turn * next_a
            next_w = w
            turn_returns[k] = next_a + w
        for k, turn in enumerate(turns):
            turn_rewards = {t: 0.0 for t in turn}
            turn_rewards[turn[-1]] = turn_returns[k]
            for t, a in loop_gae_over(turn, turn_rewards, values, gamma, lam).items():
                out[b, t] = a
    return out


def reference_group(inputs, kind: str, eps: float = 1e-6, unbiased: bool = True) -> torch.Tensor:
    totals = (inputs.token_rewards * inputs.response_mask).sum(1).tolist()
    groups = inputs.group_index.tolist()
    out = torch.zeros_like(inputs.token_rewards)
    for i, total in enumerate(totals):
        members = [totals[j] for j in range(len(totals)) if groups[j] == groups[i]]
        mean = sum(members) / len(members)
        if kind == "grpo":
            std = 0.0 if len(members) == 1 else (statistics.stdev if unbiased else statistics.pstdev)(members)
            advantage = (total - mean) / (std + eps)
        elif kind == "drgrpo":
            advantage = total - mean
        else:
            others = [totals[j] for j in range(len(totals)) if groups[j] == groups[i] and j != i]
            advantage = total - sum(others) / len(others) if others else 0.0
        out[i] = advantage * inputs.response_mask[i].float()
    return out


def reference_grpo_turn(inputs, gamma_turn: float = 0.95, eps: float = 1e-6) -> torch.Tensor:
    """Per row: turns as maximal runs, return-to-go per turn; per (group, turn index) mean and stdev."""
    groups = inputs.group_index.tolist()
    per_row = []
    for positions, rewards, _ in rows(inputs):
        turns = split_turns(positions)
        to_go, running = [0.0] * len(turns), 0.0
        for k in reversed(range(len(turns))):
            running = sum(rewards[t] for t in turns[k]) + gamma_turn * running
            to_go[k] = running
        per_row.append((turns, to_go))
    out = torch.zeros_like(inputs.token_rewards)
    for i, (turns, to_go) in enumerate(per_row):
        for k, turn in enumerate(turns):
            peers = [g[k] for j, (_, g) in enumerate(per_row) if groups[j] == groups[i] and len(g) > k]
            std = statistics.stdev(peers) if len(peers) > 1 else 0.0
            for t in turn:
                out[i, t] = (to_go[k] - sum(peers) / len(peers)) / (std + eps)
    return out


def estimate(name: str, inputs: AdvantageInputs, **params) -> tuple[torch.Tensor, torch.Tensor]:
    return ADVANTAGE_ESTIMATORS.get(name)(inputs, AdvantageParams(**params))


# ----------------------------------------------------------------------------------- loop == vectorised


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_loop(seed, shape, gamma, lam):
    inputs = random_multiturn_batch(seed, *shape)
    advantages, returns = estimate("gae", inputs, gamma=gamma, lam=lam)
    expected = reference_gae(inputs, gamma, lam)
    torch.testing.assert_close(advantages, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns, (expected + inputs.values) * inputs.response_mask)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("gamma", "lam", "gamma_turn", "lam_turn"), [(1, 1, 0.95, 1), (0.99, 0.9, 0.9, 0.8)])
def test_bilevel_gae_matches_loop(seed, shape, gamma, lam, gamma_turn, lam_turn):
    inputs = random_multiturn_batch(seed, *shape)
    advantages, returns = estimate(
        "bilevel_gae", inputs, gamma=gamma, lam=lam, gamma_turn=gamma_turn, lam_turn=lam_turn
    )
    expected = reference_bilevel(inputs, gamma, lam, gamma_turn, lam_turn)
    torch.testing.assert_close(advantages, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns, (expected + inputs.values) * inputs.response_mask)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_group_estimators_match_loop(seed, shape, name):
    inputs = random_multiturn_batch(seed, *shape, num_groups=3)
    advantages, returns = estimate(name, inputs)
    torch.testing.assert_close(advantages, reference_group(inputs, name), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns, advantages)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gamma_turn", [1.0, 0.9])
def test_grpo_turn_matches_loop(seed, shape, gamma_turn):
    inputs = random_multiturn_batch(seed, *shape, num_groups=2)
    advantages, returns = estimate("grpo_turn", inputs, gamma_turn=gamma_turn)
    torch.testing.assert_close(advantages, reference_grpo_turn(inputs, gamma_turn), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(returns, advantages)


def test_grpo_turn_of_one_turn_episodes_is_grpo():
    inputs = single_token_trajectories([1.0, 0.0, 3.0, 2.0, 5.0], [0, 0, 0, 1, 1])
    torch.testing.assert_close(estimate("grpo_turn", inputs)[0], estimate("grpo", inputs)[0])


def test_grpo_turn_credits_each_turn_with_what_followed_it():
    # Two rollouts of one group, two turns each; turn rewards (1, 0) and (0, 1): equal totals, so grpo gives 0.
    # Turn 0 returns-to-go (γ_T = 1): 1 vs 1 -> 0. Turn 1: 0 vs 1 -> ∓ 1/(std = sqrt(0.5)).
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    inputs = AdvantageInputs(rewards, mask, group_index=torch.tensor([3, 3]))
    advantages, _ = estimate("grpo_turn", inputs, gamma_turn=1.0)
    a = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(advantages, torch.tensor([[0.0, 0.0, 0.0, -a], [0.0, 0.0, 0.0, a]]), atol=1e-5, rtol=0)
    assert torch.equal(estimate("grpo", inputs)[0], torch.zeros(2, 4))


def test_grpo_population_std_option_matches_loop():
    inputs = random_multiturn_batch(5, 8, 20, num_groups=2)
    advantages, _ = estimate("grpo", inputs, unbiased_std=False)
    torch.testing.assert_close(advantages, reference_group(inputs, "grpo", unbiased=False), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------- worked examples


def single_token_trajectories(totals: list[float], groups: list[int]) -> AdvantageInputs:
    return AdvantageInputs(
        token_rewards=torch.tensor(totals)[:, None],
        response_mask=torch.ones(len(totals), 1),
        group_index=torch.tensor(groups),
    )


def test_grpo_known_group():
    # Group {1, 0, 0, 1}: mean 0.5, unbiased std sqrt(1/3), so A = ±0.5·sqrt(3).
    advantages, _ = estimate("grpo", single_token_trajectories([1, 0, 0, 1], [4, 4, 4, 4]), eps=0.0)
    half_sqrt3 = 0.5 * math.sqrt(3)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([half_sqrt3, -half_sqrt3, -half_sqrt3, half_sqrt3]))


def test_drgrpo_and_rloo_known_group():
    inputs = single_token_trajectories([1.0, 2.0, 3.0], [0, 0, 0])
    torch.testing.assert_close(estimate("drgrpo", inputs)[0][:, 0], torch.tensor([-1.0, 0.0, 1.0]))
    # Leave-one-out baselines: 2.5, 2.0, 1.5.
    torch.testing.assert_close(estimate("rloo", inputs)[0][:, 0], torch.tensor([-1.5, 0.0, 1.5]))


def test_group_estimators_on_degenerate_groups_give_zero_not_nan():
    # Group 0 has zero reward variance; group 9 has a single member.
    inputs = single_token_trajectories([1.0, 1.0, 1.0, 5.0], [0, 0, 0, 9])
    for name in ("grpo", "drgrpo", "rloo"):
        advantages, _ = estimate(name, inputs)
        assert torch.equal(advantages, torch.zeros_like(advantages)), name


def test_group_ids_need_not_be_contiguous():
    a = single_token_trajectories([1.0, 3.0, 0.0, 2.0], [7, -3, 7, -3])
    b = single_token_trajectories([1.0, 3.0, 0.0, 2.0], [0, 1, 0, 1])
    for name in ("grpo", "drgrpo", "rloo"):
        torch.testing.assert_close(estimate(name, a)[0], estimate(name, b)[0])


def test_group_advantage_is_shared_by_every_sampled_token_and_uses_all_turn_rewards():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 1, 0, 0, 1, 1]], dtype=torch.bool)
    rewards = torch.zeros(2, 6)
    rewards[0, 2], rewards[0, 4] = 1.0, 2.0  # R_0 = 3 over two turns
    rewards[1, 5] = 1.0  # R_1 = 1
    advantages, _ = estimate("drgrpo", AdvantageInputs(rewards, mask, group_index=torch.tensor([0, 0])))
    expected = torch.tensor([[0, 1, 1, 0, 1, 0], [0, -1, 0, 0, -1, -1]], dtype=torch.float32)
    torch.testing.assert_close(advantages, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_with_unit_gamma_lambda_is_reward_to_go_minus_value(seed):
    inputs = random_multiturn_batch(seed, 4, 24)
    advantages, _ = estimate("gae", inputs, gamma=1.0, lam=1.0)
    rewards = inputs.token_rewards * inputs.response_mask
    reward_to_go = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1])
    torch.testing.assert_close(advantages, (reward_to_go - inputs.values) * inputs.response_mask)


def test_gae_td0_worked_example_bridges_observation_gap():
    # Sampled tokens at 0, 1 | observation at 2, 3 | sampled at 4. λ=0 gives one-step TD errors.
    mask = torch.tensor([[1, 1, 0, 0, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.25, 9.0, 9.0, 1.0]])
    advantages, _ = estimate("gae", AdvantageInputs(rewards, mask, values), gamma=0.5, lam=0.0)
    # δ_0 = 0 + .5·.25 − .5; δ_1 = 1 + .5·V_4 − .25 (skips the gap); δ_4 = 2 − 1.
    torch.testing.assert_close(advantages, torch.tensor([[-0.375, 1.25, 0.0, 0.0, 1.0]]))


def test_bilevel_gae_closed_form_with_unit_lambdas():
    # Turn 0 = positions 1-2 (reward 1), turn 1 = positions 5-7 (reward 2), γ_T = 0.5.
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0]], dtype=torch.bool)
    rewards = torch.zeros(1, 9)
    rewards[0, 2], rewards[0, 7] = 1.0, 2.0
    values = torch.arange(9, dtype=torch.float32)[None] / 10
    inputs = AdvantageInputs(rewards, mask, values)
    advantages, returns = estimate("bilevel_gae", inputs, gamma=1.0, lam=1.0, gamma_turn=0.5, lam_turn=1.0)
    turn_return = torch.tensor([[0, 2, 2, 0, 0, 2, 2, 2, 0]], dtype=torch.float32)  # G_0 = 1 + .5·2, G_1 = 2
    torch.testing.assert_close(advantages, (turn_return - values) * mask)
    torch.testing.assert_close(returns, turn_return)


def test_bilevel_gae_turn_td0_bootstraps_from_next_turn_end_value():
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    values = torch.tensor([[0.3, 0.4, 7.0, 0.6]])
    advantages, _ = estimate("bilevel_gae", AdvantageInputs(rewards, mask, values), gamma_turn=0.5, lam_turn=0.0)
    # G_0 = R_0 + γ_T W_1 = 1 + .5·.6 = 1.3; G_1 = 0. With γ = λ = 1 inside turns, A_t = G_k − V_t.
    torch.testing.assert_close(advantages, torch.tensor([[1.0, 0.9, 0.0, -0.6]]))


# ----------------------------------------------------------------------------------- masking properties


@pytest.mark.parametrize("name", ["gae", "bilevel_gae", "grpo", "grpo_turn", "drgrpo", "rloo"])
@pytest.mark.parametrize("seed", SEEDS)
def test_values_and_rewards_at_masked_positions_do_not_change_results(name, seed):
    inputs = random_multiturn_batch(seed, 4, 30)
    noise = torch.randn(4, 30, generator=torch.Generator().manual_seed(seed + 100)) * 50
    off_mask = ~inputs.response_mask
    perturbed = AdvantageInputs(
        token_rewards=inputs.token_rewards + noise * off_mask,
        response_mask=inputs.response_mask,
        values=inputs.values + noise.flip(1) * off_mask,
        group_index=inputs.group_index,
    )
    for got, want in zip(estimate(name, perturbed), estimate(name, inputs), strict=True):
        torch.testing.assert_close(got, want)
        assert torch.all(got[off_mask] == 0)


@pytest.mark.parametrize("name", ["gae", "bilevel_gae"])
def test_widening_observation_gaps_does_not_change_advantages(name):
    inputs = random_multiturn_batch(11, 3, 20)
    # Insert 3 extra masked-out columns after every existing one. Turn ids carried over from the original
    # layout keep each turn whole (the gaps inside a turn are then masked-out tokens of that turn).
    keep = []
    for t in range(20):
        keep.append(t)
        if t < 19:
            keep.extend([-1] * 3)
    index = torch.tensor([max(t, 0) for t in keep])
    is_original = torch.tensor([t >= 0 for t in keep])
    widened = AdvantageInputs(
        token_rewards=inputs.token_rewards[:, index] * is_original,
        response_mask=inputs.response_mask[:, index] & is_original,
        values=inputs.values[:, index],
        turn_ids=turn_ids_from_mask(inputs.response_mask)[:, index],
    )
    wide_adv, _ = estimate(name, widened, gamma=0.9, lam=0.8)
    adv, _ = estimate(name, inputs, gamma=0.9, lam=0.8)
    torch.testing.assert_close(wide_adv[:, is_original], adv)


def test_explicit_turn_ids_split_adjacent_turns():
    # Two turns with no observation between them: only explicit turn ids can tell them apart.
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    adjacent = AdvantageInputs(
        rewards, torch.ones(1, 4, dtype=torch.bool), values, turn_ids=torch.tensor([[0, 0, 1, 1]])
    )
    gapped_mask = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.bool)
    gapped = AdvantageInputs(
        torch.tensor([[0.0, 1.0, 0.0, 0.0, 2.0]]), gapped_mask, torch.tensor([[0.1, 0.2, 5.0, 0.3, 0.4]])
    )
    params = {"gamma": 0.9, "lam": 0.7, "gamma_turn": 0.8, "lam_turn": 0.6}
    got, _ = estimate("bilevel_gae", adjacent, **params)
    want, _ = estimate("bilevel_gae", gapped, **params)
    torch.testing.assert_close(got, want[:, [0, 1, 3, 4]])


def test_turn_helpers():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 1], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    ids = turn_ids_from_mask(mask)
    assert ids.tolist() == [[-1, 0, 0, -1, 1, -1, 2], [0, 0, 0, 0, -1, -1, -1]]
    ends = turn_end_mask(ids, mask)
    assert ends.int().tolist() == [[0, 0, 1, 0, 1, 0, 1], [0, 0, 0, 1, 0, 0, 0]]


def test_low_precision_inputs_give_float32_outputs():
    inputs = random_multiturn_batch(3, 2, 12)
    half = AdvantageInputs(
        inputs.token_rewards.bfloat16(), inputs.response_mask.int(), inputs.values.bfloat16(), inputs.group_index
    )
    for name in ADVANTAGE_ESTIMATORS:
        advantages, returns = estimate(name, half)
        assert advantages.dtype == returns.dtype == torch.float32


# ----------------------------------------------------------------------------------- whitening


def test_masked_whiten_normalises_only_sampled_tokens():
    inputs = random_multiturn_batch(4, 4, 25)
    x = inputs.values * 3 + 7 + (~inputs.response_mask) * 1000.0  # huge junk off the mask
    whitened = masked_whiten(x, inputs.response_mask)
    sampled = whitened[inputs.response_mask]
    torch.testing.assert_close(sampled.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(sampled.var(unbiased=False), torch.tensor(1.0), atol=1e-4, rtol=0)
    assert torch.all(whitened[~inputs.response_mask] == 0)


def test_masked_whiten_without_shift_keeps_signs():
    x = torch.tensor([[1.0, 2.0, -3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    scaled = masked_whiten(x, mask, shift_mean=False)
    std = torch.tensor([1.0, 2.0, -3.0]).var(unbiased=False).sqrt()
    torch.testing.assert_close(scaled, torch.tensor([[1.0, 2.0, -3.0, 0.0]]) / std)


# ----------------------------------------------------------------------------------- errors


def test_registry_lists_every_estimator_and_rejects_unknown_names():
    assert ADVANTAGE_ESTIMATORS.names() == ["bilevel_gae", "drgrpo", "gae", "gigpo", "grpo", "grpo_turn", "rloo"]
    with pytest.raises(ValueError, match=r"'ppo'.*bilevel_gae.*drgrpo.*gae.*grpo.*rloo"):
        ADVANTAGE_ESTIMATORS.get("ppo")


def test_missing_inputs_raise_naming_the_field():
    inputs = AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3))
    for name in ("gae", "bilevel_gae"):
        with pytest.raises(ValueError, match="values"):
            estimate(name, inputs)
    for name in ("grpo", "grpo_turn", "drgrpo", "rloo"):
        with pytest.raises(ValueError, match="group_index"):
            estimate(name, inputs)


def test_bad_shapes_and_params_raise():
    with pytest.raises(ValueError, match="response_mask"):
        AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="group_index"):
        AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3), group_index=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        AdvantageInputs(torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="gamma_turn"):
        AdvantageParams(gamma_turn=1.5)
