"""Teacher-forced forward passes over a `TokenBatch`: log-probs, entropies and values of sampled tokens.

Shared by the trainer's update and the supervised warm starts (vagen.bootstrap), so that building a warm start never
needs the trainer.

Only the positions that predict a sampled token go through the LM head, so memory is
O(sampled tokens × vocab) instead of O(all tokens × vocab): observations and images can be long.

Rows that open with the same first prompt (a group's rollouts of one initial state: the same ids and the same
images up to the first sampled token) run that prefix once (`backbone_hidden`): its keys and values are shared by
every row that continues it, and backward sums each row's gradient into the one prefix, as the separate copies would.
The prompt is most of a dialogue (FrozenLake: 203 of 232 tokens; Sokoban: 257 of 491), so the batch's forward and
backward do that much less arithmetic; outputs and gradients agree with the per-row pass to float rounding
(tests/test_trainer.py::test_shared_first_prompts_run_once_and_give_the_whole_rows_numbers).
"""

from __future__ import annotations

from typing import Any

import torch

from vagen.algos.losses import entropy_from_logits
from vagen.models.checkpointing import checkpointed_layers
from vagen.models.inputs import (
    cache_inputs,
    image_key,
    image_model_inputs,
    output_cache,
    placeholder_token_ids,
    prompt_position_ids,
)
from vagen.rollout.batch import TokenBatch


def _backbone(model: torch.nn.Module) -> torch.nn.Module:
    backbone = getattr(model, "model", None)
    if backbone is None:
        raise ValueError(
            f"{type(model).__name__} has no `.model` backbone; use a transformers *ForCausalLM or "
            "*ForConditionalGeneration model."
        )
    return backbone


def model_inputs(model: torch.nn.Module, batch: TokenBatch, processor: Any | None) -> dict[str, torch.Tensor]:
    """Forward kwargs (ids, mask, positions, pixels) for a right-padded batch on the model's device."""
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    attention_mask = batch.attention_mask.to(device)
    inputs: dict[str, torch.Tensor] = {"input_ids": input_ids, "attention_mask": attention_mask}
    inputs.update(image_model_inputs(model, processor, [image for row in batch.images for image in row]))
    grid = inputs.get("image_grid_thw")
    inputs["position_ids"], _ = prompt_position_ids(model, input_ids, attention_mask, grid)
    if bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
        # Pads only at the ends of rows: under causal attention no real token sees a later pad, so the mask changes
        # nothing for them (bit-identical log-probs and gradients, tests/test_trainer.py), and without it the
        # attention kernel skips the masked half instead of computing and discarding it.
        inputs["attention_mask"] = None
    return inputs


def shared_prefix(model: torch.nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
    """How `backbone_hidden` shares first prompts: (one row per distinct prefix [P], each row's prefix [B], each row's
    images inside its prefix), or None where no two rows share one.

    A row's prefix is its tokens before its first sampled one; rows share it where they agree in every id and in the
    pixels of the images inside it."""
    sampled = batch.response_mask > 0
    if len(batch) < 2 or not bool(sampled.any(dim=1).all()):
        return None
    lengths = batch.prompt_lengths().tolist()
    image_id = getattr(model.config, "image_token_id", None)
    index, keys, images = [], {}, []
    for row, (ids, length) in enumerate(zip(batch.input_ids.tolist(), lengths, strict=True)):
        prefix = ids[:length]
        # one image per run of image tokens (the processor puts vision start / end tokens between two images)
        count = sum(1 for k, t in enumerate(prefix) if t == image_id and (k == 0 or prefix[k - 1] != image_id))
        pixels = tuple(image_key(image) for image in batch.images[row][:count])
        index.append(keys.setdefault((tuple(prefix), pixels), len(keys)))
        images.append(count)
    if len(keys) == len(batch):
        return None
    return torch.tensor([index.index(k) for k in range(len(keys))]), torch.tensor(index), images


def image_rows(inputs: dict[str, torch.Tensor], images_per_row: list[int], keep: list[tuple[int, int, int]]) -> dict:
    """`pixel_values` and `image_grid_thw` of some of a batch's images: `keep` lists (row, first, end) ranges of each
    row's images, in the output's order; {} when they hold none."""
    grid = inputs.get("image_grid_thw")
    first_of_row = [0]
    for count in images_per_row:
        first_of_row.append(first_of_row[-1] + count)
    chosen = [first_of_row[row] + k for row, begin, end in keep for k in range(begin, end)]
    if grid is None or not chosen:
        return {}
    offsets = [0]
    for count in grid.prod(dim=-1).tolist():
        offsets.append(offsets[-1] + count)
    pixel_rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in chosen]).to(grid.device)
    return {"pixel_values": inputs["pixel_values"][pixel_rows], "image_grid_thw": grid[torch.tensor(chosen)]}


