"""The gradient noise scale of a learner's update at its current weights (`research/grad_noise.py`).

Plays `groups` prompt groups as training would, computes the update's gradient on each group alone (the learner's own
loss, advantages from the whole measured batch; `Learner.score` and `Learner.gradient`), and feeds fold sums of them to
`vagen.diagnostics.gradient_noise`, for all trainable weights and, for a vision model, for the vision tower and the
language model apart. With `split_tokens`, also for the update's loss restricted to each turn's reasoning (the
sampled tokens before `</think>`) and to the rest (the answer and its tags): where in the text the noise is. No weight
changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from vagen.diagnostics.gradient_noise import gradient_noise
from vagen.engines import SamplingParams
from vagen.rollout import TokenBatch, trajectories_to_batch
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


def reasoning_mask(input_ids: torch.Tensor, response_mask: torch.Tensor, tokenizer: Any) -> torch.Tensor:
    """[B, T] 1 on the sampled tokens of each response (a run of `response_mask`) that come before the token which
    completes `</think` (or `<answer`, for a response that never closes its reasoning); 0 elsewhere."""
    out = torch.zeros_like(response_mask)
    for row, (ids, sampled) in enumerate(zip(input_ids.tolist(), response_mask.tolist(), strict=True)):
        text, reasoning = "", True
        for position, (token, on) in enumerate(zip(ids, sampled, strict=True)):
            if not on:
                text, reasoning = "", True  # the next sampled token starts a new response
                continue
            text += tokenizer.decode([token])
            reasoning = reasoning and "</think" not in text and "<answer" not in text
            out[row, position] = float(reasoning)
    return out


def measure_gradient_noise(
    learner: Learner,
    sampling: SamplingParams,
    group_seeds: list[int],
    folds: int,
    progress: Callable[[str], None] = lambda line: None,
    split_tokens: bool = False,
) -> dict[str, Any]:
    """Rollouts of `group_seeds` with `sampling` (trainer.group_size each, trainer.groups per rollout call, as in
    training), then the noise scale per parameter block; see `vagen.diagnostics.gradient_noise` for what each number
    means. `progress` receives a line after each rollout call and every `trainer.groups` group gradients.

    `split_tokens`: also `token_classes`, the noise scale of all weights for the loss on the reasoning tokens only
    and on the answer tokens only (`reasoning_mask`), each with its sampled tokens per episode and their mean
    -log-prob (the entropy they were sampled at). With a token-sum loss (`algorithm.loss_agg=seq-mean-token-sum-norm`)
    the two classes' gradients add up to the whole loss's; with a token-mean loss each is its own mean."""
    if folds < 2 or len(group_seeds) < max(folds, 3):
        raise ValueError(f"need at least 3 groups and 2 folds with a group each; got {len(group_seeds)} and {folds}")
    per_call = learner.cfg.trainer.groups
    trajectories = []
    for start in range(0, len(group_seeds), per_call):
        trajectories += learner.collect(group_seeds[start : start + per_call], sampling, first_group_id=start)
        progress(f"rollouts: {min(start + per_call, len(group_seeds))}/{len(group_seeds)} groups")
    batch = learner.score(trajectories_to_batch(trajectories, pad_token_id=learner.tokenizer.pad_token_id or 0))
    groups = len(group_seeds)
    dots, fold_sizes, square_norms = _fold_gradients(learner, batch, groups, folds, progress)
    returns = group_returns(trajectories, groups, learner.cfg.trainer.group_size)
    result = {
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
    if split_tokens:
        reasoning = reasoning_mask(batch.input_ids, batch.response_mask, learner.tokenizer)
        result["token_classes"] = {}
        for name, mask in {"reasoning": reasoning, "answer": batch.response_mask - reasoning}.items():
            progress(f"{name} tokens:")
            class_dots, _, class_norms = _fold_gradients(
                learner, replace(batch, response_mask=mask), groups, folds, progress
            )
            result["token_classes"][name] = {
                "tokens_per_episode": float(mask.sum() / len(batch)),
                "neg_logprob_mean": float(-(batch.old_logprobs * mask).sum() / mask.sum().clamp(min=1)),
                **gradient_noise(class_dots.sum(-1), fold_sizes, class_norms.sum(-1), per_call),
            }
    return result


def _fold_gradients(
    learner: Learner, batch: TokenBatch, groups: int, folds: int, progress: Callable[[str], None]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per parameter p: dots[i, j, p] = F_i . F_j (the folds' sums of group gradients, restricted to p), the folds'
    sizes, and square_norms[k, p], the sum of the squared group-gradient norms in fold k. Groups are
    `batch.group_index` 0..groups-1, in folds of consecutive groups."""
    per_call = learner.cfg.trainer.groups
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
    dots = torch.stack([torch.stack([_per_parameter_dots(fi, fj) for fj in fold_sums]) for fi in fold_sums])
    return dots, fold_sizes, square_norms


def _add(sums: list[torch.Tensor], gradient: list[torch.Tensor]) -> list[torch.Tensor]:
    return [total + g for total, g in zip(sums, gradient, strict=True)]


def _per_parameter_dots(first: list[torch.Tensor], second: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([(a * b).sum() for a, b in zip(first, second, strict=True)]).cpu()
