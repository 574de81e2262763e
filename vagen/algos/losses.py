"""Losses for StarPO (docs/spec.md §2): clipped policy loss, value loss, KL penalty, entropy, loss aggregation.

Pure tensor functions. Every per-token quantity is reduced by `aggregate_loss(loss_mat, mask, mode)`,
never by a bare `.mean()`, so padding and observation tokens never count. Metrics come back as a dict
of detached scalar tensors with plain names ("clipfrac", "approx_kl", ...); the trainer namespaces them.
Shapes: B sequences, T token positions, V vocabulary; mask is [B, T], 1 on sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vagen.algos.advantages import masked_mean, masked_var
from vagen.registry import Registry

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "aggregate_loss",
    "aggregation_share",
    "entropy_from_logits",
    "explained_variance",
    "kl_penalty",
    "policy_loss",
    "value_loss",
]

# exp() of a log-ratio beyond this overflows float32 long before it is meaningful; clamp first.
_MAX_LOG_RATIO = 20.0

Aggregation = Callable[[torch.Tensor, torch.Tensor, "float | None"], torch.Tensor]
LOSS_AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation mode")


# ---------------------------------------------------------------------------------------------
# Aggregation: [B, T] per-token loss + mask -> scalar
# ---------------------------------------------------------------------------------------------


def _sequence_mean(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of a [B] tensor over the sequences that have at least one sampled token."""
    non_empty = (mask.sum(dim=1) > 0).to(per_sequence.dtype)
    return (per_sequence * non_empty).sum() / non_empty.sum().clamp(min=1.0)


@LOSS_AGGREGATIONS.register("token-mean")
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: float | None) -> torch.Tensor:
    """Σ_{b,t} m·ℓ / Σ_{b,t} m: every sampled token weighs the same (DAPO); long answers weigh more."""
    return masked_mean(loss_mat, mask)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: float | None) -> torch.Tensor:
    """mean_b (Σ_t m·ℓ / Σ_t m): every sequence weighs the same (original GRPO); biased toward short answers."""
    return _sequence_mean(masked_mean(loss_mat, mask, dim=1), mask)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: float | None) -> torch.Tensor:
    """mean_b Σ_t m·ℓ: the sum over a sequence's tokens, averaged over sequences; scales with length."""
    return _sequence_mean((loss_mat * mask).sum(dim=1), mask)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: float | None) -> torch.Tensor:
    """mean_b (Σ_t m·ℓ) / L with a constant L (Dr.GRPO): no length bias, and the scale never depends on the batch.

    L = norm_length if given (e.g. the configured max response length), else T = loss_mat.shape[1]; pass
    norm_length when T varies between batches (dynamic padding), or the loss scale changes with padding.
    """
    length = float(loss_mat.shape[1]) if norm_length is None else float(norm_length)
    return _seq_mean_token_sum(loss_mat, mask, None) / length


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", norm_length: float | None = None
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar with the named mode (see LOSS_AGGREGATIONS.names()).

    mask: [B, T] (bool or 0/1). Masked-out tokens contribute nothing; sequence means run over sequences
    with at least one sampled token; an all-zero mask gives 0 (and zero gradient), never NaN.
    norm_length: the constant L of "seq-mean-token-sum-norm" (ignored by the other modes).
    """
    if norm_length is not None and norm_length <= 0:
        raise ValueError(f"norm_length={norm_length} must be > 0 (it divides the loss); pass e.g. max response length.")
    mask = mask.to(loss_mat.dtype)
    return LOSS_AGGREGATIONS.get(mode)(loss_mat, mask, norm_length)


def aggregation_share(part_mask: torch.Tensor, whole_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The weight w of a micro-batch under gradient accumulation: Σ_parts w·aggregate(part) = aggregate(whole).

    part_mask: [b, T] rows of whole_mask [B, T]. token-mean divides by the whole's sampled tokens, so a
    part weighs its share of tokens; the seq-mean modes divide by the whole's non-empty sequences, so a
    part weighs its share of those (a share of rows would over-weight the tokens of short micro-batches).
    Scalar tensor.
    """
    LOSS_AGGREGATIONS.get(mode)  # an unknown mode raises, listing the valid ones
    if mode == "token-mean":
        return part_mask.float().sum() / whole_mask.float().sum().clamp(min=1.0)
    non_empty = lambda mask: (mask.float().sum(dim=1) > 0).float().sum()
    return non_empty(part_mask) / non_empty(whole_mask).clamp(min=1.0)


# ---------------------------------------------------------------------------------------------
# Policy loss
# ---------------------------------------------------------------------------------------------


