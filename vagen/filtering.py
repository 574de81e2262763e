"""SNR-aware group filtering (RAGEN v2): train only on groups whose rewards disagree.

A *group* is the N rollouts of one initial state. Its reward spread RV_g bounds its task gradient
(by Cauchy-Schwarz, ‖(1/N) Σ_i (R_i − R̄) ∇log π_i‖ ≤ std(R) · rms‖∇log π_i‖), while the KL and
entropy gradients do not shrink with RV. Low-RV groups therefore contribute updates dominated by
input-agnostic regularisation, the mechanism behind template collapse; dropping them raises the
signal-to-noise ratio of the update. See docs/spec.md §3.

The filter is modality-agnostic and pure: it sees a `[G, N]` reward matrix (group g in row g) and
returns which whole groups to keep. It never drops or duplicates single samples.

Metric keys (prefix-free; the trainer logs them under `filter/`). The spread statistic is part of
the key, so a log never calls a variance a std:

    kept_count, kept_ratio           groups kept, and kept / G
    zero_spread_count                groups with a valid sample whose spread is exactly 0 (no task gradient)
    invalid_group_count              groups with no valid sample (only non-zero with `valid_mask`)
    reward_{stat}_mean               Mean(RV) over groups with a valid sample, e.g. `reward_std_mean`
    reward_{stat}_std                Std(RV) over the same groups (population std across groups)
    reward_{stat}_ratio              Std(RV) / Mean(RV), 0 when Mean(RV) == 0. High (≈1.2 on Sokoban)
                                     ⇒ bimodal RV, filtering pays; low (≈0.3) ⇒ it drops data at random
    kept_spread_fraction             Σ RV of kept groups / Σ RV, 0 when Σ RV == 0
    chosen_reward_mean/_std          mean / population std of the valid rewards of kept groups (0 if none)

Every metric is a 0-dim float32 tensor on the rewards' device, so the trainer can stack and
average them over an update without caring which is a count.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from vagen.registry import Registry

# Relative slack for top-p: a prefix whose mass falls short of p·ΣRV by less than this fraction of ΣRV
# counts as reaching it. Spreads are computed in float64 from the rewards as given, so the only error
# is float64 rounding: a cumulative sum and p times the total, equal in real arithmetic, can differ
# by ~1e-16 per operation (e.g. three 0.1s vs 0.3 · ten 0.1s). 1e-9 absorbs that for any batch size
# in use while staying far below any spread difference that means something.
TOP_P_RELATIVE_TOLERANCE = 1e-9
# Slack for top-k's ceil(fraction · G): 0.7 · 10 is 7.000000000000001 in floating point, not 7.
_TOP_K_ROUNDING_SLACK = 1e-9

SpreadStat = Callable[[Tensor, Tensor], Tensor]
FilterStrategy = Callable[[Tensor, Tensor, float], Tensor]

SPREAD_STATS: Registry[SpreadStat] = Registry("spread statistic")
"""`stat(rewards [G, N] float64, valid [G, N] bool) -> spread [G] float64`, 0 for groups without valid samples."""

FILTER_STRATEGIES: Registry[FilterStrategy] = Registry("filter strategy")
"""`strategy(spread [G] float64 >= 0, eligible [G] bool, value) -> keep [G] bool`; never keeps an ineligible group."""

EMPTY_POLICIES = ("skip", "reroll", "keep_all")


# ----------------------------------------------------------------------------- spread statistics


@SPREAD_STATS.register("var")
def population_variance(rewards: Tensor, valid: Tensor) -> Tensor:
    """Population variance (divide by the number of valid samples n_g) of each group's valid rewards.

    Population, not sample (n_g − 1), because the bound above is over the N rollouts actually in the
    update, and because it is defined (= 0) for a group with a single valid sample instead of NaN.
    """
    counts = valid.sum(dim=-1).clamp(min=1).to(rewards.dtype)  # (G,)
    masked = torch.where(valid, rewards, torch.zeros_like(rewards))  # invalid slots may hold NaN
    mean = masked.sum(dim=-1) / counts  # (G,)
    deviation = torch.where(valid, rewards - mean[:, None], torch.zeros_like(rewards))  # (G, N)
    return deviation.square().sum(dim=-1) / counts


@SPREAD_STATS.register("std")
def population_std(rewards: Tensor, valid: Tensor) -> Tensor:
    """Population standard deviation: sqrt of `population_variance` (same units as the reward)."""
    return population_variance(rewards, valid).sqrt()


# ----------------------------------------------------------------------------- strategies


def rank_groups(spread: Tensor, eligible: Tensor) -> Tensor:
    """Group indices `[G]` long, by spread descending, ties by group index ascending, ineligible last.

    Deterministic: a stable sort keeps equal spreads in index order. Spreads are >= 0, so a key of −1
    puts ineligible groups behind every eligible one.
    """
    key = torch.where(eligible, spread, torch.full_like(spread, -1.0))
    return torch.sort(key, descending=True, stable=True).indices


def _keep_sorted_prefix(order: Tensor, eligible: Tensor, prefix_length: Tensor | int) -> Tensor:
    """Keep mask `[G]` bool for the first `prefix_length` groups of `order` that are eligible."""
    positions = torch.arange(order.numel(), device=order.device)
    keep_sorted = (positions < prefix_length) & eligible[order]
    keep = torch.zeros_like(eligible)
    keep[order] = keep_sorted
    return keep


@FILTER_STRATEGIES.register("top_p")
def top_p_groups(spread: Tensor, eligible: Tensor, value: float) -> Tensor:
    """Nucleus over groups: the smallest high-spread prefix holding a fraction p = `value` of ΣRV.

    Rule. Rank groups by `rank_groups`; let c_k be the spread summed over the first k ranked groups
    and S = c_G the total (summed in the same order, so the last prefix reaches S exactly). Keep the
    first k* groups, k* = min{k >= 1 : c_k >= p·S − tol·S} with tol = `TOP_P_RELATIVE_TOLERANCE`,
    then drop any zero-spread group from them. Consequences: zero-spread groups are never kept (they
    carry no task gradient; the prefix reaches S before them); S == 0 keeps nothing; p == 1 keeps
    the groups with positive spread, except those below tol·S together (noise-level spreads).
    `value` must lie in (0, 1].
    """
    if not 0.0 < value <= 1.0:
        raise ValueError(f"top_p needs value in (0, 1] (fraction of total reward spread), got {value}; e.g. 0.9.")
    mass = torch.where(eligible, spread, torch.zeros_like(spread))
    order = rank_groups(mass, eligible)
    sorted_mass = mass[order]  # (G,)
    cumulative = sorted_mass.cumsum(dim=0)
    total = cumulative[-1]
    target = (value - TOP_P_RELATIVE_TOLERANCE) * total
    needed = (cumulative < target).sum() + 1  # prefixes short of the target, plus the one that reaches it
    return _keep_sorted_prefix(order, eligible & (mass > 0), needed)


@FILTER_STRATEGIES.register("top_k")
def top_k_fraction_groups(spread: Tensor, eligible: Tensor, value: float) -> Tensor:
    """The k = ceil(value · G) highest-spread groups, `value` in (0, 1] a fraction of all G groups.

    Rounded *up* so at least the asked fraction is kept (0.3 of 8 groups keeps 3, never 2); float
    noise such as 0.7 · 10 = 7.000000000000001 is absorbed. Unlike top_p, top_k always fills its
    quota and may keep zero-spread groups; it never keeps a group without valid samples.
    """
    if not 0.0 < value <= 1.0:
        raise ValueError(f"top_k needs value in (0, 1] (fraction of groups), got {value}; use top_k_abs for a count.")
    num_groups = spread.numel()
    k = math.ceil(value * num_groups - _TOP_K_ROUNDING_SLACK)
    return _keep_sorted_prefix(rank_groups(spread, eligible), eligible, k)


@FILTER_STRATEGIES.register("top_k_abs")
def top_k_count_groups(spread: Tensor, eligible: Tensor, value: float) -> Tensor:
    """The `value` highest-spread groups (a whole number >= 0; all groups if it exceeds G)."""
    if not (math.isfinite(value) and value >= 0 and value == int(value)):
        raise ValueError(f"top_k_abs needs a whole number of groups >= 0, got {value}; use top_k for a fraction.")
    return _keep_sorted_prefix(rank_groups(spread, eligible), eligible, int(value))


@FILTER_STRATEGIES.register("min_threshold")
def min_threshold_groups(spread: Tensor, eligible: Tensor, value: float) -> Tensor:
    """Every group whose spread is >= `value` (exact float64 comparison; `value` >= 0, 0 keeps all)."""
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"min_threshold needs a finite spread threshold >= 0, got {value}.")
    return eligible & (spread >= value)


@FILTER_STRATEGIES.register("none")
def keep_all_groups(spread: Tensor, eligible: Tensor, value: float) -> Tensor:
    """Every group that has at least one valid sample; `value` is ignored."""
    return eligible.clone()


# ----------------------------------------------------------------------------- public entry points


def _validated_inputs(rewards: Tensor, valid_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Float64 rewards `[G, N]` and a bool valid mask `[G, N]`, after checking the user's inputs."""
    if not isinstance(rewards, Tensor) or rewards.dim() != 2 or not rewards.is_floating_point():
        got = f"{tuple(rewards.shape)} {rewards.dtype}" if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a float tensor of shape [groups, samples_per_group], got {got}.")
    if rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(f"rewards has shape {tuple(rewards.shape)}; filtering needs at least one group and sample.")
    if valid_mask is None:
        valid_mask = torch.ones_like(rewards, dtype=torch.bool)
    elif valid_mask.shape != rewards.shape or valid_mask.dtype != torch.bool:
        raise ValueError(
            f"valid_mask must be a bool tensor shaped like rewards {tuple(rewards.shape)}, got "
            f"{tuple(valid_mask.shape)} {valid_mask.dtype}; build it with `mask.bool()`."
        )
    rewards = rewards.to(torch.float64)
    if not torch.isfinite(rewards[valid_mask]).all():
        raise ValueError("rewards contain NaN or inf at valid positions; fix the reward function or mask them out.")
    return rewards, valid_mask


