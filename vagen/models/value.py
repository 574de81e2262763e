"""The critic: a copy of the policy's backbone with a scalar value head."""

from __future__ import annotations

import copy

import torch


class ValueModel(torch.nn.Module):
    """V(s_t) for every position, from a separate copy of the policy backbone (PPO's critic).

    A separate copy (not a head on the shared backbone) keeps value-loss gradients out of the
    policy, as in RAGEN/verl's PPO. `.model` and `.config` mirror a transformers model so the same
    input preparation (mRoPE positions, pixels) serves both.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        backbone = getattr(policy, "model", None)
        if backbone is None:
            raise ValueError(f"{type(policy).__name__} has no `.model` backbone to build a critic from.")
        self.model = copy.deepcopy(backbone)
        self.config = policy.config
        hidden = policy.get_output_embeddings().in_features
        self.value_head = torch.nn.Linear(hidden, 1)
        # Zero init: V = 0 everywhere until the learner starts it at its first batch's mean return (`start_at`).
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self.value_head.to(next(self.model.parameters()).dtype)

    def untrained(self) -> bool:
        """Whether the value head is still all zeros (V = 0 for every state): never started nor trained. A checkpoint
        restores a trained head, so a resumed run is never started again."""
        return not any(bool(p.detach().any()) for p in self.value_head.parameters())

    @torch.no_grad()
    def start_at(self, value: float) -> None:
        """V = `value` for every state (the head's bias; its weight stays zero): a data-dependent start at the mean
        return, as one starts a regression's last bias at its targets' mean."""
        self.value_head.bias.fill_(value)
