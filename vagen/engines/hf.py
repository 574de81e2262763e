"""The transformers engine: batched sampling from a live `transformers` model, on CPU or GPU.

A custom decoding loop over `model(...)` with a KV cache instead of `model.generate`, because we need
exact control of three things token-in/token-out training relies on: the log-prob of every sampled
token (under the distribution it was drawn from, see `Generation`), per-sequence stop handling, and sampling draws
seeded per context so sampling is reproducible and independent of how contexts are batched.

Batching: all contexts of a call are left-padded into one batch (or micro-batches of at most
`max_batch_size`, grouped by length to waste little padding). Position ids are passed explicitly so
left padding changes nothing: a text model sees positions 0..n-1 over each row's real tokens; a
Qwen2-VL / Qwen2.5-VL model gets its 3-D mrope positions from its own `get_rope_index` (with the
attention mask, so pads are skipped), and decode steps continue at `real_length + rope_delta`,
exactly what transformers' own generation computes. Images are turned into `pixel_values` and
`image_grid_thw` by the processor's image processor, for all images of the batch in order.

Turns: the engine keeps each call's keys and values (`keep_cache`). A context of the next call that continues one of
its rows (the dialogue's next turn: the prompt, the sampled reply, the new observation) runs only its new tokens and
images after the kept ones, and samples what its whole prompt would (tests/test_engine_hf.py). Kept rows are dropped
when any parameter changes and at `forget()`, which the rollout calls once its dialogues are over.

Vision-language models never sample their image / video pad ids (see `placeholder_token_ids`).

Weights: the engine samples from the very module it was given. When the trainer shares that module
(the usual single-process setup), `update_weights` is a no-op; otherwise it copies in place.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from vagen.engines.base import ENGINES, Context, EngineSource, Generation, SamplingParams, context_seeds
from vagen.models.inputs import (
    cache_inputs,
    eval_mode,
    image_key,
    image_model_inputs,
    mrope_index_fn,
    output_cache,
    placeholder_token_ids,
    prompt_position_ids,
)


def left_pad(contexts: list[Context], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts into `input_ids` (B, L) int64 and `attention_mask` (B, L) int64 (1 = real token)."""
    width = max(len(c.token_ids) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for row, context in enumerate(contexts):
        n = len(context.token_ids)
        input_ids[row, width - n :] = torch.tensor(context.token_ids, dtype=torch.long)
        attention_mask[row, width - n :] = 1
    return input_ids.to(device), attention_mask.to(device)


def distinct_contexts(contexts: list[Context]) -> tuple[list[Context], list[int]]:
    """The distinct contexts (same ids and same pixels), in first-seen order, and for each context the index of
    its copy among them."""
    index: dict[tuple, int] = {}
    unique, copy_of_row = [], []
    for context in contexts:
        key = (tuple(context.token_ids), tuple(image_key(image) for image in context.images))
        if key not in index:
            index[key] = len(unique)
            unique.append(context)
        copy_of_row.append(index[key])
    return unique, copy_of_row


class ReservedLayer(DynamicLayer):
    """A full-attention cache layer with room for `extra` more positions: a decode step writes its key and value into
    the buffer instead of concatenating them to a new tensor (a copy of the whole cache, every step, every layer).
    The keys and values it returns are views of the same numbers, so attention computes exactly what it would."""

    def __init__(self, layer: DynamicLayer, extra: int) -> None:
        super().__init__()
        batch, heads, self.length, width = layer.keys.shape
        shape = (batch, heads, self.length + extra, width)
        self.key_buffer, self.value_buffer = layer.keys.new_empty(shape), layer.values.new_empty(shape)
        self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length] = layer.keys, layer.values
        self.dtype, self.device, self.is_initialized = layer.keys.dtype, layer.keys.device, True
        self.keys, self.values = layer.keys, layer.values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple:
        end = self.length + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:
            raise RuntimeError(f"ReservedLayer holds {self.key_buffer.shape[-2]} positions; {end} were written.")
        self.key_buffer[:, :, self.length : end], self.value_buffer[:, :, self.length : end] = key_states, value_states
        self.keys, self.values, self.length = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end], end
        return self.keys, self.values


