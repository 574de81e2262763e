"""Teacher-forced forward passes over a `TokenBatch`: log-probs, entropies and values of sampled tokens.

Shared by the trainer's update and the supervised warm starts (vagen.bootstrap), so that building a warm start never
needs the trainer.

Only the positions that predict a sampled token go through the LM head, so memory is
O(sampled tokens × vocab) instead of O(all tokens × vocab): observations and images can be long.
"""

from __future__ import annotations

from typing import Any

import torch

from vagen.algos.losses import entropy_from_logits
from vagen.models.inputs import image_model_inputs, placeholder_token_ids, prompt_position_ids
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
    inputs = model_inputs(model, batch, processor)
    hidden = _backbone(model)(**inputs).last_hidden_state  # (B, T, H)
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
    inputs = model_inputs(critic, batch, processor)
    hidden = critic.model(**inputs).last_hidden_state  # (B, T, H)
    values = critic.value_head(hidden_before_sampled(hidden, batch)).squeeze(-1).float()  # (n,)
    return scatter_sampled(values, batch)
