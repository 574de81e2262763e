"""Where the MI regime thresholds should sit: MI proxies of a healthy policy and of a collapsed one, side by side.

    python research/bench_mi_regimes.py [env=sokoban_visual|sokoban_text|frozenlake_text] [groups=16] [group_size=4]
        [seed=0]

Healthy: the shipped warm default model of the env (tiny_vl on sokoban_visual, tiny_text on sokoban_text,
tiny_text_holes on frozenlake_text), whose reasoning names what is around the player, so it depends on the input.
Collapsed: the same weights made blind to the board, so the reasoning *cannot* depend on the input: template collapse
by construction, with the text machinery intact. For tiny_vl the vision merger's output layer is zeroed (every image
becomes the same tokens); for tiny_text (and tiny_text_holes) every board cell enters as the same cell token without
its row, column or neighbours (the output layer, tied to the embedding, is unchanged). Both play the same env seeds at
temperature 1; the trainer's own diagnostics code (`build_scoring_job`, `cross_scores`, `mi_metrics`) scores them.

Prints, per scope, MI-Est per token, its log B ceiling, H(Z|X) per token, and the regime that each MI
threshold rule assigns (a column per rule): `0.1 · log B` (the default) and `0.1 · (first measured MI-Est)`.
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import torch

from vagen.bootstrap.tiny_text import make_text_game
from vagen.cli import script_options
from vagen.diagnostics import classify_regime, mi_metrics
from vagen.diagnostics.scoring import build_scoring_job, cross_scores
from vagen.engines import HFEngine, SamplingParams
from vagen.env import make_env
from vagen.models.board_lm import BoardEmbedding
from vagen.models.registry import load_policy
from vagen.rollout import DialogueFormatter, RolloutSpec, collect_rollouts

FRACTION = 0.1  # diagnostics.mi_threshold_fraction


class BlindBoard(torch.nn.Module):
    """tiny_text's input embedding with every board cell read as the same cell and no row, column or neighbours."""

    def __init__(self, embedding: BoardEmbedding):
        super().__init__()
        self.embedding, self.is_cell = embedding, torch.from_numpy(embedding.is_cell)
        self.num_embeddings = embedding.num_embeddings  # read by the engine's context check
        self.cell = int(self.is_cell.nonzero()[0, 0])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = torch.where(self.is_cell.to(input_ids.device)[input_ids], self.cell, input_ids)
        return torch.nn.functional.embedding(ids, self.embedding.weight)


def blind(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose input carries no information about the board (module docstring)."""
    blind_model = copy.deepcopy(model)
    if hasattr(blind_model.model, "visual"):
        last = blind_model.model.visual.merger.mlp[-1]
        torch.nn.init.zeros_(last.weight)
        torch.nn.init.zeros_(last.bias)
    else:
        blind_model.model.embed_tokens = BlindBoard(blind_model.model.embed_tokens)
    return blind_model


# The env each model is measured on: its shipped warm default there (model name, source, modality).
POLICIES = {
    "sokoban_visual": ("tiny_vl", "tiny_vl", "vision"),
    "sokoban_text": ("tiny_text", "tiny_text_warm", "text"),
    "frozenlake_text": ("tiny_text", "tiny_text_holes", "text"),
}


def make_game(env: str):
    if POLICIES[env][2] == "text":
        return make_text_game(env)
    kwargs = {"observation": "image", "dim_room": (6, 6), "num_boxes": 1, "tile_px": 28, "max_turns": 5}
    return make_env("vagen/Sokoban-v0", **kwargs, max_actions_per_turn=3)


def measure(model, policy, env: str, seeds: list[int], group_size: int, seed: int) -> dict[str, dict[str, float]]:
    formatter = DialogueFormatter(policy.tokenizer, policy.image_processor)
    spec = RolloutSpec(group_seeds=seeds, group_size=group_size, max_context_tokens=2048, env_name=env)
    make = lambda: make_game(env)
    sampling = SamplingParams(max_new_tokens=48, temperature=1.0, seed=seed)
    trajectories = collect_rollouts(make, HFEngine(model, policy.processor), formatter, spec, sampling)
    out = {}
    for scope in ("first_turn", "trajectory"):
        job = build_scoring_job(trajectories, policy.tokenizer, scope, 16, 64, np.random.default_rng(seed))
        if not job.reasonings:  # no response held a parseable <think> block: nothing to score
            out[scope] = None
            continue
        scores, lengths = cross_scores(model, policy.processor, job, micro_batch=32)
        values, _ = mi_metrics(scores, lengths, job.source(), prompt_ids=job.prompt_ids())
        out[scope] = {name: float(value) for name, value in values.items()}
    return out


def main() -> None:
    torch.manual_seed(0)
    defaults = {"env": "sokoban_visual", "groups": 16, "group_size": 4, "seed": 0}
    options, _ = script_options(sys.argv[1:], defaults, overrides=False)
    env, groups, group_size, seed = options.env, options.groups, options.group_size, options.seed
    if env not in POLICIES:
        raise SystemExit(f"Unknown env {env!r}; choose one of {', '.join(POLICIES)}.")
    name, source, modality = POLICIES[env]
    policy = load_policy(name, source, modality, size="default", dtype="float32")
    seeds = [10**9 + k for k in range(groups)]  # held-out evaluation seeds
    results = {
        "healthy": measure(policy.model, policy, env, seeds, group_size, seed),
        "collapsed": measure(blind(policy.model), policy, env, seeds, group_size, seed),
    }
    header = ("scope", "policy", "MI-Est/token", "log B", "MI-Est / log B", "H(Z|X)/token", "0.1·log B", "0.1·first MI")
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for scope in ("first_turn", "trajectory"):
        first = results["healthy"][scope]
        h_threshold = 0.5 * first["h_cond_est"]
        for name, metrics in results.items():
            if metrics[scope] is None:
                print(f"| {scope} | {name} | no parseable reasoning: nothing to score |  |  |  |  |  |")
                continue
            mi, ceiling, h = metrics[scope]["mi_est"], metrics[scope]["mi_upper_bound"], metrics[scope]["h_cond_est"]
            old = classify_regime(mi, h, FRACTION * ceiling, h_threshold)
            calibrated = classify_regime(mi, h, FRACTION * first["mi_est"], h_threshold)
            row = (scope, name, f"{mi:.4f}", f"{ceiling:.3f}", f"{mi / ceiling:.4f}", f"{h:.3f}", old, calibrated)
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