def reserve_decode_room(cache: Any, extra: int) -> None:
    """Give each full-attention layer of a prefilled `DynamicCache` room for `extra` decode steps (`ReservedLayer`)."""
    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized:
            cache.layers[index] = ReservedLayer(layer, extra)


@dataclass
class KeptRow:
    """A row of the engine's last call, kept for a context of the next call that continues it (the next turn of
    its dialogue): its tokens (the prompt and the generated tokens that went through the model), its images' keys
    and `image_grid_thw` rows, and where its keys and values sit in the KV cache of the batch it decoded in."""

    token_ids: tuple[int, ...]
    image_keys: tuple
    grid: torch.Tensor | None
    cache: Any
    row: int
    columns: torch.Tensor


class KeptRows:
    """The rows of one `generate` call, looked up by the longest kept row a context begins with. They belong to the
    weights they were computed with (`weights_fingerprint`) and to no others."""

    def __init__(self, weights: tuple) -> None:
        self.weights = weights
        self.by_length: dict[int, dict[tuple[int, ...], KeptRow]] = {}

    def add(self, row: KeptRow) -> None:
        self.by_length.setdefault(len(row.token_ids), {})[row.token_ids] = row

    def find(self, context: Context, image_keys: tuple) -> KeptRow | None:
        """The longest kept row that `context` continues by at least one token, in its ids and its images."""
        for length in sorted(self.by_length, reverse=True):
            if length < len(context.token_ids):
                row = self.by_length[length].get(tuple(context.token_ids[:length]))
                if row is not None and image_keys[: len(row.image_keys)] == row.image_keys:
                    return row
        return None


def weights_fingerprint(model: torch.nn.Module) -> tuple:
    """Changes whenever a parameter does: an optimizer step, `load_state_dict` or any in-place write bumps the
    tensor's version counter, and `.to()` gives it new storage."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def keepable(cache: Any) -> bool:
    """Whether every layer of `cache` holds each position's keys and values (full attention), so that a row can be
    continued from them."""
    return all(type(layer) in (DynamicLayer, ReservedLayer) and layer.is_initialized for layer in cache.layers)


def gathered_cache(starts: list[KeptRow], width: int) -> DynamicCache:
    """A cache of the kept rows' keys and values, one row each, each left-padded to `width` positions."""
    cache = DynamicCache()
    for index in range(len(starts[0].cache.layers)):
        first = starts[0].cache.layers[index].keys
        shape = (len(starts), first.shape[1], width, first.shape[3])
        keys, values = first.new_zeros(shape), first.new_zeros(shape)
        for row, start in enumerate(starts):
            layer = start.cache.layers[index]
            n = len(start.columns)
            keys[row, :, width - n :] = layer.keys[start.row].index_select(1, start.columns)
            values[row, :, width - n :] = layer.values[start.row].index_select(1, start.columns)
        cache.update(keys, values, index)
    return cache