def taken(positions: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """`positions` ([R, T], or [3, R, T] for mrope) at each row's columns `cols` [R, C]."""
    return positions.gather(-1, cols.expand(*positions.shape[:-1], cols.shape[-1]))


def backbone_hidden(
    model: torch.nn.Module, backbone: torch.nn.Module, batch: TokenBatch, processor: Any | None, share: bool = True
) -> torch.Tensor:
    """The last hidden states [B, T, H] of `backbone` (the policy's, or a critic's copy of it) over the batch, each
    distinct first prompt run once (`shared_prefix`; share=False runs every row whole).

    The prefixes run as one batch, left-padded to the longest, keeping their keys and values; each row then runs the
    rest of its dialogue after its own prefix's cache, and the two parts are put back in the row's place. Checkpointed
    layers recompute from their inputs and keep no cache, so a model with gradient checkpointing runs every row
    whole. Positions past a row's end hold no meaningful state in either way."""
    inputs = model_inputs(model, batch, processor)
    plan = shared_prefix(model, batch) if share and not checkpointed_layers(backbone) else None
    if plan is None:
        return backbone(**inputs).last_hidden_state
    representatives, index, prefix_images = plan
    device = inputs["input_ids"].device
    representatives, index = representatives.to(device), index.to(device)
    ids, positions = inputs["input_ids"], inputs["position_ids"]
    images_per_row = [len(row) for row in batch.images]
    real = batch.attention_mask.to(device).sum(dim=1)
    lengths = batch.prompt_lengths().to(device)  # [B] each row's prefix length
    width, rest = int(lengths.max()), int((real - lengths).max())
    # The prefixes, left-padded to `width`: column c of prefix p is its token width - L_p + c (none where < 0).
    prefix_cols = lengths[representatives, None] - width + torch.arange(width, device=device)
    prefix_real = prefix_cols >= 0
    prefix_cols = prefix_cols.clamp(min=0)
    prefix = backbone(
        input_ids=torch.where(prefix_real, ids[representatives].gather(1, prefix_cols), 0),
        attention_mask=None if bool(prefix_real.all()) else prefix_real.long(),
        position_ids=taken(positions[..., representatives, :], prefix_cols),
        use_cache=True,
        **image_rows(inputs, images_per_row, [(int(p), 0, prefix_images[p]) for p in representatives]),
    )
    cache = output_cache(prefix)
    cache.batch_select_indices(index)  # each row's copy of its prefix's keys and values (backward sums the copies)
    # The rest of each row, from its own prefix's end: column j is the row's token L_r + j (real while < its length).
    rest_cols = lengths[:, None] + torch.arange(rest, device=device)
    rest_real = rest_cols < real[:, None]
    rest_cols = rest_cols.clamp(max=ids.shape[1] - 1)
    suffix = backbone(
        input_ids=torch.where(rest_real, ids.gather(1, rest_cols), 0),
        attention_mask=torch.cat([prefix_real[index], rest_real], dim=1).long(),
        position_ids=taken(positions, rest_cols),
        use_cache=True,
        **cache_inputs(backbone, cache),
        **image_rows(inputs, images_per_row, [(r, n, images_per_row[r]) for r, n in enumerate(prefix_images)]),
    )
    # Back in place: a row's column c < L_r comes from its prefix (at width - L_r + c), the others from its rest.
    both = torch.cat([prefix.last_hidden_state[index], suffix.last_hidden_state], dim=1)
    cols = torch.arange(ids.shape[1], device=device)[None]
    source = torch.where(cols < lengths[:, None], width - lengths[:, None] + cols, width + cols - lengths[:, None])
    source = source.clamp(max=both.shape[1] - 1)
    return both.gather(1, source[..., None].expand(-1, -1, both.shape[-1]))


def sampled_positions(batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of sampled tokens; the hidden state at col-1 predicts each of them."""
    rows, cols = batch.response_mask.nonzero(as_tuple=True)
    if bool((cols == 0).any()):
        raise ValueError("A sampled token at position 0 has no context to be predicted from.")
    return rows, cols


def hidden_before_sampled(backbone_output: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """Hidden states [n_sampled, H] at the positions just before each sampled token."""
    rows, cols = sampled_positions(batch)
    return backbone_output[rows.to(backbone_output.device), (cols - 1).to(backbone_output.device)]


def scatter_sampled(values: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """Put per-sampled-token values [n_sampled] back into a [B, T] tensor (0 elsewhere)."""
    rows, cols = sampled_positions(batch)
    out = values.new_zeros(batch.input_ids.shape)
    out[rows.to(values.device), cols.to(values.device)] = values
    return out


def policy_forward(
    model: torch.nn.Module,
    batch: TokenBatch,
    processor: Any | None,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_T(sampled token | prefix) as [B, T] (0 off the response mask), and optionally the entropy [B, T].

    π_T = softmax(logits / temperature) over the ids the engine may sample (a vision-language model's image /
    video pads are banned there, so here too): the distribution the engine sampled from at that temperature
    (before top-k / top-p truncation, as verl and TRL score it), so the PPO ratio and the entropy refer
    to the sampling policy. temperature=1 is the model's own distribution; 0 (greedy) scores at 1.
    """
    hidden = backbone_hidden(model, _backbone(model), batch, processor)  # (B, T, H)
    logits = model.get_output_embeddings()(hidden_before_sampled(hidden, batch)).float()  # (n, V)
    banned = placeholder_token_ids(model)
    if banned:
        logits = logits.index_fill(-1, torch.tensor(banned, device=logits.device), float("-inf"))
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    rows, cols = sampled_positions(batch)
    targets = batch.input_ids[rows, cols].to(logits.device)
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)  # (n,)
    entropy = scatter_sampled(entropy_from_logits(logits), batch) if with_entropy else None
    return scatter_sampled(logprobs, batch), entropy


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module, batch: TokenBatch, processor: Any | None, micro_batch: int, temperature: float = 1.0
) -> torch.Tensor:
    """`policy_forward` log-probs for a whole batch, in micro-batches, without gradients: [B, T] on CPU."""
    out = torch.zeros(batch.input_ids.shape)
    for rows in batch.micro_batches(torch.arange(len(batch)), micro_batch):
        logprobs, _ = policy_forward(model, batch.select(rows), processor, temperature=temperature)
        out[rows, : logprobs.shape[1]] = logprobs.float().cpu()
    return out


def critic_forward(critic: torch.nn.Module, batch: TokenBatch, processor: Any | None) -> torch.Tensor:
    """V(state before each sampled token) as [B, T] (0 off the response mask)."""
    hidden = backbone_hidden(critic, critic.model, batch, processor)  # (B, T, H)
    values = critic.value_head(hidden_before_sampled(hidden, batch)).squeeze(-1).float()  # (n,)
    return scatter_sampled(values, batch)
