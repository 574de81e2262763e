"""Which first move each model prefers on the same held-out states, teacher-forced (vagen/rollout/move_probe.py).

    python scripts/move_probe.py models=tiny_vl,outputs/runs/<run>[,more models] [env=sokoban_visual] [states=256]
                                 [json=FILE]

    models   comma-separated configs/model names, run folders or checkpoint folders; required
    env      a configs/env name (default sokoban_visual)
    states   held-out seeds to probe (default 256)
    json     also write the results to this JSON file

A model is a configs/model name, a training run folder (its latest checkpoint) or a checkpoint folder, as for
scripts/evaluate.py. States are the evaluator's held-out seeds 1e9 + k with something to decide. Prints each model's
mass on solver-optimal first moves (given the demonstration's reading of the state), the share of states where its
preferred move is optimal, chance, and every model's paired change of that mass against the first model's.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from vagen.cli import script_options
from vagen.diagnostics.move_preference import move_preferences, optimal_mass, probe_summary
from vagen.env import make_env
from vagen.eval import paired_change
from vagen.eval.models import load_local_policy, resolve_models
from vagen.eval.runner import incompatibility, load_env_config
from vagen.rollout import DialogueFormatter
from vagen.rollout.move_probe import check_probeable, probe_states
from vagen.rollout.validation import eval_seeds

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def load_models(entries: list[str], env_cfg: dict) -> list:
    """The specs of `entries` (local models only), each checked against the env, before any weights load."""
    specs = resolve_models(entries, OmegaConf.create({"name": "hf"}), CONFIG_DIR, {})
    for spec in specs:
        if spec.kind != "local":
            raise ValueError(f"{spec.label} is a built-in policy; the probe scores a model's log-probs.")
        reason = incompatibility(spec, env_cfg)
        if reason:
            raise ValueError(f"{spec.label} cannot play env={env_cfg['name']}: {reason}.")
    return specs


def main(argv: list[str] | None = None) -> None:
    defaults = {"models": "", "env": "sokoban_visual", "states": 256, "json": ""}
    example = {"models": "tiny_vl,outputs/runs/<run>"}
    options, _ = script_options(sys.argv[1:] if argv is None else argv, defaults, overrides=False, required=example)
    models = [model for model in options.models.split(",") if model]
    try:
        env_cfg = load_env_config(options.env, CONFIG_DIR, {})
        specs = load_models(models, env_cfg)
        make = functools.partial(make_env, env_cfg["id"], **env_cfg["kwargs"])
        check_probeable(make())
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    results, first = {}, None
    for spec in specs:
        policy = load_local_policy(spec, "cuda" if torch.cuda.is_available() else "cpu")
        formatter = DialogueFormatter(policy.tokenizer, policy.image_processor)
        states = probe_states(make, formatter, eval_seeds(options.states))
        optimal = np.array([state.optimal for state in states])
        preferences = move_preferences(policy.model, policy.image_processor or policy.tokenizer, states)
        summary = probe_summary(preferences, optimal)
        masses = dict(zip((state.seed for state in states), optimal_mass(preferences, optimal), strict=True))
        line = (
            f"{spec.label}: mass on optimal first moves {summary['optimal_mass']:.3f}, preferred move optimal "
            f"{summary['top_optimal']:.1%} (chance {summary['chance']:.3f}; {len(states)} states)"
        )
        if first is None:
            first = (spec.label, masses)
        else:
            assert masses.keys() == first[1].keys(), "every model reads the same states"
            change, low, high, _ = paired_change(first[1], masses)
            summary |= {"change_vs_first": change, "change_ci": [low, high]}
            line += f"; paired change vs {first[0]}: {change:+.3f} [{low:+.3f}, {high:+.3f}]"
        print(line, flush=True)
        results[spec.label] = summary
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
