"""Gradient noise scale of the policy update (McCandlish et al. 2018, "An empirical model of large-batch training"):
does one iteration's gradient point where the expected reward rises, or is it mostly the luck of its rollouts?

Let h_m be the update's gradient on prompt group m alone (its N rollouts), G = E[h] the gradient of the expected
objective and S = tr Cov(h) the per-group noise. A batch of P groups has gradient mean_m h_m, whose squared norm is
|G|^2 (signal) + S / P (noise) in expectation, so
    critical batch  B = S / |G|^2 groups   (signal and noise equal in size),
    signal fraction f(P) = |G|^2 / (|G|^2 + S / P),
the share of a P-group step's squared norm that is the true gradient.

The estimates need only dot products between sums of group gradients: the groups are split into folds (sums F_k of
the gradients of n_k groups each, and q_k = sum of |h_m|^2 over the fold), so the per-group gradients are never all
held in memory. With M groups in all, |G|^2 is estimated without bias from the cross terms only,
    |G|^2 ≈ (|sum_k F_k|^2 - sum_k q_k) / (M (M - 1)),    S ≈ sum_k q_k / M - |G|^2,
and its standard error by the delete-a-fold jackknife.
"""

from __future__ import annotations

import torch


def _signal_sq(total_sq: torch.Tensor, square_norms: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Unbiased |G|^2 from |sum of all h|^2, sum of |h|^2 and the number of groups (only the cross terms)."""
    return (total_sq - square_norms) / (groups * (groups - 1))


def gradient_noise(
    fold_gram: torch.Tensor, fold_sizes: torch.Tensor, fold_square_norms: torch.Tensor, batch_groups: int
) -> dict[str, float]:
    """The noise scale from fold sums of per-group gradients.

    fold_gram: [K, K] dot products F_i . F_j of the folds' gradient sums; fold_sizes: [K] groups per fold;
    fold_square_norms: [K] sum of |h_m|^2 over each fold's groups; batch_groups: P, the groups of one update.
    Returns signal_sq (|G|^2) and its jackknife signal_sq_se, noise_trace (S), critical_groups (S / |G|^2, inf when
    no signal is measured), signal_fraction at P groups, and halves_cosine: the cosine between the mean gradients of
    the first and second half of the folds (about f(M/2) when the signal is real).
    """
    gram, sizes, norms = fold_gram.double(), fold_sizes.double(), fold_square_norms.double()
    folds, groups = len(sizes), sizes.sum()
    if folds < 2 or groups < 3:
        raise ValueError(f"gradient noise needs at least 2 folds and 3 groups, got {folds} folds of {int(groups)}")
    total_sq = gram.sum()
    signal_sq = _signal_sq(total_sq, norms.sum(), groups)
    noise_trace = norms.sum() / groups - signal_sq
    # Delete-a-fold jackknife: |sum without fold k|^2 = |sum|^2 - 2 F_k . sum + |F_k|^2.
    without = _signal_sq(total_sq - 2 * gram.sum(1) + gram.diag(), norms.sum() - norms, groups - sizes)
    signal_sq_se = ((folds - 1) / folds * ((without - without.mean()) ** 2).sum()).sqrt()
    half = folds // 2
    first, second = gram[:half, :half].sum(), gram[half:, half:].sum()
    cross = gram[:half, half:].sum()
    halves_cosine = cross / (first * second).sqrt().clamp(min=1e-300)
    has_signal = bool(signal_sq > 0)
    critical = float(noise_trace / signal_sq) if has_signal else float("inf")
    fraction = float(signal_sq / (signal_sq + noise_trace / batch_groups)) if has_signal else 0.0
    return {
        "signal_sq": float(signal_sq),
        "signal_sq_se": float(signal_sq_se),
        "noise_trace": float(noise_trace),
        "critical_groups": critical,
        "signal_fraction": fraction,
        "halves_cosine": float(halves_cosine),
    }