def _population_mean_std(values: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Weighted (0/1) population mean and std of a 1-D tensor; both 0 when no weight is set."""
    count = weights.sum().clamp(min=1)
    mean = (values * weights).sum() / count
    std = (((values - mean) * weights).square().sum() / count).sqrt()
    return mean, std


def _filter_metrics(
    rewards: Tensor, valid: Tensor, spread: Tensor, eligible: Tensor, keep: Tensor, stat: str
) -> dict[str, Tensor]:
    """The metric dict documented in the module docstring (all float64 here, cast by the caller)."""
    num_groups = spread.numel()
    eligible_w = eligible.to(spread.dtype)
    spread_mean, spread_std = _population_mean_std(spread, eligible_w)
    total_spread = (spread * eligible_w).sum()
    kept_spread = (spread * keep.to(spread.dtype)).sum()
    chosen = (valid & keep[:, None]).flatten()
    chosen_mean, chosen_std = _population_mean_std(rewards.flatten(), chosen.to(spread.dtype))
    zero = torch.zeros((), dtype=spread.dtype, device=spread.device)
    return {
        "kept_count": keep.sum().to(spread.dtype),
        "kept_ratio": keep.sum().to(spread.dtype) / num_groups,
        "zero_spread_count": (eligible & (spread == 0)).sum().to(spread.dtype),
        "invalid_group_count": (~eligible).sum().to(spread.dtype),
        f"reward_{stat}_mean": spread_mean,
        f"reward_{stat}_std": spread_std,
        f"reward_{stat}_ratio": torch.where(spread_mean > 0, spread_std / spread_mean.clamp(min=1e-300), zero),
        "kept_spread_fraction": torch.where(total_spread > 0, kept_spread / total_spread.clamp(min=1e-300), zero),
        "chosen_reward_mean": chosen_mean,
        "chosen_reward_std": chosen_std,
    }


def select_groups(
    rewards: Tensor,
    strategy: str = "top_p",
    value: float = 0.9,
    stat: str = "std",
    valid_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Choose which whole groups enter the update, by their within-group reward spread.

    Args:
        rewards: `[G, N]` float, row g = the N rollout returns of group g (one initial state).
        strategy: a name in `FILTER_STRATEGIES`: "top_p" (default), "top_k", "top_k_abs",
            "min_threshold", "none". See each function's docstring for its exact rule.
        value: the strategy's knob: p, fraction of groups, count, spread threshold, or ignored.
        stat: spread statistic RV, a name in `SPREAD_STATS`: "std" (default, population) or "var".
        valid_mask: optional `[G, N]` bool, False for padding slots of groups with fewer than N
            samples. Statistics use valid slots only; a group with no valid slot is never kept.

    Returns:
        kept_indices: `[K]` long, ascending group indices (K may be 0: see `apply_empty_policy`).
        metrics: dict of 0-dim float32 tensors, keys in the module docstring.
    """
    rewards64, valid = _validated_inputs(rewards, valid_mask)
    spread = SPREAD_STATS.get(stat)(rewards64, valid)  # (G,)
    eligible = valid.any(dim=-1)  # (G,)
    keep = FILTER_STRATEGIES.get(strategy)(spread, eligible, value)
    assert keep.dtype == torch.bool and not (keep & ~eligible).any(), "a strategy kept a group with no valid sample"
    metrics = _filter_metrics(rewards64, valid, spread, eligible, keep, stat)
    kept_indices = keep.nonzero().squeeze(-1)  # ascending by construction of nonzero
    return kept_indices, {name: metric.to(torch.float32) for name, metric in metrics.items()}


def apply_empty_policy(kept_indices: Tensor, num_groups: int, policy: str) -> Tensor:
    """What to train on when the filter kept no group; a non-empty selection passes through unchanged.

    "keep_all" returns every group index (train on the unfiltered batch). "skip" and "reroll" return
    the empty selection: the trainer then skips the update or samples a new batch, and must log it.
    This helper only validates the policy name and does the one tensor-level case, so the trainer's
    branching stays about actions, not indices.
    """
    if policy not in EMPTY_POLICIES:
        raise ValueError(f"Unknown empty-batch policy {policy!r}; valid: {list(EMPTY_POLICIES)}.")
    if kept_indices.numel() > 0 or policy != "keep_all":
        return kept_indices
    return torch.arange(num_groups, dtype=torch.long, device=kept_indices.device)
