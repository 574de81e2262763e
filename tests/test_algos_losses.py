"""Losses: loop references, hand-computed aggregation, clipping gradients, KL/entropy/value properties."""

from __future__ import annotations

import math

import pytest
import torch

from vagen.algos.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    aggregate_loss,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    policy_loss,
    value_loss,
)

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def random_policy_batch(seed: int, batch: int = 4, length: int = 12):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 3
    new = old + torch.randn(batch, length, generator=gen) * 0.4  # ratios spread over and beyond the clip range
    advantages = torch.randn(batch, length, generator=gen)
    mask = torch.rand(batch, length, generator=gen) < 0.7
    mask[0] = False  # a row with no sampled tokens
    mask[1, 0] = True
    return new, old, advantages, mask


def loop_aggregate(loss_rows: list[list[float]], mask_rows: list[list[bool]], mode: str, norm_length=None) -> float:
    per_seq = []
    total, count = 0.0, 0
    for losses, mask in zip(loss_rows, mask_rows, strict=True):
        kept = [x for x, m in zip(losses, mask, strict=True) if m]
        total += sum(kept)
        count += len(kept)
        if kept:
            per_seq.append(sum(kept) / len(kept) if mode == "seq-mean-token-mean" else sum(kept))
    if mode == "token-mean":
        return total / max(count, 1)
    seq_mean = sum(per_seq) / max(len(per_seq), 1)
    if mode == "seq-mean-token-sum-norm":
        return seq_mean / (norm_length or len(loss_rows[0]))
    return seq_mean


def loop_policy_loss(new, old, adv, mask, clip_low, clip_high, dual_c, mode):
    loss_rows = []
    for b in range(new.shape[0]):
        row = []
        for t in range(new.shape[1]):
            ratio = math.exp(float(new[b, t]) - float(old[b, t]))
            a = float(adv[b, t])
            loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
            if dual_c is not None and a < 0:
                loss = min(loss, -a * dual_c)
            row.append(loss)
        loss_rows.append(row)
    return loop_aggregate(loss_rows, mask.tolist(), mode)


# ----------------------------------------------------------------------------------- aggregation


