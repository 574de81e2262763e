"""Trajectories → padded training tensors, reading the exact sampled ids (token-in/token-out).

Position convention used everywhere downstream: `logprobs[b, t]` is log π(input_ids[b, t] | input_ids[b, :t]),
so the loss mask, rewards and advantages all sit on the position of the sampled token itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
from PIL import Image

from vagen.rollout.trajectory import Trajectory

# A forward and backward's fixed cost, in positions: tiny_vl's on one thread, a row of 32 tokens took 34 ms where each
# further position cost 0.57 ms (so about 30 positions a pass; a micro-batch runs two, its prompts and its rests).
FORWARD_OVERHEAD = 64
# `algorithm.advantage_tokens`: every sampled token carries its turn's advantage, or the answer's (`reasoning_mask`)
ADVANTAGE_TOKENS = ("all", "answer")


@dataclass
class TokenBatch:
    """A right-padded batch of whole dialogues.

    input_ids      [B, T] long   the dialogue ids (context + sampled + template)
    attention_mask [B, T] long   1 on real tokens
    response_mask  [B, T] float  1 exactly on sampled tokens (the loss mask)
    token_rewards  [B, T] float  each turn's reward on that turn's last sampled token (a turn without sampled
                                tokens: on the previous turn's, or the next one's if it is the first)
    turn_ids       [B, T] long   turn index on sampled tokens, -1 elsewhere
    rollout_logprobs [B, T] float the engine's log-probs on sampled tokens, 0 elsewhere
    group_index    [B]    long   the group (initial state) of each dialogue
    returns        [B]    float  total reward of each dialogue
    images         B lists of PIL images, in the order their pad tokens appear
    turn_states    [B, T] long   anchor-state id on sampled tokens: equal ids mean the same group and the same env
                                `state_key()` at the start of the turn (any turn index); -1 without a key and elsewhere

    Training tensors, [B, T] float, None until the trainer computes them (`Learner.score`), so that
    `select` slices them together with the dialogue they belong to:
    old_logprobs   log π_old of sampled tokens      ref_logprobs   log π_ref (None without a KL term)
    old_values     critic values (None w/o critic) advantages      per-token advantages
    value_targets  the critic's regression targets (None without a critic)
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    token_rewards: torch.Tensor
    turn_ids: torch.Tensor
    rollout_logprobs: torch.Tensor
    group_index: torch.Tensor
    returns: torch.Tensor
    images: list[list[Image.Image]]
    turn_states: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    value_targets: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def prompt_lengths(self) -> torch.Tensor:
        """[B] long: each row's tokens before its first sampled one (its first prompt; 0 in a row without one)."""
        return (self.response_mask > 0).float().argmax(dim=1)

    def micro_batches(self, rows: torch.Tensor, size: int) -> list[torch.Tensor]:
        """`rows` in chunks of at most `size`, chosen to compute the fewest positions; the sum of the chunks' losses,
        and so the gradient, does not depend on the chunking.

        A chunk's forward (`vagen.forward.backbone_hidden`) runs each distinct first prompt once, left-padded to the
        chunk's longest prompt, and then every row's rest, right-padded to the chunk's longest rest. So a chunk of
        rows from g groups costs g · (longest prompt) + rows · (longest rest) positions, plus `FORWARD_OVERHEAD` for
        the call itself. The rows go longest rest first (a group's rows of equal length together) and are cut where
        that cost, summed over the chunks, is least (dynamic programming over the cut points).
        """
        rows = torch.as_tensor(rows, dtype=torch.long)
        prompts = self.prompt_lengths()[rows].tolist()
        lengths = self.attention_mask[rows].sum(dim=1).tolist()
        rests = [length - prompt for length, prompt in zip(lengths, prompts, strict=True)]
        groups = self.group_index[rows].tolist()
        order = sorted(range(len(rows)), key=lambda i: (-rests[i], groups[i], i))
        best, cut = [0.0] + [float("inf")] * len(order), [0] * (len(order) + 1)
        for end in range(1, len(order) + 1):
            seen, longest_prompt = set(), 0
            for start in range(end - 1, max(end - size, 0) - 1, -1):  # the chunk order[start:end], grown leftwards
                row = order[start]
                seen.add(groups[row])
                longest_prompt = max(longest_prompt, prompts[row])
                width = rests[row]  # the longest rest: the rows go longest first
                cost = best[start] + len(seen) * longest_prompt + (end - start) * width + FORWARD_OVERHEAD
                if cost < best[end]:
                    best[end], cut[end] = cost, start
        chunks, end = [], len(order)
        while end > 0:
            chunks.append(rows[torch.tensor(order[cut[end] : end], dtype=torch.long)])
            end = cut[end]
        return chunks[::-1]

    def select(self, rows: torch.Tensor | list[int]) -> TokenBatch:
        """The sub-batch of the given rows, trimmed to its longest dialogue."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        length = int(self.attention_mask[rows].sum(dim=1).max()) if len(rows) else 0
        sliced = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "images":
                sliced[field.name] = [value[i] for i in rows.tolist()]
            elif value is not None:
                sliced[field.name] = value[rows] if value.dim() == 1 else value[rows][:, :length]
        return replace(self, **sliced)


def trajectories_to_batch(trajectories: list[Trajectory], pad_token_id: int) -> TokenBatch:
    """Pad trajectories into a `TokenBatch`; raises if one has no sampled token (nothing to train on)."""
    if not trajectories:
        raise ValueError("No trajectories to batch.")
    rows = []
    for trajectory in trajectories:
        ids, mask = trajectory.token_ids_and_mask()
        if not any(mask):
            raise ValueError(
                f"Trajectory of group {trajectory.group_id} has no sampled token; it cannot be trained on."
            )
        rows.append((ids, mask, trajectory))
    width = max(len(ids) for ids, _, _ in rows)
    size = (len(rows), width)
    input_ids = torch.full(size, pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(size, dtype=torch.long)
    response_mask = torch.zeros(size)
    token_rewards = torch.zeros(size)
    turn_ids = torch.full(size, -1, dtype=torch.long)
    rollout_logprobs = torch.zeros(size)
    turn_states = torch.full(size, -1, dtype=torch.long)
    anchors: dict[tuple[int, object], int] = {}  # (group, state key) -> anchor-state id
    for b, (ids, mask, trajectory) in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention_mask[b, : len(ids)] = 1
        response_mask[b, : len(ids)] = torch.tensor(mask, dtype=torch.float)
        last_sampled, pending = None, 0.0  # a turn with no sampled token hands its reward to a neighbour
        for turn_index, ((start, end), turn) in enumerate(
            zip(trajectory.response_spans(), trajectory.turns, strict=True)
        ):
            turn_ids[b, start:end] = turn_index
            if turn.state_key is not None:
                turn_states[b, start:end] = anchors.setdefault((trajectory.group_id, turn.state_key), len(anchors))
            rollout_logprobs[b, start:end] = torch.tensor(turn.response_logprobs, dtype=torch.float)
            if end > start:
                last_sampled = end - 1
                token_rewards[b, last_sampled] += turn.reward + pending
                pending = 0.0
            elif last_sampled is not None:
                token_rewards[b, last_sampled] += turn.reward  # the last response that led here
            else:
                pending += turn.reward  # no response yet: the next one carries it
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        token_rewards=token_rewards,
        turn_ids=turn_ids,
        rollout_logprobs=rollout_logprobs,
        group_index=torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
        returns=torch.tensor([t.total_reward for t in trajectories], dtype=torch.float),
        images=[t.images for t in trajectories],
        turn_states=turn_states,
    )


def reasoning_mask(
    input_ids: torch.Tensor, turn_ids: torch.Tensor, decode: Callable[[list[int]], str], close: str = "</think>"
) -> torch.Tensor:
    """[B, T] bool: the sampled tokens of each turn up to and including the one whose text completes `close` (the
    reasoning), False elsewhere. A turn whose sampled text never closes its reasoning has none marked: all of it
    stays the answer's, malformed output included.

    input_ids, turn_ids: a `TokenBatch`'s (turn index on sampled tokens, -1 elsewhere). decode: token ids -> text
    (the policy's tokenizer). The token is found by bisection on the decoded prefixes, which only grow.
    """
    mask = torch.zeros(input_ids.shape, dtype=torch.bool)
    for b in range(input_ids.shape[0]):
        for turn in turn_ids[b][turn_ids[b] >= 0].unique().tolist():
            positions = (turn_ids[b] == turn).nonzero().flatten()
            ids = input_ids[b, positions].tolist()
            if close not in decode(ids):
                continue
            low, high = 1, len(ids)  # the shortest prefix that holds `close` has `high` tokens
            while low < high:
                middle = (low + high) // 2
                low, high = (low, middle) if close in decode(ids[:middle]) else (middle + 1, high)
            mask[b, positions[:high]] = True
    return mask
