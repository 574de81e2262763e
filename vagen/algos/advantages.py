"""Advantage estimators for StarPO (docs/spec.md §2), as pure tensor functions behind one registry.

Every estimator has the same signature, so the trainer picks one by name and never special-cases it:

    advantages, returns = ADVANTAGE_ESTIMATORS.get(name)(inputs, params)

`inputs` holds tensors only (`AdvantageInputs`); `params` holds plain floats (`AdvantageParams`).
Shapes: B trajectories, T token positions of the concatenated multi-turn dialogue. The response
mask is 1 exactly on sampled tokens; observation, template and padding tokens (mask 0) never get an
advantage and never break a recursion: the recursions skip them, so the last token of turn k is
followed directly by the first token of turn k+1.

Rewards are per token: put each turn's reward (and any format penalty) on a sampled token of that
turn, usually its last one. Rewards placed on mask-0 positions are ignored by every estimator.
All outputs are float32 and exactly 0 on mask-0 positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vagen.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageInputs",
    "AdvantageParams",
    "anchor_group_stats",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "turn_end_mask",
    "turn_ids_from_mask",
]


@dataclass(frozen=True)
class AdvantageInputs:
    """The tensors an estimator may read; each estimator says which ones it needs.

    token_rewards: [B, T] float. Rewards at token positions (turn rewards on their turn's tokens).
    response_mask: [B, T] bool/int/float. 1 on sampled (policy-generated) tokens, 0 elsewhere.
    values: [B, T] float or None. Critic values V(s_t) at each token; required by `gae`, `bilevel_gae`.
    group_index: [B] long or None. Trajectories with the same id share an initial state (a GRPO group);
        any integer ids, not necessarily contiguous. Required by `grpo`, `drgrpo`, `rloo`.
    turn_ids: [B, T] long or None. Turn number of each sampled token (0, 1, ... in order; ignored where
        the mask is 0). None: each maximal run of sampled tokens is one turn, which is right whenever
        turns are separated by at least one observation/template token.
    turn_states: [B, T] long or None. Anchor-state id of each sampled token's turn: turns with equal ids in one
        group started from the same environment state (any turn index); -1 = no state key. Read by `gigpo`.
    """

    token_rewards: torch.Tensor
    response_mask: torch.Tensor
    values: torch.Tensor | None = None
    group_index: torch.Tensor | None = None
    turn_ids: torch.Tensor | None = None
    turn_states: torch.Tensor | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.token_rewards.shape)
        if len(shape) != 2:
            raise ValueError(f"token_rewards must be [B, T], got shape {shape}; add a batch dimension.")
        for name in ("response_mask", "values", "turn_ids", "turn_states"):
            tensor = getattr(self, name)
            if tensor is not None and tuple(tensor.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(tensor.shape)} but token_rewards has {shape}; align them.")
        if self.group_index is not None and tuple(self.group_index.shape) != shape[:1]:
            raise ValueError(f"group_index must be [B]={shape[:1]}, got {tuple(self.group_index.shape)}.")


@dataclass(frozen=True)
class AdvantageParams:
    """Scalar knobs shared by the estimators (each reads only its own).

    gamma, lam: token-level discount and GAE λ (`gae`, and inside each turn for `bilevel_gae`).
    gamma_turn, lam_turn: turn-level discount and λ of `bilevel_gae`.
    eps: added to the group std in `grpo` so a zero-variance group gives advantage 0, not NaN.
    unbiased_std: `grpo` divides by the Bessel-corrected (N-1) group std, as torch.std and the
        published GRPO implementations do, so advantages match runs reported with them.
    step_weight: ω of `gigpo`, the weight of the step-level advantage added to the episode-level one.
    normalize_std: `gigpo` divides both levels by their group's std ("mean_std_norm"); False: "mean_norm".
    """

    gamma: float = 1.0
    lam: float = 1.0
    gamma_turn: float = 0.95
    lam_turn: float = 1.0
    eps: float = 1e-6
    unbiased_std: bool = True
    step_weight: float = 1.0
    normalize_std: bool = True

    def __post_init__(self) -> None:
        for name in ("gamma", "lam", "gamma_turn", "lam_turn"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} is outside [0, 1]; discounts and GAE lambdas must lie in [0, 1].")
        if self.eps < 0:
            raise ValueError(f"eps={self.eps} must be >= 0 (it guards the division by the group std).")


Estimator = Callable[[AdvantageInputs, AdvantageParams], tuple[torch.Tensor, torch.Tensor]]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


# ---------------------------------------------------------------------------------------------
# Masked statistics (shared with losses.py)
# ---------------------------------------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over positions where mask is 1. x, mask: same shape. An empty mask gives 0, not NaN."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Population variance (divide by the count) of x over masked positions; scalar tensor."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise x to zero mean and unit variance over masked positions (PPO advantage whitening).

    x: [B, T] float; mask: [B, T]. Returns [B, T] float, 0 where mask is 0. Uses the population
    variance, so the whitened masked entries have exactly mean 0 and variance 1 (up to eps).
    shift_mean=False only rescales, keeping the sign of every advantage.
    """
    x = x.float()
    mask_f = mask.to(x.dtype)
    scale = torch.rsqrt(masked_var(x, mask_f) + eps)
    centred = x - masked_mean(x, mask_f) if shift_mean else x
    return centred * scale * mask_f


# ---------------------------------------------------------------------------------------------
# Turn structure
# ---------------------------------------------------------------------------------------------


def turn_ids_from_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """Number each maximal run of sampled tokens: [B, T] mask -> [B, T] long, turn k = k, -1 off the mask."""
    sampled = response_mask.bool()
    previous = torch.zeros_like(sampled)
    previous[:, 1:] = sampled[:, :-1]
    turn_starts = sampled & ~previous
    ids = torch.cumsum(turn_starts.long(), dim=1) - 1
    return torch.where(sampled, ids, torch.full_like(ids, -1))


def _turn_buckets(turn_ids: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """Turn id per token, with every mask-0 token sent to the spare bucket T (a turn never reaches it)."""
    spare = torch.full_like(turn_ids, turn_ids.shape[1])
    return torch.where(sampled, turn_ids.long(), spare)


def turn_end_mask(turn_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: True on the last sampled token of each turn. turn_ids: [B, T] long (see AdvantageInputs)."""
    sampled = response_mask.bool()
    batch, length = turn_ids.shape
    buckets = _turn_buckets(turn_ids, sampled)
    positions = torch.arange(length, device=turn_ids.device).expand(batch, length)
    # At most T turns fit in T tokens, so T+1 buckets need no data-dependent size (no host sync).
    last_position = torch.full((batch, length + 1), -1, dtype=torch.long, device=turn_ids.device)
    last_position = last_position.scatter_reduce(1, buckets, positions, reduce="amax", include_self=True)
    return sampled & (positions == last_position.gather(1, buckets))


def _sum_per_turn(token_values: torch.Tensor, turn_ids: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B, T]: each sampled token gets the sum of token_values over its turn's sampled tokens."""
    buckets = _turn_buckets(turn_ids, sampled)
    totals = torch.zeros(token_values.shape[0], token_values.shape[1] + 1, device=token_values.device)
    totals = totals.scatter_add(1, buckets, token_values * sampled)
    return totals.gather(1, buckets) * sampled


# ---------------------------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------------------------


def _masked_gae_scan(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    episode_end: torch.Tensor | None = None,
) -> torch.Tensor:
    """GAE over the masked positions of each row, skipping mask-0 positions; returns advantages [B, T].

    For consecutive masked positions t < t' (nothing masked in between):
        δ_t = r_t + γ V_t' − V_t,   A_t = δ_t + γλ A_t'
    and after the last masked position (or a masked position where episode_end is True) V and A are 0.
    rewards, values: [B, T] float32; mask, episode_end: [B, T] bool.
    """
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        if episode_end is not None:
            # Nothing after an episode end is bootstrapped into it.
            continues = (~episode_end[:, t]).to(rewards.dtype)
            next_value, next_advantage = next_value * continues, next_advantage * continues
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        sampled = mask[:, t]
        advantages[:, t] = torch.where(sampled, advantage, torch.zeros_like(advantage))
        next_value = torch.where(sampled, values[:, t], next_value)
        next_advantage = torch.where(sampled, advantage, next_advantage)
    return advantages


def _require(tensor: torch.Tensor | None, field: str, estimator: str, why: str) -> torch.Tensor:
    if tensor is None:
        raise ValueError(f"Advantage estimator {estimator!r} needs AdvantageInputs.{field} ({why}); pass it.")
    return tensor


@ADVANTAGE_ESTIMATORS.register("gae")
def gae(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE(γ=params.gamma, λ=params.lam) over sampled tokens, one episode per row.

    Over the sampled positions t_0 < t_1 < ... < t_n of a row (mask-0 positions are skipped, so the
    last token of a turn bootstraps from the first token of the next turn):
        δ_i = r_{t_i} + γ V_{t_{i+1}} − V_{t_i}  (V_{t_{n+1}} = 0),   A_{t_i} = δ_i + γλ A_{t_{i+1}}.
    Returns (advantages, returns = advantages + values), both [B, T] float32, 0 off the mask.
    With γ = λ = 1: A_t = (sum of rewards at sampled positions ≥ t) − V_t.
    """
    values = _require(inputs.values, "values", "gae", "critic values per token").float()
    sampled = inputs.response_mask.bool()
    rewards = inputs.token_rewards.float()
    advantages = _masked_gae_scan(rewards, values, sampled, params.gamma, params.lam)
    returns = (advantages + values) * sampled
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("bilevel_gae")
def bilevel_gae(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-level GAE (VAGEN): turn-level GAE across turns, then token-level GAE inside each turn.

    Per row, turn k has sampled positions s_k..e_k (e_k = its last sampled token), turn reward
    R_k = sum of the rewards on its sampled tokens, and turn value W_k = V_{e_k}.
    1. Turn level (γ_T = gamma_turn, λ_T = lam_turn), over turns k = 0..K-1:
           δ_k = R_k + γ_T W_{k+1} − W_k  (W_K = 0),   A^turn_k = δ_k + γ_T λ_T A^turn_{k+1},
           G_k = A^turn_k + W_k   (the turn's return estimate).
    2. Token level (γ = gamma, λ = lam) inside turn k only: the turn is its own episode whose single
       reward G_k sits on its last token, so token GAE over s_k..e_k with nothing bootstrapped past e_k:
           δ_t = [t = e_k] G_k + γ V_{t'} − V_t  (t' the next sampled token of the turn, V_{t'} = 0 at e_k),
           A_t = δ_t + γλ A_{t'}.
    Returns (advantages, returns = advantages + values), [B, T] float32, 0 off the mask.
    Closed form with γ = λ = λ_T = 1: G_k = Σ_{j≥k} γ_T^{j−k} R_j and A_t = G_k − V_t for t in turn k.
    """
    values = _require(inputs.values, "values", "bilevel_gae", "critic values per token").float()
    sampled = inputs.response_mask.bool()
    rewards = inputs.token_rewards.float()
    turn_ids = inputs.turn_ids if inputs.turn_ids is not None else turn_ids_from_mask(sampled)
    turn_end = turn_end_mask(turn_ids, sampled)
    turn_rewards = _sum_per_turn(rewards, turn_ids, sampled) * turn_end
    # Turn-level GAE is the masked token scan restricted to end-of-turn positions.
    turn_advantages = _masked_gae_scan(turn_rewards, values, turn_end, params.gamma_turn, params.lam_turn)
    turn_returns = (turn_advantages + values) * turn_end
    advantages = _masked_gae_scan(turn_returns, values, sampled, params.gamma, params.lam, episode_end=turn_end)
    returns = (advantages + values) * sampled
    return advantages, returns


def _trajectory_returns(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """R_i = sum of rewards on sampled tokens of row i, [B] float32; and the mask as float [B, T]."""
    mask = inputs.response_mask.bool().float()
    return (inputs.token_rewards.float() * mask).sum(dim=1), mask


def _per_group_total(x: torch.Tensor, group_of_row: torch.Tensor) -> torch.Tensor:
    """[B] -> [B]: each row gets the sum of x over the rows of its group (group_of_row: [B] in 0..B-1)."""
    # B buckets bound the number of groups, so no data-dependent size (no host sync).
    totals = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device).index_add(0, group_of_row, x)
    return totals[group_of_row]


def _group_stats(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (group sum, group size, group sum of squared deviations from the group mean), each [B]."""
    _, group_of_row = torch.unique(group_index, return_inverse=True)
    sums = _per_group_total(scores, group_of_row)
    counts = _per_group_total(torch.ones_like(scores), group_of_row)
    # Deviations from the mean, not E[x²]−E[x]², which cancels catastrophically for large rewards.
    squared_deviations = _per_group_total((scores - sums / counts) ** 2, group_of_row)
    return sums, counts, squared_deviations


def _group_index(inputs: AdvantageInputs, estimator: str) -> torch.Tensor:
    return _require(inputs.group_index, "group_index", estimator, "which rollouts share an initial state")


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: A_i = (R_i − mean_g R) / (std_g R + eps), on every sampled token of trajectory i.

    g is i's group (same group_index). std is Bessel-corrected (N−1) when params.unbiased_std, else the
    population std; a one-member group has std 0 and so advantage 0. No critic: returns = advantages.
    Shapes: [B, T] float32 both, 0 off the mask.
    """
    scores, mask = _trajectory_returns(inputs)
    sums, counts, squared_deviations = _group_stats(scores, _group_index(inputs, "grpo"))
    dof = counts - 1.0 if params.unbiased_std else counts
    std = torch.sqrt(squared_deviations / dof.clamp(min=1.0))
    advantages = ((scores - sums / counts) / (std + params.eps))[:, None] * mask
    return advantages, advantages.clone()


@ADVANTAGE_ESTIMATORS.register("grpo_turn")
def grpo_turn(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GRPO: each turn is credited with the return from that turn on, against its group at that turn.

    Turn k of row i has reward R_ik (sum over its sampled tokens) and return-to-go
        G_ik = Σ_{j≥k} γ_T^{j−k} R_ij      (γ_T = params.gamma_turn),
    and every token of the turn gets A_ik = (G_ik − mean_g G_·k) / (std_g G_·k + eps), the statistics taken over
    the members of i's group that played a turn k (Bessel-corrected std when params.unbiased_std). Why: with
    trajectory-level GRPO a failed episode's good first moves are pushed down with its bad last one; here a
    turn answers only for what followed it (reward-to-go), and a baseline that depends on the turn index
    only keeps the estimate unbiased. With dense turn rewards (e.g. Sokoban's `distance_shaping`) this is
    per-move credit without a critic. A one-turn episode gets exactly `grpo`'s advantage.
    Returns (advantages, returns = advantages), [B, T] float32, 0 off the mask.
    """
    to_go, played, buckets = _turn_returns_to_go(inputs, params.gamma_turn)
    batch, slots = to_go.shape
    _, group_of_row = torch.unique(_group_index(inputs, "grpo_turn"), return_inverse=True)
    # One bucket per (group, turn): B groups at most, so no data-dependent size.
    slot = group_of_row[:, None] * slots + torch.arange(slots, device=to_go.device)
    turn_advantages = _normalise_within(to_go, played, slot, batch * slots, params, params.eps)
    sampled = inputs.response_mask.bool()
    advantages = turn_advantages.gather(1, buckets) * sampled
    return advantages, advantages.clone()


def _turn_returns_to_go(inputs: AdvantageInputs, gamma_turn: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per turn slot k of each row (K = T + 1 slots; the last is the spare bucket of mask-0 tokens):
    G_k = Σ_{j≥k} γ_T^{j−k} R_j with R_j the sum of turn j's token rewards. Returns (G [B, K] float32,
    played [B, K] bool: the row has a turn k, buckets [B, T]: each token's slot)."""
    sampled = inputs.response_mask.bool()
    rewards = inputs.token_rewards.float() * sampled
    batch, length = rewards.shape
    turn_ids = inputs.turn_ids if inputs.turn_ids is not None else turn_ids_from_mask(sampled)
    buckets = _turn_buckets(turn_ids, sampled)  # (B, T) turn of each token; mask-0 tokens in spare bucket T
    turn_rewards = torch.zeros(batch, length + 1, device=rewards.device).scatter_add(1, buckets, rewards)
    played = torch.zeros(batch, length + 1, device=rewards.device).scatter_add(1, buckets, sampled.float()) > 0
    played[:, length] = False  # the spare bucket is no turn
    to_go = torch.zeros_like(turn_rewards)  # (B, K)
    running = torch.zeros(batch, device=rewards.device)
    for k in reversed(range(length + 1)):
        running = turn_rewards[:, k] + gamma_turn * running
        to_go[:, k] = running
    return to_go, played, buckets


def _normalise_within(
    x: torch.Tensor, member: torch.Tensor, slot: torch.Tensor, slots: int, params: AdvantageParams, eps: float | None
) -> torch.Tensor:
    """(x − mean_s x) / (std_s x + eps) over the members of each slot s; eps None: x − mean_s x (no std division).

    x: float, member: bool and slot: long in 0..slots−1, all of one shape. Non-members give 0 and do not count;
    so does every member of a slot of one (nothing to compare with). std is Bessel-corrected when
    params.unbiased_std. Returns x's shape, float32."""
    flat_slot, weight = slot.reshape(-1), member.reshape(-1).float()
    values = x.reshape(-1).float() * weight

    def per_slot(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(slots, device=v.device).index_add(0, flat_slot, v)[flat_slot]

    counts = per_slot(weight)
    mean = per_slot(values) / counts.clamp(min=1.0)
    centred = (values - mean) * weight * (counts > 1)
    if eps is not None:
        dof = counts - 1.0 if params.unbiased_std else counts
        std = torch.sqrt(per_slot(centred**2) / dof.clamp(min=1.0))
        centred = centred / (std + eps)
    return centred.reshape(x.shape)


@ADVANTAGE_ESTIMATORS.register("gigpo")
def gigpo(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO (Feng et al. 2025, arXiv:2505.10978): episode-level plus step-level group-relative credit.

    Episode level, over the rows of a group g (same initial state): A^E_i = (R_i − mean_g R) / F_g.
    Step level: turn k of row i started from anchor state s = turn_states (equal ids: same group, same environment
    state, at any turn index). Its discounted return-to-go G_ik = Σ_{j≥k} γ_T^{j−k} R_ij (γ_T = params.gamma_turn)
    is compared with the other turns that started from s: A^S_ik = (G_ik − mean_{U_s} G) / F_s. An anchor group
    of one (a state no other turn visited), or a turn without a state key (id −1), gets A^S = 0.
    Every token of turn k gets A^E_i + ω·A^S_ik (ω = params.step_weight). F = std + eps when params.normalize_std
    (Bessel-corrected std when params.unbiased_std), else 1. Without turn_states this is GRPO's episode level only.
    Returns (advantages, returns = advantages), [B, T] float32, 0 off the mask.
    """
    sampled = inputs.response_mask.bool()
    eps = params.eps if params.normalize_std else None
    scores, mask = _trajectory_returns(inputs)
    _, group_of_row = torch.unique(_group_index(inputs, "gigpo"), return_inverse=True)
    episode = _normalise_within(scores, torch.ones_like(sampled[:, 0]), group_of_row, len(scores), params, eps)
    advantages = episode[:, None] * mask
    if inputs.turn_states is None:
        return advantages, advantages.clone()
    to_go, played, buckets = _turn_returns_to_go(inputs, params.gamma_turn)
    batch, slots = to_go.shape
    # Each turn's anchor id from its tokens (all tokens of a turn carry the same id); -1: no key.
    states = torch.full((batch, slots), -1, dtype=torch.long, device=to_go.device)
    states = states.scatter_reduce(1, buckets, torch.where(sampled, inputs.turn_states.long(), -1), reduce="amax")
    keyed = played & (states >= 0)
    _, anchor = torch.unique(torch.where(keyed, states, -1), return_inverse=True)  # dense ids, B·K slots at most
    step = _normalise_within(to_go, keyed, anchor, batch * slots, params, eps)
    advantages = advantages + params.step_weight * step.gather(1, buckets) * sampled
    return advantages, advantages.clone()


def anchor_group_stats(turn_states: torch.Tensor, turn_ids: torch.Tensor, response_mask: torch.Tensor) -> dict:
    """How much step-level credit a batch offers: `step_group_share`, the fraction of turns whose anchor state
    another turn also started from (their step advantage can be non-zero), and `step_group_size`, the mean
    number of turns per anchor state among the states that have a key. Tensors in (see `AdvantageInputs`),
    0-d float tensors out; turns without a key count as turns that found no group."""
    sampled = response_mask.bool()
    buckets = _turn_buckets(turn_ids, sampled)
    batch, length = turn_ids.shape
    states = torch.full((batch, length + 1), -1, dtype=torch.long, device=turn_ids.device)
    states = states.scatter_reduce(1, buckets, torch.where(sampled, turn_states.long(), -1), reduce="amax")
    played = torch.zeros(batch, length + 1, device=turn_ids.device).scatter_add(1, buckets, sampled.float()) > 0
    played[:, length] = False
    turns = states[played]
    keyed = turns[turns >= 0]
    if len(keyed) == 0:
        zero = torch.zeros(())
        return {"step_group_share": zero, "step_group_size": zero}
    _, inverse, counts = torch.unique(keyed, return_inverse=True, return_counts=True)
    shared = (counts[inverse] > 1).float().sum()
    return {
        "step_group_share": shared / max(len(turns), 1),
        "step_group_size": counts.float().mean(),
    }


@ADVANTAGE_ESTIMATORS.register("drgrpo")
def drgrpo(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO: A_i = R_i − mean_g R (no std division, which biases toward easy/hard groups).

    Pair it with a length-independent loss aggregation (seq-mean-token-sum-norm). returns = advantages.
    """
    scores, mask = _trajectory_returns(inputs)
    sums, counts, _ = _group_stats(scores, _group_index(inputs, "drgrpo"))
    advantages = (scores - sums / counts)[:, None] * mask
    return advantages, advantages.clone()


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: A_i = R_i − mean_{j≠i, j∈g} R_j, the leave-one-out baseline (unbiased: it excludes R_i).

    A one-member group has no other member to compare with: its advantage is 0. returns = advantages.
    """
    scores, mask = _trajectory_returns(inputs)
    sums, counts, _ = _group_stats(scores, _group_index(inputs, "rloo"))
    others = (counts - 1.0).clamp(min=1.0)
    leave_one_out_mean = (sums - scores) / others
    advantages = torch.where(counts > 1, scores - leave_one_out_mean, torch.zeros_like(scores))
    advantages = advantages[:, None] * mask
    return advantages, advantages.clone()
