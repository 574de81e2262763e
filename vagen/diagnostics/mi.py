"""Mutual-information proxies for template collapse, from an in-batch cross-scoring matrix (RAGEN v2).

H(Z) = H(Z|X) + I(X;Z): entropy alone sees only H(Z|X). Template collapse keeps H(Z|X) high while
the reasoning z stops depending on the input x, I(X;Z) → 0. To estimate I(X;Z) without another
model, each reasoning sample z of the batch is scored under every batch prompt x_j (teacher forcing,
done by the caller) into `scores[z, j] = log π(z | x_j)`; this module turns that matrix into metrics.
See docs/spec.md §4.

With L̄ = scores / |z| (per-token), B prompts, src(z) the prompt that produced z:

    matched(z)   = L̄[z, src(z)]
    marginal(z)  = logsumexp_j L̄[z, j] − log B         (z under the uniform mixture of batch prompts)
    mi_est       = mean_z (matched − marginal)           <= log B (may dip below 0); → 0 under collapse
    mi_seq_est   = the same on summed scores (no length normalisation)
    mi_zscore    = mi_est / (std_z(marginal) + 1e-3)     (per-token, population std over z)
    mi_zscore_ema= mi_est / (EMA of std_z(marginal) + 1e-3), EMA decay 0.9, updated with this batch
    h_cond_est   = −mean_z matched,   h_marg_est = −mean_z marginal   (nats per token; mi_est = h_marg − h_cond)
    retrieval_acc= fraction of z whose argmax_j scores[z, j] is its source prompt; recall@k: in the top k

Both per-token and summed scores are bounded above by log B (logsumexp >= the matched term), which
is reported as `mi_upper_bound`. Retrieval uses summed scores; per-token would rank identically.

Identical prompts (`prompt_ids`): when two batch prompts are the same state, no scorer can tell
them apart, so retrieval counts any prompt identical to the source as correct. The chance levels
and the upper bound are then computed exactly for the duplicates present (see `mi_metrics`); with
all prompts distinct they reduce to 1/B, k/B and log B.

Ties: exact ties in a row are broken uniformly at random *in expectation* (a z scored equally under
all B prompts gets retrieval 1/B, not 1 or 0 depending on its index), so an input-ignoring policy
reads exactly at chance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

EMA_KEY = "marginal_std_ema"
"""`ema_state[EMA_KEY]`: 0-dim float64, EMA of std_z(marginal); `ema_state["num_updates"]`: 0-dim long."""
ZSCORE_EPS = 1e-3


def _check_inputs(scores: Tensor, lengths: Tensor, source: Tensor, prompt_ids: Tensor | None) -> None:
    """Raise ValueError naming the cause and the fix for malformed inputs."""
    if not isinstance(scores, Tensor) or scores.dim() != 2 or not scores.is_floating_point():
        got = f"{tuple(scores.shape)} {scores.dtype}" if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"scores must be a float tensor [num_reasoning Z, num_prompts B], got {got}.")
    num_z, num_prompts = scores.shape
    if num_z < 1 or num_prompts < 2:
        raise ValueError(
            f"scores has shape {(num_z, num_prompts)}; cross-scoring needs Z >= 1 samples and B >= 2 prompts."
        )
    if not torch.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf; check the teacher-forced log-probs (masking, dtype overflow).")
    if not isinstance(lengths, Tensor) or lengths.shape != (num_z,):
        raise ValueError(f"lengths must be a tensor [Z={num_z}] of token counts per reasoning sample.")
    if not (lengths > 0).all():
        raise ValueError("lengths must be > 0: drop reasoning samples with no tokens before cross-scoring.")
    if not isinstance(source, Tensor) or source.shape != (num_z,) or source.dtype != torch.long:
        raise ValueError(f"source must be a long tensor [Z={num_z}] holding each sample's prompt column index.")
    if not ((source >= 0) & (source < num_prompts)).all():
        raise ValueError(f"source indices must lie in [0, B={num_prompts}); they index the columns of scores.")
    if prompt_ids is not None and (
        not isinstance(prompt_ids, Tensor) or prompt_ids.shape != (num_prompts,) or prompt_ids.dtype != torch.long
    ):
        raise ValueError(f"prompt_ids must be a long tensor [B={num_prompts}]; equal ids mark identical prompts.")


def _log_binomial(n: Tensor, r: Tensor) -> Tensor:
    """log C(n, r) for float64 tensors with 0 <= r <= n."""
    return torch.lgamma(n + 1) - torch.lgamma(r + 1) - torch.lgamma(n - r + 1)


def miss_probability(pool: Tensor, marked: Tensor, draws: Tensor) -> Tensor:
    """P(a uniformly random `draws`-subset of `pool` items contains none of the `marked` ones).

    = C(pool − marked, draws) / C(pool, draws), and 0 when fewer than `draws` items are unmarked.
    Elementwise over broadcastable integer-valued tensors; returns float64.
    """
    pool, marked, draws = (t.to(torch.float64) for t in (pool, marked, draws))
    unmarked = pool - marked
    possible = unmarked >= draws
    safe_unmarked = torch.where(possible, unmarked, draws)  # keeps lgamma arguments >= 1
    log_ratio = _log_binomial(safe_unmarked, draws) - _log_binomial(pool, draws)
    return torch.where(possible, log_ratio.exp(), torch.zeros_like(log_ratio))


def expected_hit_at_k(scores: Tensor, correct: Tensor, k: int) -> Tensor:
    """Per-row probability `[Z]` float64 that the top-k columns of `scores` hold a `correct` column.

    Columns strictly above the k-th largest value are always in the top k; the remaining slots are
    filled uniformly at random from the columns tied with it, so exact ties give the expected hit.
    `scores` `[Z, B]` float, `correct` `[Z, B]` bool, 1 <= k <= B.
    """
    kth_value = scores.topk(k, dim=1).values[:, -1:]  # (Z, 1)
    above, tied = scores > kth_value, scores == kth_value  # (Z, B)
    draws = k - above.sum(dim=1)  # (Z,), >= 1
    sure_hit = (above & correct).any(dim=1)
    miss = miss_probability(tied.sum(dim=1), (tied & correct).sum(dim=1), draws)
    return torch.where(sure_hit, torch.ones_like(miss), 1.0 - miss)


def _retrieval_metrics(scores: Tensor, correct: Tensor, recall_ks: Sequence[int]) -> dict[str, Tensor]:
    """retrieval_acc (= recall@1), recall@k for each k < B, and their chance levels under random scoring."""
    num_prompts = scores.shape[1]
    copies = correct.sum(dim=1)  # (Z,) prompts identical to the source, itself included
    metrics: dict[str, Tensor] = {}
    for k in (1, *recall_ks):
        if k >= num_prompts:
            continue  # recall@k with k >= B is 1 by construction and carries no information
        name = "retrieval_acc" if k == 1 else f"recall@{k}"
        chance_name = "retrieval_chance" if k == 1 else f"recall@{k}_chance"
        metrics[name] = expected_hit_at_k(scores, correct, k).mean()
        k_tensor = torch.full_like(copies, k)
        metrics[chance_name] = (1.0 - miss_probability(torch.full_like(copies, num_prompts), copies, k_tensor)).mean()
    return metrics


def _matched_and_marginal(log_probs: Tensor, source: Tensor) -> tuple[Tensor, Tensor]:
    """matched `[Z]` = L[z, src(z)], marginal `[Z]` = logsumexp_j L[z, j] − log B, for L `[Z, B]`."""
    matched = log_probs.gather(1, source[:, None]).squeeze(1)
    marginal = log_probs.logsumexp(dim=1) - math.log(log_probs.shape[1])
    return matched, marginal


def _updated_ema(ema_state: dict[str, Tensor] | None, batch_std: Tensor, decay: float) -> dict[str, Tensor]:
    """New EMA state: initialised with the batch std on the first call, else decay·old + (1−decay)·batch."""
    if ema_state is None:
        return {EMA_KEY: batch_std.clone(), "num_updates": torch.ones((), dtype=torch.long, device=batch_std.device)}
    if EMA_KEY not in ema_state or "num_updates" not in ema_state:
        raise ValueError(
            f"ema_state must be the dict returned by a previous mi_metrics call (keys {EMA_KEY!r}, 'num_updates'), "
            f"got keys {sorted(ema_state)}; pass None to start a new EMA."
        )
    previous = ema_state[EMA_KEY].to(batch_std)
    return {EMA_KEY: decay * previous + (1.0 - decay) * batch_std, "num_updates": ema_state["num_updates"] + 1}


def mi_metrics(
    scores: Tensor,
    lengths: Tensor,
    source: Tensor,
    ema_state: dict[str, Tensor] | None = None,
    ema_decay: float = 0.9,
    recall_ks: Sequence[int] = (2, 4, 8),
    prompt_ids: Tensor | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """MI proxies, entropy estimates and retrieval metrics of one cross-scoring matrix.

    Args:
        scores: `[Z, B]` float, summed log π(z | x_j) of reasoning sample z under batch prompt j.
        lengths: `[Z]` int or float, token count |z| of each sample (> 0).
        source: `[Z]` long, column index of the prompt that generated z.
        ema_state: None on the first call, then the state returned by the previous call (a dict of
            0-dim tensors, safe to checkpoint with `torch.save`).
        ema_decay: weight of the old EMA value, in [0, 1).
        recall_ks: the k of recall@k; a k >= B is skipped (its recall and chance are both 1).
        prompt_ids: optional `[B]` long; prompts with equal ids are identical, and retrieving any of
            them counts as correct. Chances become mean_z P(random top-k hits one of the m_z copies of
            z's prompt) and the bound mean_z log(B / m_z).

    Returns:
        metrics: 0-dim float32 tensors: retrieval_acc, retrieval_chance, recall@k, recall@k_chance,
            mi_est, mi_seq_est, mi_upper_bound, mi_zscore, mi_zscore_ema, h_cond_est, h_marg_est.
        new_ema_state: the updated EMA state (the input state is not modified).
    """
    _check_inputs(scores, lengths, source, prompt_ids)
    if not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"ema_decay must be in [0, 1) (weight of the past), got {ema_decay}; the paper uses 0.9.")
    if any(not isinstance(k, int) or k < 1 for k in recall_ks):
        raise ValueError(f"recall_ks must be positive integers, got {tuple(recall_ks)}.")
    summed = scores.to(torch.float64)
    per_token = summed / lengths.to(torch.float64)[:, None]  # (Z, B)
    ids = prompt_ids if prompt_ids is not None else torch.arange(scores.shape[1], device=scores.device)
    correct = ids[None, :] == ids[source][:, None]  # (Z, B) True where the prompt equals z's source

    matched, marginal = _matched_and_marginal(per_token, source)
    seq_matched, seq_marginal = _matched_and_marginal(summed, source)
    mi_est = (matched - marginal).mean()
    marginal_std = marginal.std(correction=0)  # population: defined for Z == 1, it is only a scale
    new_ema_state = _updated_ema(ema_state, marginal_std, ema_decay)
    metrics = _retrieval_metrics(summed, correct, recall_ks)
    metrics.update(
        mi_est=mi_est,
        mi_seq_est=(seq_matched - seq_marginal).mean(),
        mi_upper_bound=(scores.shape[1] / correct.sum(dim=1).to(torch.float64)).log().mean(),
        mi_zscore=mi_est / (marginal_std + ZSCORE_EPS),
        mi_zscore_ema=mi_est / (new_ema_state[EMA_KEY] + ZSCORE_EPS),
        h_cond_est=-matched.mean(),
        h_marg_est=-marginal.mean(),
    )
    return {name: value.to(torch.float32) for name, value in metrics.items()}, new_ema_state
