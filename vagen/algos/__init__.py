"""Pure tensor algorithms of StarPO: advantage estimators, policy/value losses, KL, entropy, aggregation.

Tensors and masks in, tensors out: no model, environment, config object, I/O or logging here.
"""

from vagen.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    masked_mean,
    masked_var,
    masked_whiten,
    turn_end_mask,
    turn_ids_from_mask,
)
from vagen.algos.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    aggregate_loss,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    policy_loss,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "AdvantageInputs",
    "AdvantageParams",
    "aggregate_loss",
    "entropy_from_logits",
    "explained_variance",
    "kl_penalty",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "turn_end_mask",
    "turn_ids_from_mask",
    "value_loss",
]
