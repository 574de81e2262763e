"""Did a run's weights drift somewhere, or random-walk? `python research/weight_drift.py runs=<run dir>[,<run dir>...]`

For each run: its latest checkpoint's trained weights w_T against the warm start w_0, and the length of the path
that led there, from the logged `policy/update_norm` (u_t = |w_t − w_{t−1}| / |w_{t−1}|, so the path's squared
length is about |w_0|² Σ u_t², the weights' norm changing by a few percent at most). Their ratio

    R(T) = |w_T − w_0|² / Σ_t |w_t − w_{t−1}|²

is 1 for steps in independent random directions and T for steps that all point the same way. Adam's momentum makes
neighbouring steps alike even on pure noise, so the reference is R for the same optimizer on pure noise (the null:
Adam with the run's betas and optimizer steps per iteration on independent Gaussian gradients). R near the null:
the weights have random-walked, each update's signal too small to add up; R well above it: they drifted somewhere.
R below it: something pulled them back (a KL to the warm start, or curvature).

Reads each run's `config.yaml`, `metrics.jsonl` and latest checkpoint; loads the warm start as the trainer did.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from vagen.cli import script_options
from vagen.logging.sinks import read_metrics
from vagen.models.registry import load_policy
from vagen.trainer.checkpoint import latest_checkpoint
from vagen.trainer.learner import is_vision_weight

DEFAULTS = {"runs": ""}


def drift_ratio(distance_sq: float, step_sq: list[float]) -> float:
    """R = |w_T − w_0|² / Σ |w_t − w_{t−1}|²."""
    return distance_sq / sum(step_sq)


def adam_noise_ratio(iterations: int, steps_per_iteration: int, betas=(0.9, 0.999), dim: int = 20000, seed: int = 0):
    """R(T) at T = `iterations` for AdamW (no weight decay) on independent standard-normal gradients."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.zeros(dim, requires_grad=True)
    optimizer = torch.optim.AdamW([weights], lr=1e-3, betas=betas, weight_decay=0.0)
    start, step_sq = weights.detach().clone(), []
    for _ in range(iterations):
        before = weights.detach().clone()
        for _ in range(steps_per_iteration):
            weights.grad = torch.randn(dim, generator=generator)
            optimizer.step()
        step_sq.append(float((weights.detach() - before).pow(2).sum()))
    return drift_ratio(float((weights.detach() - start).pow(2).sum()), step_sq)


def run_drift(run_dir: Path) -> dict:
    cfg = OmegaConf.load(run_dir / "config.yaml")
    if cfg.trainer.lora.enabled:
        raise ValueError(f"{run_dir}: a LoRA run trains adapters, not the weights compared here.")
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ValueError(f"{run_dir} has no complete checkpoint; train it first.")
    trained = load_file(checkpoint / "modules" / "policy.safetensors")
    model = cfg.model
    start = load_policy(model.name, model.source, model.modality, path=model.path, size=model.size).model.state_dict()
    names = [n for n in trained if not (cfg.trainer.freeze_vision and is_vision_weight(n))]
    start_sq = sum(float(start[n].double().pow(2).sum()) for n in names)
    distance_sq = sum(float((trained[n].double() - start[n].double()).pow(2).sum()) for n in names)
    iteration = int(checkpoint.name.removeprefix("iter_"))
    norms = {int(r["step"]): r["policy/update_norm"] for r in read_metrics(run_dir) if "policy/update_norm" in r}
    missing = [t for t in range(1, iteration + 1) if t not in norms]
    if missing:
        raise ValueError(f"{run_dir}: no policy/update_norm logged for iterations {missing[:5]}.")
    step_sq = [start_sq * norms[t] ** 2 for t in range(1, iteration + 1)]
    episodes = int(cfg.trainer.groups) * int(cfg.trainer.group_size)
    steps = int(cfg.trainer.ppo_epochs) * math.ceil(episodes / int(cfg.trainer.mini_batch_size))
    ratio = drift_ratio(distance_sq, step_sq)
    null = adam_noise_ratio(iteration, steps)
    return {
        "run": run_dir.name,
        "iteration": iteration,
        "distance": math.sqrt(distance_sq / start_sq),
        "path": math.sqrt(sum(step_sq) / start_sq),
        "ratio": ratio,
        "null": null,
    }


def main(argv: list[str]) -> None:
    options, _ = script_options(argv, DEFAULTS, overrides=False, required={"runs": "outputs/runs/<run>"})
    rows = [run_drift(Path(run)) for run in options.runs.split(",") if run]
    print("| run | iteration | \\|w_T − w_0\\| / \\|w_0\\| | path length / \\|w_0\\| | R | R of Adam on pure noise |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['run']} | {r['iteration']} | {r['distance']:.2e} | {r['path']:.2e} | {r['ratio']:.2f} | "
            f"{r['null']:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
