"""Where the MI regime thresholds should sit: MI proxies of a healthy policy and of a collapsed one, side by side.

    python research/bench_mi_regimes.py [groups=16] [group_size=4] [seed=0]

Healthy: the shipped warm tiny_vl on sokoban_visual, whose reasoning names where the box and the target are,
so it depends on the (image-only) input. Collapsed: the same weights with the vision merger's output layer
zeroed, so every image becomes the same tokens and the reasoning *cannot* depend on the input: template
collapse by construction, with the text machinery intact. Both play the same env seeds at temperature 1;
the trainer's own diagnostics code (`build_scoring_job`, `cross_scores`, `mi_metrics`) scores them.

Prints, per scope, MI-Est per token, its log B ceiling, H(Z|X) per token, and the regime that each MI
threshold rule assigns (a column per rule): `0.1 · log B` (the default) and `0.1 · (first measured MI-Est)`.
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import torch

from vagen.cli import script_options
from vagen.diagnostics import classify_regime, mi_metrics
from vagen.diagnostics.scoring import build_scoring_job, cross_scores
from vagen.engines import HFEngine, SamplingParams
from vagen.env import make_env
from vagen.models.registry import load_policy
from vagen.rollout import DialogueFormatter, RolloutSpec, collect_rollouts

FRACTION = 0.1  # diagnostics.mi_threshold_fraction


def blind(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose image tokens carry no information: the vision merger's last layer outputs zeros."""
    blind_model = copy.deepcopy(model)
    last = blind_model.model.visual.merger.mlp[-1]
    torch.nn.init.zeros_(last.weight)
    torch.nn.init.zeros_(last.bias)
    return blind_model


def measure(model, policy, seeds: list[int], group_size: int, seed: int) -> dict[str, dict[str, float]]:
    formatter = DialogueFormatter(policy.tokenizer, policy.image_processor)
    spec = RolloutSpec(group_seeds=seeds, group_size=group_size, max_context_tokens=2048, env_name="sokoban_visual")
    env_kwargs = {"observation": "image", "dim_room": (6, 6), "num_boxes": 1, "tile_px": 28, "max_turns": 5}
    make = lambda: make_env("vagen/Sokoban-v0", **env_kwargs, max_actions_per_turn=3)
    sampling = SamplingParams(max_new_tokens=48, temperature=1.0, seed=seed)
    trajectories = collect_rollouts(make, HFEngine(model, policy.processor), formatter, spec, sampling)
    out = {}
    for scope in ("first_turn", "trajectory"):
        job = build_scoring_job(trajectories, policy.tokenizer, scope, 16, 64, np.random.default_rng(seed))
        scores, lengths = cross_scores(model, policy.processor, job, micro_batch=32)
        values, _ = mi_metrics(scores, lengths, job.source(), prompt_ids=job.prompt_ids())
        out[scope] = {name: float(value) for name, value in values.items()}
    return out


def main() -> None:
    torch.manual_seed(0)
    options, _ = script_options(sys.argv[1:], {"groups": 16, "group_size": 4, "seed": 0}, overrides=False)
    groups, group_size, seed = options.groups, options.group_size, options.seed
    policy = load_policy("tiny_vl", "tiny_vl", "vision", size="default", dtype="float32")
    seeds = [10**9 + k for k in range(groups)]  # held-out evaluation seeds
    results = {
        "healthy": measure(policy.model, policy, seeds, group_size, seed),
        "collapsed": measure(blind(policy.model), policy, seeds, group_size, seed),
    }
    header = ("scope", "policy", "MI-Est/token", "log B", "MI-Est / log B", "H(Z|X)/token", "0.1·log B", "0.1·first MI")
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for scope in ("first_turn", "trajectory"):
        first = results["healthy"][scope]
        h_threshold = 0.5 * first["h_cond_est"]
        for name, metrics in results.items():
            mi, ceiling, h = metrics[scope]["mi_est"], metrics[scope]["mi_upper_bound"], metrics[scope]["h_cond_est"]
            old = classify_regime(mi, h, FRACTION * ceiling, h_threshold)
            calibrated = classify_regime(mi, h, FRACTION * first["mi_est"], h_threshold)
            row = (scope, name, f"{mi:.4f}", f"{ceiling:.3f}", f"{mi / ceiling:.4f}", f"{h:.3f}", old, calibrated)
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
