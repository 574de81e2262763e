"""research/hole_probe.py: the truth it reads off the game, and its linear probe finding a feature that is there and
none where there is none."""

import numpy as np
from test_trainer import repo_module

from vagen.env.registry import make_env


def hole_probe():
    return repo_module("research/hole_probe.py")


def test_holes_beside_the_player_come_from_the_game():
    env = make_env("vagen/FrozenLake-v0", desc=["SFFF", "FHFH", "FFFH", "HFFG"])
    env.reset(seed=0)
    assert hole_probe().holes_beside(env) == [False, False, False, False]  # (0, 0): ice below and to the right
    env.step("<think>go</think><answer>Down || Down</answer>")  # (2, 0): a hole below
    assert hole_probe().holes_beside(env) == [False, True, False, False]
    env.step("<think>go</think><answer>Right</answer>")  # (2, 1): a hole above (1, 1); (3, 1) is ice
    assert hole_probe().holes_beside(env) == [True, False, False, False]


def test_the_probe_reads_a_feature_that_is_there_and_finds_none_in_noise():
    rng = np.random.default_rng(0)
    labels = (rng.random((600, 4)) < 0.15).astype(float)  # holes on about 15% of the sides, as in the game
    noise = rng.normal(size=(600, 32))
    encoded = noise.copy()
    encoded[:, :4] += 5.0 * labels  # the four facts written, with noise, into four of 32 dimensions
    accuracy, recall = hole_probe().fit_probe(encoded, labels, train=420)
    assert (accuracy > 0.95).all() and (recall > 0.8).all()
    accuracy, recall = hole_probe().fit_probe(noise, labels, train=420)
    majority = np.maximum(labels[420:].mean(0), 1 - labels[420:].mean(0))
    assert (accuracy <= majority + 0.03).all() and (recall < 0.3).all()
