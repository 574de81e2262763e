"""SNR-aware group filtering: worked examples, every strategy's rule, and properties over random batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vagen.filtering import (
    EMPTY_POLICIES,
    FILTER_STRATEGIES,
    SPREAD_STATS,
    TOP_P_RELATIVE_TOLERANCE,
    apply_empty_policy,
    population_std,
    rank_groups,
    select_groups,
)


def rewards_with_stds(stds: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[G, 2] rewards whose population std per row is exactly stds[g]: the pair (s, −s) has mean 0, std s."""
    column = torch.tensor(stds, dtype=dtype)
    return torch.stack([column, -column], dim=1)


def spreads_of(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid
    return population_std(rewards.to(torch.float64), valid)


# ----------------------------------------------------------------------------- worked examples


def test_pair_construction_has_exactly_the_asked_population_std():
    stds = [0.0, 0.0, 0.3, 1.0, 2.0, 3.0, 4.0, 5.0]
    expected = torch.tensor(stds, dtype=torch.float32).to(torch.float64)  # the float32 values, exactly
    assert torch.equal(spreads_of(rewards_with_stds(stds)), expected)


def test_top_p_keeps_the_smallest_prefix_reaching_ninety_percent():
    # Σ = 15.3, 0.9·Σ = 13.77: 5+4+3 = 12 falls short, 5+4+3+2 = 14 reaches it.
    kept, metrics = select_groups(rewards_with_stds([0, 0, 0.3, 1, 2, 3, 4, 5]), "top_p", 0.9)
    assert kept.tolist() == [4, 5, 6, 7]
    assert kept.dtype == torch.long
    assert metrics["kept_count"] == 4 and metrics["kept_ratio"] == 0.5
    assert metrics["zero_spread_count"] == 2
    assert metrics["kept_spread_fraction"].item() == pytest.approx(14 / 15.3, rel=1e-6)
    assert metrics["reward_std_mean"].item() == pytest.approx(15.3 / 8, rel=1e-6)
    assert metrics["reward_std_std"].item() == pytest.approx(np.std([0, 0, 0.3, 1, 2, 3, 4, 5]), rel=1e-6)


def test_top_p_result_does_not_depend_on_where_the_groups_sit():
    stds = [3, 0, 5, 0.3, 1, 4, 0, 2]  # the same spreads as above, shuffled
    kept, _ = select_groups(rewards_with_stds(stds), "top_p", 0.9)
    assert kept.tolist() == [0, 2, 5, 7]  # spreads 3, 5, 4, 2, listed by ascending index


def test_all_zero_spreads_keep_nothing_and_metrics_stay_finite():
    rewards = torch.full((6, 4), 0.7)
    kept, metrics = select_groups(rewards, "top_p", 0.9)
    assert kept.numel() == 0 and kept.dtype == torch.long
    assert metrics["zero_spread_count"] == 6
    assert metrics["reward_std_ratio"] == 0 and metrics["kept_spread_fraction"] == 0
    assert metrics["chosen_reward_mean"] == 0 and metrics["chosen_reward_std"] == 0
    assert all(torch.isfinite(value) for value in metrics.values())


def test_eight_equal_spreads_keep_all_eight():
    kept, _ = select_groups(rewards_with_stds([0.5] * 8), "top_p", 0.9)  # seven hold 7/8 = 0.875 < 0.9
    assert kept.tolist() == list(range(8))


def test_top_p_at_one_keeps_exactly_the_groups_with_signal():
    kept, _ = select_groups(rewards_with_stds([0, 2, 0, 1e-6, 3]), "top_p", 1.0)
    assert kept.tolist() == [1, 3, 4]
    # A spread below the rounding tolerance (1e-9 of the total) is noise, even at p = 1.
    kept, _ = select_groups(rewards_with_stds([2, 1e-12, 3], dtype=torch.float64), "top_p", 1.0)
    assert kept.tolist() == [0, 2]


def test_top_p_accepts_a_prefix_that_reaches_the_target_up_to_rounding():
    # In real arithmetic 9 of 11 equal spreads hold exactly p = 9/11 of the mass; in float64 the
    # cumulative sum lands one ulp below p · Σ, and without the tolerance a tenth group would be kept.
    kept, _ = select_groups(rewards_with_stds([0.1] * 11), "top_p", 9 / 11)
    assert kept.tolist() == list(range(9))
    kept, _ = select_groups(rewards_with_stds([1.0] * 4), "top_p", 0.5)
    assert kept.tolist() == [0, 1]


def test_population_not_sample_std_and_var_keys_are_named_by_the_statistic():
    rewards = torch.tensor([[1.0, 0.0], [2.0, 2.0]])
    _, std_metrics = select_groups(rewards, "none", stat="std")
    _, var_metrics = select_groups(rewards, "none", stat="var")
    assert std_metrics["reward_std_mean"].item() == pytest.approx(0.25)  # (0.5 + 0) / 2; sample std would give 0.354
    assert var_metrics["reward_var_mean"].item() == pytest.approx(0.125)  # (0.25 + 0) / 2
    assert "reward_std_mean" not in var_metrics and "reward_var_mean" not in std_metrics
    assert set(SPREAD_STATS.names()) == {"std", "var"}


def test_chosen_reward_stats_pool_the_kept_groups_only():
    rewards = torch.tensor([[0.0, 2.0], [5.0, 5.0], [1.0, 3.0]])
    kept, metrics = select_groups(rewards, "min_threshold", 0.5)
    assert kept.tolist() == [0, 2]
    assert metrics["chosen_reward_mean"].item() == pytest.approx(1.5)  # mean of 0, 2, 1, 3
    assert metrics["chosen_reward_std"].item() == pytest.approx(math.sqrt(1.25))


def test_valid_mask_ignores_padding_and_never_keeps_an_empty_group():
    rewards = torch.tensor([[1.0, 3.0, math.nan], [0.0, 0.0, 0.0], [math.nan, math.nan, math.nan]])
    valid = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    kept, metrics = select_groups(rewards, "none", valid_mask=valid)
    assert kept.tolist() == [0, 1]
    assert metrics["invalid_group_count"] == 1 and metrics["zero_spread_count"] == 1
    assert metrics["reward_std_mean"].item() == pytest.approx(0.5)  # groups 0 (std 1) and 1 (std 0)
    kept, _ = select_groups(rewards, "top_k_abs", 3, valid_mask=valid)
    assert kept.tolist() == [0, 1]


def test_top_k_rounds_the_fraction_up_and_fills_with_zero_spread_groups():
    stds = [0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert select_groups(rewards_with_stds(stds), "top_k", 0.7)[0].numel() == 7  # 0.7·10 is 7, not 8
    assert select_groups(rewards_with_stds(stds[:8]), "top_k", 0.3)[0].tolist() == [0, 1, 3]  # ceil(2.4) = 3
    assert select_groups(rewards_with_stds(stds), "top_k", 0.1)[0].tolist() == [3]


def test_top_k_abs_min_threshold_and_none():
    rewards = rewards_with_stds([0.5, 3.0, 1.0, 0.0, 2.0])
    assert select_groups(rewards, "top_k_abs", 2)[0].tolist() == [1, 4]
    assert select_groups(rewards, "top_k_abs", 99)[0].tolist() == [0, 1, 2, 3, 4]
    assert select_groups(rewards, "top_k_abs", 0)[0].numel() == 0
    assert select_groups(rewards, "min_threshold", 1.0)[0].tolist() == [1, 2, 4]
    assert select_groups(rewards, "min_threshold", 0.0)[0].tolist() == [0, 1, 2, 3, 4]
    assert select_groups(rewards, "none")[0].tolist() == [0, 1, 2, 3, 4]


def test_ties_break_by_group_index_in_large_batches():
    # From a few dozen elements torch's default (unstable) sort reorders ties; the filter must not.
    stds = [float((7 * g) % 3) for g in range(200)]
    reference = sorted(range(200), key=lambda g: (-stds[g], g))
    for count in (50, 100, 150):
        kept, _ = select_groups(rewards_with_stds(stds), "top_k_abs", count)
        assert kept.tolist() == sorted(reference[:count])
    kept, _ = select_groups(rewards_with_stds(stds), "top_p", 0.5)
    assert kept.tolist() == sorted(reference[: kept.numel()])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "nucleus"}, "valid: \\['min_threshold', 'none', 'top_k', 'top_k_abs', 'top_p'\\]"),
        ({"stat": "iqr"}, "valid: \\['std', 'var'\\]"),
        ({"strategy": "top_p", "value": 0.0}, "top_p needs value in \\(0, 1\\]"),
        ({"strategy": "top_p", "value": 1.5}, "top_p needs value in \\(0, 1\\]"),
        ({"strategy": "top_k", "value": 3}, "use top_k_abs"),
        ({"strategy": "top_k_abs", "value": 2.5}, "whole number"),
        ({"strategy": "min_threshold", "value": -1.0}, "threshold >= 0"),
    ],
)
def test_bad_arguments_raise_naming_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_groups(rewards_with_stds([1.0, 2.0]), **kwargs)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="float tensor of shape"):
        select_groups(torch.ones(4))
    with pytest.raises(ValueError, match="float tensor of shape"):
        select_groups(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one group"):
        select_groups(torch.ones(0, 4))
    with pytest.raises(ValueError, match="bool tensor shaped like rewards"):
        select_groups(torch.ones(2, 2), valid_mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match="NaN or inf"):
        select_groups(torch.tensor([[1.0, math.nan]]))


def test_apply_empty_policy():
    empty = torch.zeros(0, dtype=torch.long)
    assert apply_empty_policy(empty, 3, "keep_all").tolist() == [0, 1, 2]
    assert apply_empty_policy(empty, 3, "skip").numel() == 0
    assert apply_empty_policy(empty, 3, "reroll").numel() == 0
    assert apply_empty_policy(torch.tensor([2]), 3, "keep_all").tolist() == [2]
    assert EMPTY_POLICIES == ("skip", "reroll", "keep_all")
    with pytest.raises(ValueError, match="valid: \\['skip', 'reroll', 'keep_all'\\]"):
        apply_empty_policy(empty, 3, "retry")


# ----------------------------------------------------------------------------- properties

reward_values = st.one_of(
    st.integers(min_value=0, max_value=3).map(float),  # a small grid makes ties between groups common
    st.floats(min_value=-10, max_value=10, allow_nan=False, width=32),
)


@st.composite
def reward_batches(draw) -> torch.Tensor:
    num_groups = draw(st.integers(min_value=1, max_value=12))
    group_size = draw(st.integers(min_value=1, max_value=5))
    values = draw(st.lists(reward_values, min_size=num_groups * group_size, max_size=num_groups * group_size))
    return torch.tensor(values, dtype=torch.float32).reshape(num_groups, group_size)


def _is_rank_prefix(kept: torch.Tensor, spread: torch.Tensor) -> bool:
    """The kept groups are the first len(kept) groups of the deterministic ranking."""
    order = rank_groups(spread, torch.ones_like(spread, dtype=torch.bool))
    return sorted(order[: kept.numel()].tolist()) == kept.tolist()


@settings(max_examples=150, deadline=None)
@given(rewards=reward_batches(), p=st.floats(min_value=0.01, max_value=1.0))
def test_top_p_keeps_the_minimal_high_spread_prefix(rewards, p):
    spread = spreads_of(rewards)
    kept, metrics = select_groups(rewards, "top_p", p)
    total = spread.sum().item()
    kept_mass = spread[kept].sum().item()
    assert torch.equal(kept, kept.sort().values) and kept.unique().numel() == kept.numel()
    assert _is_rank_prefix(kept, spread)
    assert bool((spread[kept] > 0).all())
    if total == 0:
        assert kept.numel() == 0
    else:
        assert kept_mass >= (p - TOP_P_RELATIVE_TOLERANCE) * total - 1e-12 * total
        smallest_kept = spread[kept].min().item()
        assert kept_mass - smallest_kept < (p - TOP_P_RELATIVE_TOLERANCE) * total  # one fewer would not do
    assert all(bool(torch.isfinite(value)) for value in metrics.values())


@settings(max_examples=100, deadline=None)
@given(rewards=reward_batches(), p=st.floats(min_value=0.05, max_value=1.0), seed=st.integers(0, 2**16))
def test_permuting_groups_permutes_the_kept_set(rewards, p, seed):
    permutation = torch.randperm(rewards.shape[0], generator=torch.Generator().manual_seed(seed))
    kept, _ = select_groups(rewards, "top_p", p)
    kept_permuted, _ = select_groups(rewards[permutation], "top_p", p)
    spread = spreads_of(rewards)
    # Up to ties: the same number of groups and the same multiset of spreads.
    assert torch.equal(spread[kept].sort().values, spread[permutation][kept_permuted].sort().values)
    if spread.unique().numel() == spread.numel():  # no ties: exactly the same groups
        assert sorted(permutation[kept_permuted].tolist()) == kept.tolist()


@settings(max_examples=100, deadline=None)
@given(rewards=reward_batches(), fraction=st.floats(min_value=0.01, max_value=1.0), count=st.integers(0, 15))
def test_top_k_variants_keep_the_highest_spreads(rewards, fraction, count):
    spread = spreads_of(rewards)
    num_groups = rewards.shape[0]
    kept_fraction, _ = select_groups(rewards, "top_k", fraction)
    assert kept_fraction.numel() == min(num_groups, math.ceil(fraction * num_groups - 1e-9))
    assert kept_fraction.numel() >= fraction * num_groups - 1e-9
    assert _is_rank_prefix(kept_fraction, spread)
    kept_count, _ = select_groups(rewards, "top_k_abs", count)
    assert kept_count.numel() == min(num_groups, count)
    assert _is_rank_prefix(kept_count, spread)


@settings(max_examples=100, deadline=None)
@given(rewards=reward_batches(), threshold=st.floats(min_value=0.0, max_value=6.0))
def test_threshold_and_none_rules(rewards, threshold):
    spread = spreads_of(rewards)
    kept, _ = select_groups(rewards, "min_threshold", threshold)
    assert kept.tolist() == (spread >= threshold).nonzero().squeeze(-1).tolist()
    kept_all, metrics = select_groups(rewards, "none")
    assert kept_all.tolist() == list(range(rewards.shape[0]))
    assert metrics["kept_ratio"] == 1


@settings(max_examples=100, deadline=None)
@given(rewards=reward_batches(), strategy=st.sampled_from(["top_p", "top_k"]), value=st.floats(0.05, 1.0))
def test_ties_break_towards_lower_group_index_deterministically(rewards, strategy, value):
    spread = spreads_of(rewards)
    kept, _ = select_groups(rewards, strategy, value)
    assert torch.equal(kept, select_groups(rewards.clone(), strategy, value)[0])
    dropped = sorted(set(range(rewards.shape[0])) - set(kept.tolist()))
    for i in kept.tolist():
        for j in dropped:
            if spread[i] == spread[j] and spread[i] > 0:
                assert i < j


@settings(max_examples=60, deadline=None)
@given(
    rewards=reward_batches(), strategy=st.sampled_from(FILTER_STRATEGIES.names()), stat=st.sampled_from(["std", "var"])
)
def test_metrics_are_finite_float32_scalars(rewards, strategy, stat):
    value = {"top_k_abs": 2.0, "min_threshold": 0.5}.get(strategy, 0.5)
    kept, metrics = select_groups(rewards, strategy, value, stat=stat)
    assert {f"reward_{stat}_mean", f"reward_{stat}_std", f"reward_{stat}_ratio", "kept_count"} <= set(metrics)
    for value_tensor in metrics.values():
        assert value_tensor.shape == () and value_tensor.dtype == torch.float32 and bool(torch.isfinite(value_tensor))
    assert metrics["kept_count"] == kept.numel()
    assert 0 <= metrics["kept_spread_fraction"] <= 1 + 1e-6


@settings(max_examples=60, deadline=None)
@given(rewards=reward_batches())
def test_population_std_matches_numpy(rewards):
    expected = np.std(rewards.double().numpy(), axis=1, ddof=0)
    np.testing.assert_allclose(spreads_of(rewards).numpy(), expected, rtol=1e-9, atol=1e-12)
