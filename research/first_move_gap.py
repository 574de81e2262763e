"""Has the policy learned a level's first move only on the levels its demonstrations came from, or nowhere?
`python research/first_move_gap.py models=tiny_vl,<model or run folder>,... [env=sokoban_visual] [levels=256]`

The first-move probe (`vagen.rollout.move_probe`: the policy is teacher-forced the demonstration's reading of the
start, and its preference among the game's one-move responses is read) on two sets of starts: the first `levels`
training levels (seeds 0, 1, ...: the warm starts' and `algorithm.sft_coef`'s demonstrations are the solver's play
of these) and `levels` held-out levels that no validation plays (seeds 1e9 + `offset` + k, the levels of
`scripts/evaluate.py seed_offset=256`). Per bin of the levels' solver distance it prints each set's mean mass on the
solver-optimal first moves, with its 95% interval, and the share of starts whose preferred move is optimal. A model
that fits its demonstrations without generalising scores higher on the training levels; a decision it has not
learned scores low on both.

Options:
  models=A,B,...  configs/model names or model / run folders (as scripts/evaluate.py's model=)
  env=NAME        a configs/env name whose game the probe can score (default sokoban_visual)
  levels=N        starts per set (256)
  offset=N        the held-out starts' seeds are 1e9 + offset + k (256)
  min_levels=N    the fewest held-out levels per distance bin (16)
"""

from __future__ import annotations

import functools
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from vagen.cli import script_options
from vagen.diagnostics.move_preference import move_preferences, optimal_mass
from vagen.env import make_env
from vagen.env.policies import solver_distance
from vagen.eval.models import load_local_policy, resolve_models
from vagen.eval.runner import load_env_config
from vagen.rollout import DialogueFormatter
from vagen.rollout.move_probe import check_probeable, probe_states
from vagen.rollout.validation import distance_bins, eval_seeds, mean_interval

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = {"models": "", "env": "sokoban_visual", "levels": 256, "offset": 256, "min_levels": 16}


def mean_text(values: list[float]) -> str:
    """The mean and its normal 95% interval: `0.712 [0.680, 0.744]`."""
    mean, low, high = mean_interval(values)
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def gap_table(results: dict[str, dict[int, tuple[float, bool]]], distances: dict[int, int], min_levels: int) -> str:
    """The markdown table of one model: per distance bin (from the held-out levels), each set's levels, mean optimal
    mass [95% CI] and share of starts whose preferred move is optimal. `results` maps a set's name to each start's
    (optimal mass, preferred move optimal)."""
    names = list(results)
    held_out = results[names[-1]]
    head = " | ".join(f"{name}: levels, optimal mass, preferred optimal" for name in names)
    lines = [f"| solver distance | {head} |", "|---|" + "---|" * len(names)]
    for low, high in distance_bins([distances[seed] for seed in held_out], min_levels):
        cells = []
        for name in names:
            inside = [value for seed, value in results[name].items() if low <= distances[seed] <= high]
            if not inside:
                cells.append("0, —, —")
                continue
            masses, preferred = [mass for mass, _ in inside], [top for _, top in inside]
            cells.append(f"{len(inside)}, {mean_text(masses)}, {statistics.fmean(preferred):.0%}")
        span = f"{low}" if low == high else f"{low}–{high}"
        lines.append(f"| {span} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    options, _ = script_options(argv, DEFAULTS, overrides=False, required={"models": "tiny_vl,<model folder>"})
    env_cfg = load_env_config(options.env, ROOT / "configs", overrides={})
    make = functools.partial(make_env, env_cfg["id"], **env_cfg["kwargs"])
    env = make()
    check_probeable(env)
    engine = OmegaConf.load(ROOT / "configs" / "engine" / "hf.yaml")
    specs = resolve_models(str(options.models).split(","), engine, ROOT / "configs", {})
    sets = {
        f"training levels 0–{options.levels - 1}": list(range(options.levels)),
        f"held-out levels 1e9 + {options.offset}…": eval_seeds(options.levels, options.offset),
    }
    distances = {seed: solver_distance(env, seed) for seeds in sets.values() for seed in seeds}
    env.close()
    torch.set_grad_enabled(False)
    for spec in specs:
        policy = load_local_policy(spec, "cuda" if torch.cuda.is_available() else "cpu")
        formatter = DialogueFormatter(policy.tokenizer, policy.image_processor)
        results = {}
        for name, seeds in sets.items():
            states = probe_states(make, formatter, seeds)
            optimal = np.array([state.optimal for state in states])
            preferences = move_preferences(policy.model, policy.image_processor or policy.tokenizer, states)
            masses = optimal_mass(preferences, optimal)
            preferred = optimal[np.arange(len(states)), preferences.argmax(axis=1)]
            results[name] = {
                state.seed: (float(mass), bool(top)) for state, mass, top in zip(states, masses, preferred, strict=True)
            }
        print(f"\n{spec.label} on {options.env} (the first-move probe; starts already solved left out)\n")
        print(gap_table(results, distances, options.min_levels), flush=True)
        del policy


if __name__ == "__main__":
    main(sys.argv[1:])
