"""Multi-turn rollouts: context building, the agent loop, trajectories and training batches."""

from vagen.rollout.batch import TokenBatch, reasoning_mask, trajectories_to_batch
from vagen.rollout.context import DialogueFormatter
from vagen.rollout.loop import RolloutSpec, collect_rollouts
from vagen.rollout.trajectory import Trajectory, Turn

__all__ = [
    "DialogueFormatter",
    "RolloutSpec",
    "TokenBatch",
    "Trajectory",
    "Turn",
    "collect_rollouts",
    "reasoning_mask",
    "trajectories_to_batch",
]