def restrict_to_top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set all but the `top_k` largest scores of each row (B, V) to -inf; 0 keeps everything."""
    if top_k <= 0 or top_k >= scores.shape[-1]:
        return scores
    kth_largest = torch.topk(scores, top_k, dim=-1).values[:, -1:]  # (B, 1)
    return scores.masked_fill(scores < kth_largest, float("-inf"))


def restrict_to_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep, per row of `scores` (B, V), the smallest set of tokens whose probability reaches `top_p`."""
    if top_p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_scores, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    # A token is dropped once the more likely ones already reach top_p; the most likely one never is.
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def sample_next_tokens(
    logits: torch.Tensor,
    sampling: SamplingParams,
    uniforms: torch.Tensor | None,
    banned_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` (B, V), never one of `banned_ids` (K,) int64.

    uniforms: (B,) float64 in [0, 1), one draw per row (None: fresh draws from torch's global RNG). Row b takes
    the first token whose cumulative probability exceeds `uniforms[b]` (inverse-CDF sampling), so what a row
    samples depends only on its own logits and draw, not on the other rows of the batch.
    Returns `tokens` (B,) int64 and their log-probs (B,) float32 under the distribution they were drawn
    from (ban, temperature, top-k, top-p applied), the convention documented on `Generation.logprobs`.
    """
    scores = logits.float()
    if banned_ids is not None:
        scores = scores.index_fill(-1, banned_ids, float("-inf"))
    if sampling.greedy:
        tokens = scores.argmax(dim=-1)
    else:
        scores = restrict_to_top_p(restrict_to_top_k(scores / sampling.temperature, sampling.top_k), sampling.top_p)
        cdf = torch.softmax(scores.double(), dim=-1).cumsum(dim=-1)  # (B, V); flat over zero-probability tokens
        if uniforms is None:
            uniforms = torch.rand(len(scores), dtype=torch.float64)
        draws = (uniforms.to(cdf.device) * cdf[:, -1])[:, None]  # (B, 1), scaled by the total to absorb rounding
        tokens = torch.searchsorted(cdf, draws, right=True).squeeze(-1).clamp(max=scores.shape[-1] - 1)
    return tokens, torch.log_softmax(scores, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def row_uniforms(contexts: list[Context], sampling: SamplingParams) -> torch.Tensor | None:
    """(B, max_new_tokens) float64: each context's stream of sampling draws, from its own seed (`context_seeds`);
    None for an unseeded call (draws then come from torch's global RNG)."""
    seeds = context_seeds(contexts, sampling.seed)
    if sampling.greedy or all(seed is None for seed in seeds):
        return None
    streams = [
        torch.rand(sampling.max_new_tokens, dtype=torch.float64)
        if seed is None
        else torch.rand(sampling.max_new_tokens, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        for seed in seeds
    ]
    return torch.stack(streams)


@ENGINES.register("hf")
class HFEngine:
    """Batched generation with a transformers model (any causal LM, or Qwen2-VL / Qwen2.5-VL).

    model: a `PreTrainedModel`; generation runs on its device and in its dtype.
    processor: tokenizer or multimodal processor; only its `image_processor` is used (for images).
    max_batch_size: most contexts in one forward; None puts every context of a call in one batch.
    keep_cache: keep each call's keys and values, so that a context of the next call that continues one of its rows
        (the next turn of a dialogue: the prompt, the sampled reply, the new observation) runs only its new tokens
        and new images; kept rows are dropped when the weights change (`weights_fingerprint`). False runs every
        prompt whole and holds no memory between calls.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any = None,
        max_batch_size: int | None = None,
        keep_cache: bool = True,
    ) -> None:
        if max_batch_size is not None and (not isinstance(max_batch_size, int) or max_batch_size < 1):
            raise ValueError(f"max_batch_size must be a positive int or None, got {max_batch_size!r}.")
        if not isinstance(keep_cache, bool):
            raise ValueError(f"keep_cache must be true or false, got {keep_cache!r}.")
        self.model = model
        self.processor = processor
        self.max_batch_size = max_batch_size
        self.keep_cache = keep_cache
        self._kept: KeptRows | None = None
        self._accepts_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters

    @classmethod
    def from_source(cls, source: EngineSource, **engine_kwargs: Any) -> HFEngine:
        if source.model is None:
            raise ValueError(
                "The 'hf' engine samples from a live transformers model, but EngineSource.model is None; "
                "pass EngineSource(model=policy, processor=processor)."
            )
        return cls(source.model, source.processor, **engine_kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy `state_dict` into the model in place; a no-op when it already is the model's own tensors."""
        own = self.model.state_dict()
        if own.keys() == state_dict.keys() and all(
            own[name].data_ptr() == tensor.data_ptr() for name, tensor in state_dict.items()
        ):
            return  # shared module: the trainer's update is already what we sample from
        self.model.load_state_dict(dict(state_dict), strict=True)

    def forget(self) -> None:
        """Drop the kept rows (`keep_cache`): no later context continues them."""
        self._kept = None

    def generate(self, contexts: list[Context], sampling: SamplingParams) -> list[Generation]:
        """One `Generation` per context, same order; see the module docstring for batching."""
        if not contexts:
            return []
        for index, context in enumerate(contexts):
            self._check_context(index, context)
        uniforms = row_uniforms(contexts, sampling)
        image_keys = [tuple(image_key(image) for image in context.images) for context in contexts]
        weights = weights_fingerprint(self.model)
        kept = self._kept if self._kept is not None and self._kept.weights == weights else None
        self._kept = None
        starts = [None if kept is None else kept.find(c, k) for c, k in zip(contexts, image_keys, strict=True)]
        keep = KeptRows(weights) if self.keep_cache else None
        results: list[Generation | None] = [None] * len(contexts)
        with torch.no_grad(), eval_mode(self.model):
            fresh = [i for i, start in enumerate(starts) if start is None]
            continuing = [i for i, start in enumerate(starts) if start is not None]
            for indices in self._micro_batches(contexts, fresh) + self._micro_batches(contexts, continuing):
                batch = [contexts[i] for i in indices]
                draws = None if uniforms is None else uniforms[indices]
                generations = self._generate_batch(
                    batch, sampling, draws, [starts[i] for i in indices], [image_keys[i] for i in indices], keep
                )
                for i, generation in zip(indices, generations, strict=True):
                    results[i] = generation
        self._kept = keep
        return results  # type: ignore[return-value]

    def _micro_batches(self, contexts: list[Context], indices: list[int]) -> list[list[int]]:
        """`indices` in micro-batches; when splitting, similar lengths go together to save padding."""
        size = self.max_batch_size or len(indices)
        if size >= len(indices):
            return [indices] if indices else []
        by_length = sorted(indices, key=lambda i: len(contexts[i].token_ids))
        return [by_length[start : start + size] for start in range(0, len(by_length), size)]

    def _check_context(self, index: int, context: Context) -> None:
        if not context.token_ids:
            raise ValueError(f"Context {index} has no token ids; every prompt needs at least one token.")
        vocab_size = self.model.get_input_embeddings().num_embeddings
        bad = [t for t in context.token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"Context {index} has token ids outside the model's vocabulary [0, {vocab_size}): {bad[:5]}; "
                "tokenize with the tokenizer that belongs to this model."
            )
        if context.images and mrope_index_fn(self.model) is None:
            raise ValueError(
                f"Context {index} has {len(context.images)} image(s) but {type(self.model).__name__} takes no "
                "images; use a Qwen2-VL / Qwen2.5-VL model or drop the images."
            )

    def _image_inputs(self, batch: list[Context], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """`pixel_values` and `image_grid_thw` of all images of the batch, in order; {} without images."""
        images = [image for context in batch for image in context.images]
        if not images:
            if mrope_index_fn(self.model) is not None and bool((input_ids == self.model.config.image_token_id).any()):
                raise ValueError("A context holds image pad tokens but no images; pass the images in Context.images.")
            return {}
        inputs = image_model_inputs(self.model, self.processor, images)
        self._check_image_pads(batch, input_ids, inputs["image_grid_thw"])
        return inputs

    def _check_image_pads(self, batch: list[Context], input_ids: torch.Tensor, image_grid_thw: torch.Tensor) -> None:
        """Each context must hold exactly as many image pads as its images have tokens after merging."""
        merge = self.model.config.vision_config.spatial_merge_size
        tokens_per_image = (image_grid_thw.prod(dim=-1) // merge**2).tolist()
        pads_per_row = (input_ids == self.model.config.image_token_id).sum(dim=-1).tolist()
        first = 0
        for row, context in enumerate(batch):
            expected = sum(tokens_per_image[first : first + len(context.images)])
            first += len(context.images)
            if pads_per_row[row] != expected:
                raise ValueError(
                    f"A context has {pads_per_row[row]} image pad tokens but its {len(context.images)} image(s) "
                    f"need {expected}; expand each image's pad to the image's token count with the same image "
                    "processor settings (min_pixels / max_pixels) as the engine's processor."
                )

    def _forward(self, **inputs: Any) -> Any:
        if self._accepts_logits_to_keep:
            inputs["logits_to_keep"] = 1  # only the last position's logits are needed: saves (B, L, V) memory
        return self.model(use_cache=True, **inputs)

    def _pad_id(self) -> int:
        return 1 if getattr(self.model.config, "image_token_id", None) == 0 else 0  # any id but the image pad

    def _prefill(self, batch: list[Context]) -> tuple[Any, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
        """The prompts' forward: (output, attention mask, rope delta, each row's `image_grid_thw` rows).

        Identical prompts (a GRPO group's N rollouts of one state) are prefilled once and their KV cache, last
        logits, mask and positions copied to every row that shares them: the same numbers, N times less work.
        """
        unique, copy_of_row = distinct_contexts(batch)
        input_ids, attention_mask = left_pad(unique, self._pad_id(), self.device)
        image_inputs = self._image_inputs(unique, input_ids)
        position_ids, rope_delta = prompt_position_ids(
            self.model, input_ids, attention_mask, image_inputs.get("image_grid_thw")
        )
        output = self._forward(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **image_inputs
        )
        grids = _split_grid(image_inputs.get("image_grid_thw"), unique)
        if len(unique) < len(batch):
            rows = torch.tensor(copy_of_row, dtype=torch.long, device=self.device)
            output_cache(output).batch_select_indices(rows)
            output.logits = output.logits[rows]
            attention_mask, rope_delta = attention_mask[rows], rope_delta[rows]
        return output, attention_mask, rope_delta, [grids[i] for i in copy_of_row]

    def _continue(
        self, batch: list[Context], starts: list[KeptRow]
    ) -> tuple[Any, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
        """`_prefill` for contexts that continue kept rows: each row runs only its tokens (and images) after its kept
        row, attending to the kept keys and values. The batch is [kept part | new part], each left-padded, so a row
        may hold pads between its two parts; the mask hides them and the positions are the whole context's."""
        device, pad_id = self.device, self._pad_id()
        cached = [len(start.token_ids) for start in starts]
        new = [
            Context(c.token_ids[n:], c.images[len(s.image_keys) :])
            for c, n, s in zip(batch, cached, starts, strict=True)
        ]
        width = max(cached)
        cache = gathered_cache(starts, width)
        new_ids, new_mask = left_pad(new, pad_id, device)
        cached_mask = torch.arange(width, device=device) >= width - torch.tensor(cached, device=device)[:, None]
        attention_mask = torch.cat([cached_mask.long(), new_mask], dim=1)
        image_inputs = self._image_inputs(new, new_ids)
        new_grids = _split_grid(image_inputs.get("image_grid_thw"), new)
        grids = [
            None if old is None and added is None else torch.cat([g for g in (old, added) if g is not None])
            for old, added in zip((s.grid for s in starts), new_grids, strict=True)
        ]
        whole_ids, whole_mask = left_pad(batch, pad_id, device)
        whole_grid = None if all(g is None for g in grids) else torch.cat([g for g in grids if g is not None])
        position_ids, rope_delta = prompt_position_ids(self.model, whole_ids, whole_mask, whole_grid)
        output = self._forward(
            input_ids=new_ids,
            attention_mask=attention_mask,
            position_ids=position_ids[..., -new_ids.shape[1] :],
            **cache_inputs(self.model, cache),
            **image_inputs,
        )
        return output, attention_mask, rope_delta, grids

    def _generate_batch(
        self,
        batch: list[Context],
        sampling: SamplingParams,
        uniforms: torch.Tensor | None,
        starts: list[KeptRow | None],
        image_keys: list[tuple],
        keep: KeptRows | None,
    ) -> list[Generation]:
        """Prefill the prompts (or continue their kept rows), then decode all rows together until each stops or hits
        the limit; with `keep`, record every row for the next call."""
        device = self.device
        if starts[0] is None:
            output, attention_mask, rope_delta, grids = self._prefill(batch)
        else:
            output, attention_mask, rope_delta, grids = self._continue(batch, starts)  # type: ignore[arg-type]
        mrope = mrope_index_fn(self.model) is not None
        reserve_decode_room(output_cache(output), sampling.max_new_tokens)
        next_index = attention_mask.sum(dim=-1)  # (B,) real-token index of the next token
        stop_ids = torch.tensor(sampling.stop_token_ids, dtype=torch.long, device=device)
        banned = placeholder_token_ids(self.model)
        banned_ids = torch.tensor(banned, dtype=torch.long, device=device) if banned else None
        alive = torch.ones(len(batch), dtype=torch.bool, device=device)
        step_tokens, step_logprobs, step_alive = [], [], []
        for step in range(sampling.max_new_tokens):
            draws = None if uniforms is None else uniforms[:, step]
            tokens, logprobs = sample_next_tokens(output.logits[:, -1, :], sampling, draws, banned_ids)
            step_tokens.append(tokens)
            step_logprobs.append(logprobs)
            step_alive.append(alive)
            alive = alive & ~torch.isin(tokens, stop_ids)
            if step == sampling.max_new_tokens - 1 or not bool(alive.any()):
                break
            # Finished rows keep decoding (their outputs are ignored) so the batch stays rectangular.
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(batch), 1)], dim=-1)
            positions = (next_index + rope_delta)[:, None]  # (B, 1)
            if mrope:
                positions = positions[None].expand(3, -1, -1)  # (3, B, 1): text tokens share one position
            output = self._forward(
                input_ids=tokens[:, None],
                attention_mask=attention_mask,
                position_ids=positions,
                **cache_inputs(self.model, output_cache(output)),
            )
            next_index = next_index + 1
        generations = _collect(step_tokens, step_logprobs, step_alive, stop_ids)
        cache = output_cache(output)
        if keep is not None and keepable(cache):
            for row, (context, generation) in enumerate(zip(batch, generations, strict=True)):
                # every sampled token but the last went through the model; the cache past it is a finished row's
                fed = context.token_ids + generation.token_ids[:-1]
                columns = attention_mask[row].nonzero().squeeze(1)[: len(fed)]
                keep.add(KeptRow(tuple(fed), image_keys[row], grids[row], cache, row, columns))
        return generations


def _split_grid(grid: torch.Tensor | None, contexts: list[Context]) -> list[torch.Tensor | None]:
    """Each context's rows of a batch's `image_grid_thw` (None for a context without images)."""
    out, first = [], 0
    for context in contexts:
        count = len(context.images)
        out.append(grid[first : first + count] if count else None)
        first += count
    return out


def _collect(
    step_tokens: list[torch.Tensor],
    step_logprobs: list[torch.Tensor],
    step_alive: list[torch.Tensor],
    stop_ids: torch.Tensor,
) -> list[Generation]:
    """Turn per-step (B,) tensors into one `Generation` per row, keeping only steps where the row was alive."""
    tokens = torch.stack(step_tokens, dim=1).cpu()  # (B, T)
    logprobs = torch.stack(step_logprobs, dim=1).cpu()  # (B, T)
    lengths = torch.stack(step_alive, dim=1).sum(dim=1).cpu()  # (B,)
    stops = set(stop_ids.tolist())
    generations = []
    for row in range(tokens.shape[0]):
        n = int(lengths[row])
        ids = tokens[row, :n].tolist()
        finish = "stop" if ids and ids[-1] in stops else "length"
        generations.append(Generation(ids, logprobs[row, :n].tolist(), finish))
    return generations
