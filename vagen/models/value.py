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
        # Zero init: the first values are 0, so early advantages are plain reward-to-go.
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self.value_head.to(next(self.model.parameters()).dtype)
