"""`scripts/evaluate.py mode=move_probe`: which first move each model prefers on the same held-out states.

The states are the evaluator's held-out seeds 1e9 + k with something to decide (`vagen.rollout.move_probe`); each
model is teacher-forced the demonstration's reading of the state, and the probe reads its distribution over the
game's moves (`vagen.diagnostics.move_preference`). Every model after the first gets its paired change of mass on
the solver-optimal moves against the first.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from vagen.diagnostics.move_preference import RARELY, move_preferences, optimal_mass, probe_summary
from vagen.env import make_env
from vagen.eval.models import ModelSpec, load_local_policy
from vagen.eval.runner import incompatibility, resolve_cells
from vagen.rollout import DialogueFormatter
from vagen.rollout.move_probe import check_probeable, probe_states
from vagen.rollout.validation import eval_seeds, paired_change


def probe_setup(cfg: DictConfig, config_dir: Path) -> tuple[list[ModelSpec], list[dict[str, Any]]]:
    """The local models and probeable envs of `cfg`, each checked before any weights load (ValueError names
    what cannot be probed)."""
    specs, env_cfgs = resolve_cells(cfg, config_dir)
    for spec in specs:
        if spec.kind != "local":
            raise ValueError(f"{spec.label} is a built-in policy or a served model; the probe scores a local model.")
        for env_cfg in env_cfgs:
            reason = incompatibility(spec, env_cfg)
            if reason:
                raise ValueError(f"{spec.label} cannot play env={env_cfg['name']}: {reason}.")
    for env_cfg in env_cfgs:
        env = make_env(env_cfg["id"], **env_cfg["kwargs"])
        try:
            check_probeable(env)
        finally:
            env.close()
    return specs, env_cfgs


def probe_moves(cfg: DictConfig, config_dir: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each (env, model)'s probe summary on the first `cfg.episodes` held-out states, written to
    out_dir/move_probe.json, and the lines to print."""
    specs, env_cfgs = probe_setup(cfg, config_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results, lines, first_masses = {}, [], {}
    for spec in specs:  # each model loads once and is probed on every env
        policy = load_local_policy(spec, device)
        formatter = DialogueFormatter(policy.tokenizer, policy.image_processor)
        for env_cfg in env_cfgs:
            make = functools.partial(make_env, env_cfg["id"], **env_cfg["kwargs"])
            states = probe_states(make, formatter, eval_seeds(int(cfg.episodes)))
            optimal = np.array([state.optimal for state in states])
            preferences = move_preferences(policy.model, policy.image_processor or policy.tokenizer, states)
            summary = probe_summary(preferences, optimal)
            masses = dict(zip((state.seed for state in states), optimal_mass(preferences, optimal), strict=True))
            line = (
                f"{spec.label} on {env_cfg['name']}: mass on optimal first moves {summary['optimal_mass']:.3f}, "
                f"preferred move optimal {summary['top_optimal']:.1%}, optimal mass below {RARELY} in "
                f"{summary['rarely_optimal']:.1%} of states (chance {summary['chance']:.3f}; "
                f"{len(states)} states)"
            )
            if spec is specs[0]:
                first_masses[env_cfg["name"]] = masses
            else:
                change, low, high, _ = paired_change(first_masses[env_cfg["name"]], masses)
                summary |= {"change_vs_first": change, "change_ci": [low, high]}
                line += f"; paired change vs {specs[0].label}: {change:+.3f} [{low:+.3f}, {high:+.3f}]"
            lines.append(line)
            results.setdefault(env_cfg["name"], {})[spec.label] = summary
        del policy
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "move_probe.json").write_text(json.dumps(results, indent=1))
    return results, lines
