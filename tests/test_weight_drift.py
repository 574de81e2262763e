"""research/weight_drift.py: the drift ratio on hand-made paths, its pure-noise reference against Adam on a constant
gradient, and a real run's ratio against the one computed from every checkpoint's weights."""

import itertools
import math

import pytest
import torch
from safetensors.torch import load_file
from test_trainer import VISUAL, config, repo_module

from vagen.models.registry import load_policy
from vagen.trainer.run import train


def weight_drift():
    return repo_module("research/weight_drift.py")


def test_drift_ratio_is_one_for_orthogonal_steps_and_t_for_parallel_ones():
    drift = weight_drift()
    # Four unit steps along four axes: |w_T - w_0|^2 = 4, path 4. The same step four times: 16 over 4.
    assert drift.drift_ratio(4.0, [1.0] * 4) == 1.0
    assert drift.drift_ratio(16.0, [1.0] * 4) == 4.0


def test_adam_on_pure_noise_stays_far_below_a_drift_and_grows_with_momentum_only():
    """Adam's momentum correlates neighbouring steps, so pure noise gives R > 1 that grows slowly towards
    (1 + beta1) / (1 - beta1) = 19 for one step per iteration (1 / (1 - beta1) = 10 for two); a constant gradient moves
    every step the same way: R = T exactly."""
    drift = weight_drift()
    early, late = drift.adam_noise_ratio(4, 2), drift.adam_noise_ratio(40, 2)
    assert 1.5 < early < late < 19 and late < 40 / 3
    weights = torch.zeros(100, requires_grad=True)
    optimizer = torch.optim.AdamW([weights], lr=1e-3, weight_decay=0.0)
    steps = []
    for _ in range(40):
        before = weights.detach().clone()
        weights.grad = torch.ones(100)
        optimizer.step()
        steps.append(float((weights.detach() - before).pow(2).sum()))
    assert drift.drift_ratio(float(weights.detach().pow(2).sum()), steps) == pytest.approx(40, rel=1e-4)


@pytest.mark.slow(seconds=40)
def test_a_run_ratio_from_its_logged_update_norms_matches_its_checkpoints_weights(tmp_path):
    """Three iterations of the tiny test model, every checkpoint kept: the path length from the logged relative update
    norms equals the one summed from the checkpoints' weights (the weights' norm changes by under a percent)."""
    drift = weight_drift()
    cfg = config([*VISUAL, "trainer.iterations=3", "trainer.save_every=1", "trainer.keep_checkpoints=3"], tmp_path)
    run_dir = train(cfg)
    row = drift.run_drift(run_dir)
    model = cfg.model
    start = load_policy(model.name, model.source, model.modality, path=model.path, size=model.size).model.state_dict()
    weights = [
        load_file(run_dir / "checkpoints" / f"iter_{t:06d}" / "modules" / "policy.safetensors") for t in (1, 2, 3)
    ]
    names = list(weights[0])
    flat = [torch.cat([w[n].double().flatten() for n in names]) for w in [start, *weights]]
    path_sq = sum(float((b - a).pow(2).sum()) for a, b in itertools.pairwise(flat))
    distance_sq = float((flat[-1] - flat[0]).pow(2).sum())
    assert row["iteration"] == 3 and row["distance"] == pytest.approx(math.sqrt(distance_sq) / float(flat[0].norm()))
    assert row["ratio"] == pytest.approx(distance_sq / path_sq, rel=0.02)
    assert row["null"] == pytest.approx(drift.adam_noise_ratio(3, 1))  # 4 episodes, mini-batches of 4: one step