def _check_clip_range(clip_low: float, clip_high: float, dual_clip_c: float | None) -> None:
    if not 0.0 < clip_low < 1.0:
        raise ValueError(f"clip_low={clip_low} must be in (0, 1) so the lower ratio bound 1-clip_low stays positive.")
    if clip_high <= 0.0:
        raise ValueError(f"clip_high={clip_high} must be > 0 (DAPO clip-higher uses 0.28).")
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c={dual_clip_c} must be > 1 (typically 3.0), or None to disable dual clipping.")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip_c: float | None = None,
    agg_mode: str = "token-mean",
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with decoupled clip range (DAPO clip-higher) and optional dual clip.

    logprobs: [B, T] float, log πθ of the sampled tokens (carries the gradient).
    old_logprobs, advantages: [B, T] float, treated as constants. mask: [B, T], 1 on sampled tokens.
    Per token, with ρ = exp(logprobs − old_logprobs):
        ℓ = max(−A ρ, −A clip(ρ, 1 − clip_low, 1 + clip_high))
        and, if dual_clip_c = c and A < 0:  ℓ = min(ℓ, −A c)   (bounds the loss when ρ ≫ 1, Ye et al. 2020)
    Returns (aggregate_loss(ℓ, mask, agg_mode, norm_length), metrics) where metrics (detached scalars,
    token-mean over the mask) are: clipfrac (the clipped branch is active), dual_clipfrac, approx_kl
    (k3 estimate of KL(πold‖πθ): ρ − 1 − log ρ, ≥ 0), ratio_mean, ratio_max, ratio_min.
    """
    _check_clip_range(clip_low, clip_high, dual_clip_c)
    old_logprobs, advantages = old_logprobs.detach(), advantages.detach()
    log_ratio = (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(loss_mat, dtype=torch.bool)
    if dual_clip_c is not None:
        dual_bound = -advantages * dual_clip_c
        dual_clipped = (advantages < 0) & (loss_mat > dual_bound)
        loss_mat = torch.where(dual_clipped, dual_bound, loss_mat)
    loss = aggregate_loss(loss_mat, mask, agg_mode, norm_length)
    with torch.no_grad():
        metrics = _ratio_metrics(ratio.detach(), log_ratio.detach(), mask)
        metrics["clipfrac"] = masked_mean((clipped > unclipped).float(), mask)
        metrics["dual_clipfrac"] = masked_mean(dual_clipped.float(), mask)
    return loss, metrics


def _ratio_metrics(ratio: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    sampled = mask.bool()
    any_sampled = sampled.any()
    nothing = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    largest = torch.where(sampled, ratio, torch.full_like(ratio, -torch.inf)).max()
    smallest = torch.where(sampled, ratio, torch.full_like(ratio, torch.inf)).min()
    return {
        "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": torch.where(any_sampled, largest, nothing),
        "ratio_min": torch.where(any_sampled, smallest, nothing),
    }


# ---------------------------------------------------------------------------------------------
# KL penalty to a reference policy
# ---------------------------------------------------------------------------------------------

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def _kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """log πθ − log πref: unbiased for KL(πθ‖πref) on tokens sampled from πθ, high variance, can be < 0."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def _kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """½ (log πθ − log πref)²: biased, low variance, ≥ 0."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def _kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """r − 1 − log r with r = πref/πθ (Schulman's low-variance estimator): unbiased for KL(πθ‖πref), ≥ 0."""
    log_r = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(log_r) - 1.0 - log_r


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate [B, T] between πθ (logprobs, sampled tokens) and the reference (ref_logprobs).

    kind: one of KL_ESTIMATORS.names() ("k1", "k2", "k3"). Reduce with aggregate_loss(kl, mask, mode).
    """
    return KL_ESTIMATORS.get(kind)(logprobs, ref_logprobs.detach())


# ---------------------------------------------------------------------------------------------
# Entropy
# ---------------------------------------------------------------------------------------------


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: [..., V] -> [...], computed in float32.

    H = logsumexp(z) − Σ p z, which never exponentiates a large logit; logits of −inf (banned tokens)
    contribute 0 instead of NaN. Reduce with aggregate_loss(entropy, mask, mode).
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    # Zero the −inf logits before multiplying: 0·(−inf) is NaN, in the value and in the gradient.
    finite_logits = torch.where(probs > 0, logits, torch.zeros_like(logits))
    return torch.logsumexp(logits, dim=-1) - (probs * finite_logits).sum(dim=-1)


# ---------------------------------------------------------------------------------------------
# Value loss
# ---------------------------------------------------------------------------------------------


def explained_variance(predictions: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var[targets − predictions] / Var[targets] over masked positions; scalar tensor.

    1 = perfect critic, 0 = no better than the mean, < 0 = worse. NaN when the targets are constant
    (the ratio is undefined then; CleanRL reports NaN too).
    """
    predictions, targets = predictions.detach().float(), targets.detach().float()
    target_var = masked_var(targets, mask)
    residual_var = masked_var(targets - predictions, mask)
    undefined = torch.full_like(target_var, torch.nan)
    return torch.where(target_var > 0, 1.0 - residual_var / target_var.clamp(min=1e-30), undefined)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.2,
    agg_mode: str = "token-mean",
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped critic loss: ℓ = ½ max((V − G)², (V_old + clip(V − V_old, −c, c) − G)²); clip=None: ½ (V − G)².

    values: [B, T] float (carries the gradient); old_values, returns: [B, T] float, constants; mask: [B, T].
    Returns (aggregate_loss(ℓ, mask, agg_mode, norm_length), metrics) with detached scalars:
    vf_clipfrac (the clipped branch is the larger), value_mean, explained_variance.
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip={clip} must be > 0, or None to disable value clipping.")
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns) ** 2
    if clip is None:
        loss_mat, clipped_larger = unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (clipped_values - returns) ** 2
        loss_mat, clipped_larger = torch.maximum(unclipped, clipped), clipped > unclipped
    loss = 0.5 * aggregate_loss(loss_mat, mask, agg_mode, norm_length)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": masked_mean(clipped_larger.float(), mask),
            "value_mean": masked_mean(values.detach().float(), mask),
            "explained_variance": explained_variance(values, returns, mask),
        }
    return loss, metrics