def test_aggregation_modes_on_hand_computed_example():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0], [100.0, 100.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # the 100s are padding; row 2 is empty
    expected = {
        "token-mean": (1 + 2 + 3 + 4) / 4,
        "seq-mean-token-mean": (2 + 4) / 2,
        "seq-mean-token-sum": (6 + 4) / 2,
        "seq-mean-token-sum-norm": (6 + 4) / 2 / 4,  # L = T = 4
    }
    for mode, value in expected.items():
        torch.testing.assert_close(aggregate_loss(loss_mat, mask, mode), torch.tensor(value), msg=mode)
    torch.testing.assert_close(
        aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", norm_length=10), torch.tensor(0.5)
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aggregation_matches_loop(mode, seed):
    gen = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(5, 9, generator=gen)
    mask = torch.rand(5, 9, generator=gen) < 0.5
    want = loop_aggregate(loss_mat.tolist(), mask.tolist(), mode)
    torch.testing.assert_close(aggregate_loss(loss_mat, mask, mode), torch.tensor(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_gives_zero_loss_and_zero_gradient(mode):
    loss_mat = torch.randn(2, 5, requires_grad=True)
    loss = aggregate_loss(loss_mat, torch.zeros(2, 5), mode)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(loss_mat.grad, torch.zeros(2, 5))


def test_aggregation_registry_errors():
    assert LOSS_AGGREGATIONS.names() == sorted(MODES)
    with pytest.raises(ValueError, match=r"'seq-mean'.*seq-mean-token-mean.*token-mean"):
        aggregate_loss(torch.zeros(1, 2), torch.ones(1, 2), "seq-mean")
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(torch.zeros(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm", norm_length=0)


# ----------------------------------------------------------------------------------- policy loss


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dual_c", [None, 3.0])
def test_policy_loss_matches_loop(seed, mode, dual_c):
    new, old, adv, mask = random_policy_batch(seed)
    new = new.clone()
    new[2, :4] = old[2, :4] + 2.0  # ratio e² > 3: dual clip applies where A < 0
    loss, _ = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip_c=dual_c, agg_mode=mode)
    want = loop_policy_loss(new, old, adv, mask, 0.2, 0.28, dual_c, mode)
    torch.testing.assert_close(loss, torch.tensor(want), rtol=1e-5, atol=1e-6)


def one_token_gradient(ratio: float, advantage: float, **kwargs) -> tuple[float, float]:
    """(loss, d loss / d logprob) for a single sampled token with the given ratio and advantage."""
    logprob = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, _ = policy_loss(logprob, torch.zeros(1, 1), torch.tensor([[advantage]]), torch.ones(1, 1), **kwargs)
    loss.backward()
    return loss.item(), logprob.grad.item()


@pytest.mark.parametrize(
    ("ratio", "advantage", "clipped"),
    [
        (1.1, 1.0, False),  # inside the range
        (1.1, -1.0, False),
        (1.35, 1.0, True),  # above 1 + ε_high with A > 0: no incentive to push further
        (1.25, 1.0, False),  # inside the decoupled upper bound 1.28 (would be clipped at a symmetric 0.2)
        (0.7, -1.0, True),  # below 1 − ε_low with A < 0
        (0.7, 1.0, False),  # below the range with A > 0: the pessimistic bound keeps the gradient
        (1.5, -1.0, False),  # above the range with A < 0: the pessimistic bound keeps the gradient
    ],
)
def test_clipping_zeroes_gradient_exactly_where_it_must(ratio, advantage, clipped):
    loss, grad = one_token_gradient(ratio, advantage, clip_low=0.2, clip_high=0.28)
    if clipped:
        assert grad == 0.0
        bound = 1.28 if ratio > 1 else 0.8
        assert loss == pytest.approx(-advantage * bound)
    else:
        # d(−A ρ)/d log π = −A ρ
        assert grad == pytest.approx(-advantage * ratio)
        assert loss == pytest.approx(-advantage * ratio)


def test_dual_clip_caps_loss_for_negative_advantage_and_large_ratio():
    loss, grad = one_token_gradient(5.0, -2.0, dual_clip_c=3.0)
    assert loss == pytest.approx(6.0)  # −A·c instead of −A·ρ = 10
    assert grad == 0.0
    loss, grad = one_token_gradient(2.0, -2.0, dual_clip_c=3.0)  # ρ < c: ordinary pessimistic bound
    assert loss == pytest.approx(4.0)
    assert grad == pytest.approx(4.0)
    loss, _ = one_token_gradient(5.0, 2.0, dual_clip_c=3.0)  # positive advantages are never dual-clipped
    assert loss == pytest.approx(-2.0 * 1.28)


def test_policy_gradient_flows_only_through_sampled_tokens():
    new, old, adv, mask = random_policy_batch(7)
    new.requires_grad_(True)
    loss, _ = policy_loss(new, old, adv, mask)
    loss.backward()
    assert torch.isfinite(new.grad).all()
    assert torch.all(new.grad[~mask] == 0)
    assert (new.grad[mask] != 0).any()


def test_policy_metrics_on_hand_example():
    # Ratios 1.0, 1.5 (A>0, clipped), 0.5 (A<0, clipped), 2.0 (padding).
    ratios = torch.tensor([[1.0, 1.5, 0.5, 2.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    _, metrics = policy_loss(ratios.log(), torch.zeros(1, 4), torch.tensor([[1.0, 1.0, -1.0, 1.0]]), mask)
    torch.testing.assert_close(metrics["clipfrac"], torch.tensor(2 / 3))
    torch.testing.assert_close(metrics["ratio_mean"], torch.tensor(1.0))
    torch.testing.assert_close(metrics["ratio_max"], torch.tensor(1.5))
    torch.testing.assert_close(metrics["ratio_min"], torch.tensor(0.5))
    k3 = [r - 1 - math.log(r) for r in (1.0, 1.5, 0.5)]
    torch.testing.assert_close(metrics["approx_kl"], torch.tensor(sum(k3) / 3))
    assert metrics["dual_clipfrac"].item() == 0.0
    assert all(not m.requires_grad for m in metrics.values())


def test_approx_kl_is_zero_on_policy_and_nonnegative_off_policy():
    new, old, adv, mask = random_policy_batch(3)
    _, on_policy = policy_loss(old.clone(), old, adv, mask)
    assert on_policy["approx_kl"].item() == 0.0
    assert on_policy["clipfrac"].item() == 0.0
    _, off_policy = policy_loss(new, old, adv, mask)
    assert off_policy["approx_kl"].item() > 0.0


def test_invalid_clip_settings_raise():
    args = (torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(*args, clip_low=1.0)
    with pytest.raises(ValueError, match="clip_high"):
        policy_loss(*args, clip_high=0.0)
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss(*args, dual_clip_c=0.5)


# ----------------------------------------------------------------------------------- KL


def test_kl_estimators_formulas():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    diff = logp - ref
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), diff)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * diff**2)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(-diff) - 1 + diff)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert kl_penalty(logp, ref, "k3")[2].item() == 0.0


def test_k1_and_k3_are_unbiased_for_kl_on_samples_from_the_policy():
    gen = torch.Generator().manual_seed(0)
    policy = torch.softmax(torch.randn(6, generator=gen), 0)
    reference = torch.softmax(torch.randn(6, generator=gen), 0)
    true_kl = (policy * (policy / reference).log()).sum()
    samples = torch.multinomial(policy, 200_000, replacement=True, generator=gen)
    logp, ref = policy.log()[samples], reference.log()[samples]
    for kind in ("k1", "k3"):
        torch.testing.assert_close(kl_penalty(logp, ref, kind).mean(), true_kl, atol=0.01, rtol=0, msg=kind)


def test_kl_gradient_reaches_policy_not_reference():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    aggregate_loss(kl_penalty(logp, ref, "k3"), torch.ones(1, 2)).backward()
    assert logp.grad.abs().sum() > 0
    assert ref.grad is None


def test_kl_registry_errors():
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
    with pytest.raises(ValueError, match=r"'mse'.*k1.*k2.*k3"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "mse")


# ----------------------------------------------------------------------------------- entropy


def test_entropy_matches_naive_formula_and_uniform_is_log_v():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits), -(probs * probs.log()).sum(-1))
    torch.testing.assert_close(entropy_from_logits(torch.zeros(2, 7)), torch.full((2,), math.log(7)))


def test_entropy_is_stable_for_huge_and_banned_logits():
    huge = torch.tensor([[1e4, 1e4 - 1.0, -1e4]])
    banned = torch.tensor([[0.0, 0.0, -torch.inf]], requires_grad=True)
    assert torch.isfinite(entropy_from_logits(huge)).all()
    entropy = entropy_from_logits(banned)
    torch.testing.assert_close(entropy, torch.tensor([math.log(2)]))
    entropy.sum().backward()
    assert torch.isfinite(banned.grad).all()


def test_entropy_bonus_aggregates_over_mask_and_has_gradient():
    logits = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    entropy = entropy_from_logits(logits)
    bonus = aggregate_loss(entropy, mask, "token-mean")
    torch.testing.assert_close(bonus, (entropy[0, 0] + entropy[0, 1] + entropy[1, 0]) / 3)
    bonus.backward()
    assert torch.all(logits.grad[~mask.bool()] == 0)
    assert logits.grad[mask.bool()].abs().sum() > 0


# ----------------------------------------------------------------------------------- value loss


def test_value_loss_hand_example():
    values = torch.tensor([[1.5, 0.0, 9.0]], requires_grad=True)
    old = torch.tensor([[1.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, clip=0.2)
    # Token 0: unclipped (1.5)² = 2.25, clipped (1.2)² = 1.44 -> 2.25. Token 1: 1 both. Token 2: padding.
    torch.testing.assert_close(loss, torch.tensor(0.5 * (2.25 + 1.0) / 2))
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[1.5 / 2, -1.0 / 2, 0.0]]))
    assert metrics["vf_clipfrac"].item() == 0.0
    torch.testing.assert_close(metrics["value_mean"], torch.tensor(0.75))


def test_value_loss_clipped_branch_has_zero_gradient():
    # V moved toward G past the clip: V_old = 0, G = 3, V = 2 -> clipped V = 0.2 with error 2.8² > 1².
    values = torch.tensor([[2.0]], requires_grad=True)
    loss, metrics = value_loss(values, torch.zeros(1, 1), torch.tensor([[3.0]]), torch.ones(1, 1), clip=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.5 * 2.8**2)
    assert values.grad.item() == 0.0
    assert metrics["vf_clipfrac"].item() == 1.0
    loss, _ = value_loss(values, torch.zeros(1, 1), torch.tensor([[3.0]]), torch.ones(1, 1), clip=None)
    assert loss.item() == pytest.approx(0.5)


def test_value_loss_rejects_bad_clip():
    with pytest.raises(ValueError, match="clip"):
        value_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), clip=-1.0)


def test_explained_variance_reference_points():
    targets = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    torch.testing.assert_close(explained_variance(targets, targets, mask), torch.tensor(1.0))
    torch.testing.assert_close(explained_variance(torch.full_like(targets, 2.0), targets, mask), torch.tensor(0.0))
    assert explained_variance(targets, torch.ones_like(targets), mask).isnan()
