"""The trajectory record that the trainer, diagnostics, GIFs and benchmarks all read.

A trajectory is a list of segments of token ids, each either *context* (system prompt, chat
template, observations: loss mask 0) or *sampled* (the engine's exact output ids: loss mask 1).
Training reads these ids directly: nothing is decoded and re-tokenised (token-in/token-out), and
the loss mask is 1 exactly on sampled tokens because it is built at generation time.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image


@dataclass
class Turn:
    """One turn: what the policy was shown, what it sampled, and what the environment answered.

    `prompt_ids` are the context tokens added before this turn's response (observation and chat
    template; for the first turn the whole initial prompt). `close_ids` are template tokens that
    end the assistant message after the response (e.g. `<|im_end|>\\n` minus whatever the engine
    already sampled). `images` are the images `prompt_ids` refers to, in order.
    """

    observation: str
    images: list[Image.Image]
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    response_text: str = ""
    finish_reason: str = ""
    close_ids: list[int] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    state_key: Hashable | None = None  # the env's `state_key()` when this turn's observation was made (GiGPO)


@dataclass
class Trajectory:
    """One episode of one environment. `group_id` ties together the N rollouts of one initial state."""

    group_id: int
    seed: int
    env_name: str
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    end_reason: str = ""
    # The state the episode ended in: the observation after the last turn (GIFs draw it; never trained on).
    final_observation: str = ""
    final_images: list[Image.Image] = field(default_factory=list)

    @property
    def total_reward(self) -> float:
        return float(sum(turn.reward for turn in self.turns))

    @property
    def success(self) -> bool:
        return bool(self.turns and self.turns[-1].info.get("success", False))

    @property
    def images(self) -> list[Image.Image]:
        return [image for turn in self.turns for image in turn.images]

    def token_ids_and_mask(self) -> tuple[list[int], list[int]]:
        """The whole dialogue as token ids, and the loss mask (1 exactly on sampled ids)."""
        ids: list[int] = []
        mask: list[int] = []
        for turn in self.turns:
            for segment, sampled in ((turn.prompt_ids, 0), (turn.response_ids, 1), (turn.close_ids, 0)):
                ids.extend(segment)
                mask.extend([sampled] * len(segment))
        return ids, mask

    def response_spans(self) -> list[tuple[int, int]]:
        """(start, end) positions of each turn's sampled ids in `token_ids_and_mask()`'s sequence."""
        spans, position = [], 0
        for turn in self.turns:
            position += len(turn.prompt_ids)
            spans.append((position, position + len(turn.response_ids)))
            position += len(turn.response_ids) + len(turn.close_ids)
        return spans

    def sampled_logprobs(self) -> list[float]:
        """The engine's log-probs of every sampled id, in sequence order."""
        return [logprob for turn in self.turns for logprob in turn.response_logprobs]
