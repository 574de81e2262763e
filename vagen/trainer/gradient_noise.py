"""The gradient noise scale of a learner's update at its current weights (`research/grad_noise.py`).

Plays `groups` prompt groups as training would, computes the update's gradient on each group alone (the learner's own
loss, advantages from the whole measured batch; `Learner.score` and `Learner.gradient`), and feeds fold sums of them to
`vagen.diagnostics.gradient_noise`, for all trainable weights and, for a vision model, for the vision tower and the
language model apart. No weight changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vagen.diagnostics.gradient_noise import gradient_noise
from vagen.engines import SamplingParams
from vagen.rollout import trajectories_to_batch
from vagen.trainer.learner import Learner
from vagen.trainer.starpo import group_returns


def parameter_blocks(learner: Learner) -> dict[str, torch.Tensor]:
    """Boolean masks over `learner.trainable_parameters()`: all, and for a vision model vision / language."""
    vision = {id(p) for p in learner.vision_parameters}
    is_vision = torch.tensor([id(p) in vision for p in learner.trainable_parameters()])
    blocks = {"all": torch.ones_like(is_vision)}
    if is_vision.any() and not is_vision.all():
        blocks |= {"vision": is_vision, "language": ~is_vision}
    return blocks


def measure_gradient_noise(
    learner: Learner,
    sampling: SamplingParams,
    group_seeds: list[int],
    folds: int,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Rollouts of `group_seeds` with `sampling` (trainer.group_size each, trainer.groups per rollout call, as in
    training), then the
    noise scale per parameter block; see `vagen.diagnostics.gradient_noise` for what each number means. `progress`
    receives a line after each rollout call and every `trainer.groups` group gradients."""
    if folds < 2 or len(group_seeds) < max(folds, 3):
        raise ValueError(f"need at least 3 groups and 2 folds with a group each; got {len(group_seeds)} and {folds}")
    per_call = learner.cfg.trainer.groups
    trajectories = []
    for start in range(0, len(group_seeds), per_call):
        trajectories += learner.collect(group_seeds[start : start + per_call], sampling, first_group_id=start)
        progress(f"rollouts: {min(start + per_call, len(group_seeds))}/{len(group_seeds)} groups")
    batch = learner.score(trajectories_to_batch(trajectories, pad_token_id=learner.tokenizer.pad_token_id or 0))
    groups = len(group_seeds)
    # Per parameter: the folds' gradient sums and each fold's sum of squared group-gradient norms.
    fold_sums: list[list[torch.Tensor] | None] = [None] * folds
    square_norms = torch.zeros(folds, len(learner.trainable_parameters()), dtype=torch.float64)
    fold_sizes = torch.zeros(folds)
    for position in range(groups):
        fold = position * folds // groups
        gradient = learner.gradient(batch, torch.nonzero(batch.group_index == position).flatten())
        square_norms[fold] += torch.stack([g.double().pow(2).sum() for g in gradient]).cpu()
        fold_sizes[fold] += 1
        sums = fold_sums[fold]
        fold_sums[fold] = [g.double() for g in gradient] if sums is None else _add(sums, gradient)
        if (position + 1) % per_call == 0 or position + 1 == groups:
            progress(f"gradients: {position + 1}/{groups} groups")
    # dots[i, j, p] = F_i . F_j restricted to parameter p; a block's Gram matrix sums its parameters.
    dots = torch.stack([torch.stack([_per_parameter_dots(fi, fj) for fj in fold_sums]) for fi in fold_sums])
    returns = group_returns(trajectories, groups, learner.cfg.trainer.group_size)
    return {
        "groups": groups,
        "group_size": learner.cfg.trainer.group_size,
        "batch_groups": per_call,
        "success": sum(bool(t.success) for t in trajectories) / len(trajectories),
        "groups_with_reward_spread": int((returns.amax(1) > returns.amin(1)).sum()),
        "blocks": {
            name: gradient_noise(dots[:, :, mask].sum(-1), fold_sizes, square_norms[:, mask].sum(-1), per_call)
            for name, mask in parameter_blocks(learner).items()
        },
    }


def _add(sums: list[torch.Tensor], gradient: list[torch.Tensor]) -> list[torch.Tensor]:
    return [total + g for total, g in zip(sums, gradient, strict=True)]


def _per_parameter_dots(first: list[torch.Tensor], second: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([(a * b).sum() for a, b in zip(first, second, strict=True)]).cpu()
