"""In-batch cross-scoring for the MI proxies: L[z, j] = log π(z | x_j) with the current policy (docs/spec.md §4).

Cost. Naively every (z, j) pair is one forward over prompt + response. Here each prompt x_j runs
ONCE (with its images) into a KV cache, and all reasonings are scored as one batched continuation
of that cache; only the hidden states that predict a z token go through the LM head (no
full-vocabulary work elsewhere, no entropies). `naive_cross_scores` is the slow reference.

Continuation layout. The prefix forward covers x_j[:-1]; each continuation row is
[x_j[-1]] + response[:z_end-1], so its hidden state at index p predicts response[p] and every z
token (even one at response index 0) is predicted inside the batched forward. Positions continue
from the last prompt token's position (for Qwen2.5-VL mRoPE that already holds the rope delta).

Image-dependence probe (`image_probe`): z is re-scored under its own prompt's TEXT with another
prompt's images (and with blank gray images). Swapping keeps the source's token ids, which is only
well-formed when the images produce the same number of vision tokens: prompts are grouped by image
signature (count and pixel sizes of their images) and the swap matrix covers the largest group.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from transformers import DynamicCache

from vagen.diagnostics.mi import mi_metrics
from vagen.models.inputs import cache_inputs, eval_mode, image_model_inputs, output_cache, prompt_position_ids
from vagen.registry import Registry
from vagen.rollout.trajectory import Trajectory

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
BLANK_GRAY = (128, 128, 128)


# ---- locating z in the sampled ids -----------------------------------------------------------
def _first_prefix(num_ids: int, holds: Callable[[int], bool]) -> int:
    """Smallest k in [1, num_ids] with holds(k) (monotone in k), by binary search; holds(num_ids) must be True."""
    low, high = 1, num_ids
    while low < high:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle + 1
    return low


def think_span(response_ids: Sequence[int], tokenizer: Any) -> tuple[int, int] | None:
    """Token positions [start, end) of the reasoning z inside `<think>…</think>` of SAMPLED ids.

    Found by decoding growing prefixes (never re-tokenising). Tokens straddling a tag boundary
    belong to the tag: z is the maximal run of tokens whose text lies entirely between the tags
    (the token completing `<think>` is excluded, and so is the token where `</think>` begins, even
    if it also carries the last characters of z). None without a complete think block or if z is empty.
    """
    ids = list(response_ids)

    def text(k: int) -> str:
        return tokenizer.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    full = text(len(ids))
    open_at = full.find(THINK_OPEN)
    close_at = full.find(THINK_CLOSE, open_at + len(THINK_OPEN)) if open_at >= 0 else -1
    if close_at < 0:
        return None
    after_open = open_at + len(THINK_OPEN)
    start = _first_prefix(len(ids), lambda k: THINK_OPEN in text(k))
    closed = _first_prefix(len(ids), lambda k: text(k).find(THINK_CLOSE, after_open) >= 0)
    end = closed - 1  # the token completing `</think>`; walk back to the one where the tag begins
    while end > start and len(text(end)) > close_at:
        end -= 1
    return (start, end) if end > start else None


# ---- the scoring job ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ScoringPrompt:
    """A context x_j: its token ids, the images they refer to (in order), and an identity.

    Equal `identity` marks identical prompts (same ids and same image pixels): no scorer can tell
    them apart, so `mi_metrics` counts retrieving either as correct.
    """

    token_ids: list[int]
    images: list[Image.Image]
    identity: int


@dataclass(frozen=True)
class Reasoning:
    """A reasoning sample: the response ids up to the end of z, z's span in them, and its source prompt.

    `origin` is (trajectory index, turn index) in the list the job was built from.
    """

    prefix_ids: list[int]
    span: tuple[int, int]
    source: int
    origin: tuple[int, int] = (-1, -1)

    @property
    def length(self) -> int:
        return self.span[1] - self.span[0]


@dataclass
class ScoringJob:
    """B prompts and Z reasonings to cross-score; `scope` names how they were drawn."""

    prompts: list[ScoringPrompt]
    reasonings: list[Reasoning]
    scope: str = "custom"
    stats: dict[str, int] = field(default_factory=dict)

    def lengths(self) -> Tensor:
        """[Z] long, |z| of each reasoning."""
        return torch.tensor([r.length for r in self.reasonings], dtype=torch.long)

    def source(self) -> Tensor:
        """[Z] long, column of each reasoning's source prompt."""
        return torch.tensor([r.source for r in self.reasonings], dtype=torch.long)

    def prompt_ids(self) -> Tensor:
        """[B] long identities, for `mi_metrics(prompt_ids=...)`."""
        return torch.tensor([p.identity for p in self.prompts], dtype=torch.long)


def _image_digest(images: Sequence[Image.Image]) -> tuple:
    return tuple((image.size, image.mode, hashlib.sha256(image.tobytes()).hexdigest()) for image in images)


class _Identities:
    """Assigns one integer per distinct content key, in order of first appearance."""

    def __init__(self) -> None:
        self._ids: dict[Any, int] = {}

    def __call__(self, key: Any) -> int:
        return self._ids.setdefault(key, len(self._ids))


def turn_context(trajectory: Trajectory, turn_index: int) -> tuple[list[int], list[Image.Image]]:
    """Everything before turn `turn_index`'s response: ids (earlier turns included) and all images so far."""
    ids, _ = trajectory.token_ids_and_mask()
    start, _ = trajectory.response_spans()[turn_index]
    images = [image for turn in trajectory.turns[: turn_index + 1] for image in turn.images]
    return ids[:start], images


def _reasoning(trajectory: Trajectory, turn_index: int, tokenizer: Any, source: int, index: int) -> Reasoning | None:
    response = trajectory.turns[turn_index].response_ids
    span = think_span(response, tokenizer)
    if span is None:
        return None
    return Reasoning(list(response[: span[1]]), span, source, (index, turn_index))


def _subsample(count: int, limit: int, rng: np.random.Generator) -> list[int]:
    """Sorted indices of a uniform sample of min(count, limit) out of range(count)."""
    if count <= limit:
        return list(range(count))
    return sorted(int(i) for i in rng.choice(count, size=limit, replace=False))


SCOPES: Registry[Any] = Registry("MI scoring scope")


@SCOPES.register("first_turn")
def first_turn_job(trajectories, tokenizer, max_prompts, max_reasonings, rng) -> ScoringJob:
    """Prompts: one per group (its first-turn context); reasonings: every trajectory's first-turn z."""
    groups = sorted({t.group_id for t in trajectories})
    groups = [groups[i] for i in _subsample(len(groups), max_prompts, rng)]
    column = {group: index for index, group in enumerate(groups)}
    identity, prompts = _Identities(), []
    for group in groups:
        first = next(t for t in trajectories if t.group_id == group)
        ids, images = turn_context(first, 0)
        prompts.append(ScoringPrompt(ids, images, identity((tuple(ids), _image_digest(images)))))
    candidates = [
        _reasoning(t, 0, tokenizer, column[t.group_id], index)
        for index, t in enumerate(trajectories)
        if t.group_id in column and t.turns and t.turns[0].response_ids
    ]
    valid = [r for r in candidates if r is not None]
    reasonings = [valid[i] for i in _subsample(len(valid), max_reasonings, rng)]
    stats = {"candidates": len(candidates), "with_think": len(valid)}
    return ScoringJob(prompts, reasonings, "first_turn", stats)


@SCOPES.register("trajectory")
def trajectory_job(trajectories, tokenizer, max_prompts, max_reasonings, rng) -> ScoringJob:
    """Up to min(max_prompts, max_reasonings) (trajectory, turn) pairs drawn uniformly over all turns with a z.

    Each pair gives one column (the whole context before that turn's response) and one reasoning.
    """
    pairs = [(i, k) for i, t in enumerate(trajectories) for k in range(len(t.turns)) if t.turns[k].response_ids]
    found = {pair: _reasoning(trajectories[pair[0]], pair[1], tokenizer, 0, pair[0]) for pair in pairs}
    eligible = [pair for pair in pairs if found[pair] is not None]
    chosen = [eligible[i] for i in _subsample(len(eligible), min(max_prompts, max_reasonings), rng)]
    identity, prompts, reasonings = _Identities(), [], []
    for column, (index, turn_index) in enumerate(chosen):
        ids, images = turn_context(trajectories[index], turn_index)
        prompts.append(ScoringPrompt(ids, images, identity((tuple(ids), _image_digest(images)))))
        sample = found[(index, turn_index)]
        reasonings.append(Reasoning(sample.prefix_ids, sample.span, column, sample.origin))
    return ScoringJob(prompts, reasonings, "trajectory", {"candidates": len(pairs), "with_think": len(eligible)})


def build_scoring_job(
    trajectories: Sequence[Trajectory],
    tokenizer: Any,
    scope: str = "first_turn",
    max_prompts: int = 32,
    max_reasonings: int = 128,
    rng: np.random.Generator | None = None,
) -> ScoringJob:
    """The prompts and reasonings of one scope (`SCOPES`: first_turn, trajectory), deterministically sampled.

    `rng` (default `np.random.default_rng(0)`) draws the subsets when the caps bind. The job may hold
    fewer than 2 prompts or no reasoning (check before scoring: `mi_metrics` needs B >= 2, Z >= 1).
    """
    if max_prompts < 2 or max_reasonings < 1:
        raise ValueError(f"Need max_prompts >= 2 and max_reasonings >= 1, got {max_prompts}, {max_reasonings}.")
    build = SCOPES.get(scope)
    return build(list(trajectories), tokenizer, max_prompts, max_reasonings, rng or np.random.default_rng(0))


# ---- shared-prefix scoring ---------------------------------------------------------------------
@dataclass
class _Prefix:
    """KV cache of V prompt variants with equal ids (x[:-1]), the last prompt token and its positions."""

    cache: DynamicCache | None  # [V, heads, P-1, head_dim] per layer; None when the prompt is one token
    length: int  # P - 1
    last_token: int
    last_position: Tensor  # (V,) or (3, V) for mRoPE


def _run_prefix(model, processor, token_ids: list[int], image_sets: list[list[Image.Image]]) -> _Prefix:
    """One forward of prompt[:-1] for each image set (all rows share `token_ids`)."""
    device = next(model.parameters()).device
    rows = len(image_sets)
    ids = torch.tensor([token_ids], dtype=torch.long, device=device).expand(rows, -1)
    mask = torch.ones_like(ids)
    inputs = image_model_inputs(model, processor, [image for images in image_sets for image in images])
    positions, _ = prompt_position_ids(model, ids, mask, inputs.get("image_grid_thw"))
    last = positions[..., -1]
    if ids.shape[1] == 1:
        if inputs:
            raise ValueError("A prompt with images must hold more than its image tokens; check the prompt ids.")
        return _Prefix(None, 0, token_ids[-1], last)
    output = model.model(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=positions[..., :-1],
        use_cache=True,
        **inputs,
    )
    return _Prefix(output_cache(output), ids.shape[1] - 1, token_ids[-1], last)


def _rows_cache(prefix: _Prefix, variant_rows: Tensor) -> DynamicCache | None:
    if prefix.cache is None:
        return None
    layers = [(layer.keys[variant_rows], layer.values[variant_rows]) for layer in prefix.cache.layers]
    return DynamicCache(ddp_cache_data=layers)


def _score_rows(model, prefix: _Prefix, rows: list[tuple[int, Reasoning]]) -> Tensor:
    """Summed log π(z) [len(rows)] float32 for (prefix variant, reasoning) rows, in ONE batched forward."""
    device = next(model.parameters()).device
    width = max(len(r.prefix_ids) for _, r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), prefix.length + width), dtype=torch.long)
    mask[:, : prefix.length] = 1
    hit_rows, hit_cols, targets = [], [], []
    for row, (_, reasoning) in enumerate(rows):
        n = len(reasoning.prefix_ids)
        ids[row, :n] = torch.tensor([prefix.last_token, *reasoning.prefix_ids[:-1]])
        mask[row, prefix.length : prefix.length + n] = 1
        start, end = reasoning.span
        hit_rows += [row] * (end - start)
        hit_cols += range(start, end)
        targets += reasoning.prefix_ids[start:end]
    variants = torch.tensor([variant for variant, _ in rows], dtype=torch.long, device=device)
    offsets = torch.arange(width, device=device)
    positions = prefix.last_position[..., variants, None] + offsets  # (rows, W) or (3, rows, W)
    output = model.model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions,
        **cache_inputs(model.model, _rows_cache(prefix, variants)),
        use_cache=True,
    )
    hit_rows_t = torch.tensor(hit_rows, dtype=torch.long, device=device)
    hidden = output.last_hidden_state[hit_rows_t, torch.tensor(hit_cols, dtype=torch.long, device=device)]
    logits = model.get_output_embeddings()(hidden).float()  # (n_z_tokens, V): z tokens only
    targets_t = torch.tensor(targets, dtype=torch.long, device=device)
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets_t[:, None]).squeeze(-1)
    summed = torch.zeros(len(rows), dtype=torch.float32, device=device).index_add_(0, hit_rows_t, logprobs)
    return summed.cpu()


def _score_from_prefix(model, prefix: _Prefix, rows: list[tuple[int, Reasoning]], micro_batch: int) -> Tensor:
    """`_score_rows` in micro-batches of similar lengths (less padding); result in the order of `rows`."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][1].prefix_ids))
    out = torch.zeros(len(rows), dtype=torch.float32)
    for begin in range(0, len(order), micro_batch):
        chunk = order[begin : begin + micro_batch]
        out[chunk] = _score_rows(model, prefix, [rows[i] for i in chunk])
    return out


def _check_job(job: ScoringJob, micro_batch: int) -> None:
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}.")
    if not job.prompts or not job.reasonings:
        raise ValueError(f"Nothing to score: {len(job.prompts)} prompts, {len(job.reasonings)} reasonings.")
    if any(not p.token_ids for p in job.prompts) or any(r.length < 1 for r in job.reasonings):
        raise ValueError("Every prompt needs token ids and every reasoning a non-empty z span.")


def _same_text_groups(job: ScoringJob, limit: int) -> list[list[int]]:
    """Columns whose prompts have identical ids, in chunks of at most `limit`: each chunk is one batched prefix
    forward (Sokoban's first turns differ only in the image, so a whole first-turn job is one forward)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for column, prompt in enumerate(job.prompts):
        groups.setdefault(tuple(prompt.token_ids), []).append(column)
    return [columns[i : i + limit] for columns in groups.values() for i in range(0, len(columns), limit)]


def cross_scores(model, processor: Any, job: ScoringJob, micro_batch: int = 32) -> tuple[Tensor, Tensor]:
    """scores [Z, B] float32 (CPU) with L[z, j] = Σ_{t∈z} log π(z_t | x_j, response before z_t), and lengths [Z].

    One prefix forward per distinct prompt text, batched over the image sets of the prompts that share it
    (at most `micro_batch` at once), then all Z continuations of every such prompt from the KV cache in
    micro-batches of `micro_batch` rows. No gradients; the model's train/eval mode is restored.
    """
    _check_job(job, micro_batch)
    scores = torch.zeros((len(job.reasonings), len(job.prompts)), dtype=torch.float32)
    with torch.inference_mode(), eval_mode(model):
        for columns in _same_text_groups(job, micro_batch):
            image_sets = [job.prompts[column].images for column in columns]
            prefix = _run_prefix(model, processor, job.prompts[columns[0]].token_ids, image_sets)
            rows = [(variant, reasoning) for variant in range(len(columns)) for reasoning in job.reasonings]
            scored = _score_from_prefix(model, prefix, rows, micro_batch).view(len(columns), len(job.reasonings))
            scores[:, columns] = scored.T
    return scores, job.lengths()


def naive_cross_scores(model, processor: Any, job: ScoringJob) -> tuple[Tensor, Tensor]:
    """Reference for tests: one full forward per (z, j) pair over prompt + response prefix, full log_softmax."""
    device = next(model.parameters()).device
    scores = torch.zeros((len(job.reasonings), len(job.prompts)), dtype=torch.float32)
    with torch.inference_mode(), eval_mode(model):
        for column, prompt in enumerate(job.prompts):
            inputs = image_model_inputs(model, processor, prompt.images)
            for row, reasoning in enumerate(job.reasonings):
                ids = torch.tensor([prompt.token_ids + reasoning.prefix_ids], dtype=torch.long, device=device)
                mask = torch.ones_like(ids)
                positions, _ = prompt_position_ids(model, ids, mask, inputs.get("image_grid_thw"))
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **inputs).logits
                logprobs = torch.log_softmax(logits[0].float(), dim=-1)  # (T, V)
                start, end = (len(prompt.token_ids) + i for i in reasoning.span)
                scores[row, column] = logprobs[start - 1 : end - 1].gather(-1, ids[0, start:end, None]).sum().cpu()
    return scores, job.lengths()


# ---- image-dependence probe --------------------------------------------------------------------
@dataclass
class ImageProbe:
    """Scores of each z under its own prompt text with swapped or blank images.

    visual_scores: [Z', B'] float32, z (of `reasoning_index`) under its source's text with the images of
        probe prompt j (`prompt_index` into job.prompts); the diagonal-by-source entries are the matched scores.
    source: [Z'] long, column of z's source among the B' probe prompts.
    prompt_ids: [B'] long, identity of each column's IMAGES (the text is always z's own).
    matched / blank: [Z''] float32 summed log π(z) with its own images / with same-size gray images,
        for every image reasoning (`blank_reasoning_index`), also those outside the swap group.
    """

    visual_scores: Tensor
    lengths: Tensor
    source: Tensor
    prompt_ids: Tensor
    prompt_index: Tensor
    reasoning_index: Tensor
    matched: Tensor
    blank: Tensor
    blank_lengths: Tensor
    blank_reasoning_index: Tensor

    @property
    def blank_drop(self) -> Tensor:
        """mean_z (matched − blank) / |z|: nats per token the real image is worth over a gray one."""
        return ((self.matched - self.blank) / self.blank_lengths.to(torch.float32)).mean()


def image_signature(images: Sequence[Image.Image]) -> tuple:
    """Images are swappable between prompts exactly when these agree (count and pixel sizes)."""
    return tuple(image.size for image in images)


def _swap_group(job: ScoringJob) -> list[int]:
    """Columns of the largest group of image prompts sharing one signature (first such group on ties)."""
    groups: dict[tuple, list[int]] = {}
    for column, prompt in enumerate(job.prompts):
        if prompt.images:
            groups.setdefault(image_signature(prompt.images), []).append(column)
    return max(groups.values(), key=len) if groups else []


def image_probe(
    model, processor: Any, job: ScoringJob, micro_batch: int = 32, scores: Tensor | None = None
) -> ImageProbe | None:
    """Score every image-prompt z under its own text with each same-signature prompt's images and with blanks.

    None when no prompt has images. Per source prompt s: one batched prefix forward over its variants
    (the swap group's image sets, plus the blank set; only [own, blank] when s is outside the group),
    then one batched continuation of all of s's reasonings per variant. `scores`, the job's `cross_scores`,
    saves the variants already scored there: s's text with prompt j's images IS prompt j when the two
    texts are equal (Sokoban's first turns), so only the blank and the swaps between different texts run.
    """
    _check_job(job, micro_batch)
    group = _swap_group(job)
    if not group:
        return None
    in_group = {column: index for index, column in enumerate(group)}
    visual = torch.zeros((len(job.reasonings), len(group)), dtype=torch.float32)
    matched = torch.zeros(len(job.reasonings), dtype=torch.float32)
    blank = torch.zeros(len(job.reasonings), dtype=torch.float32)
    with torch.inference_mode(), eval_mode(model):
        for source, prompt in enumerate(job.prompts):
            rows_of = [i for i, r in enumerate(job.reasonings) if r.source == source]
            if not prompt.images or not rows_of:
                continue
            swaps = group if source in in_group else [source]
            gray = [Image.new("RGB", image.size, BLANK_GRAY) for image in prompt.images]
            image_sets = [job.prompts[column].images for column in swaps] + [gray]
            known = {
                variant: column
                for variant, column in enumerate(swaps)
                if scores is not None and job.prompts[column].token_ids == prompt.token_ids
            }
            todo = [variant for variant in range(len(image_sets)) if variant not in known]
            prefix = _run_prefix(model, processor, prompt.token_ids, [image_sets[v] for v in todo])
            rows = [(k, job.reasonings[i]) for k in range(len(todo)) for i in rows_of]
            scored = torch.zeros((len(image_sets), len(rows_of)), dtype=torch.float32)
            scored[todo] = _score_from_prefix(model, prefix, rows, micro_batch).view(len(todo), len(rows_of))
            for variant, column in known.items():
                scored[variant] = scores[rows_of, column]
            own = swaps.index(source)
            matched[rows_of], blank[rows_of] = scored[own], scored[-1]
            if source in in_group:
                visual[rows_of] = scored[:-1].T
    image_rows = [i for i, r in enumerate(job.reasonings) if job.prompts[r.source].images]
    group_rows = [i for i in image_rows if job.reasonings[i].source in in_group]
    identity = _Identities()
    lengths = job.lengths()
    return ImageProbe(
        visual_scores=visual[group_rows],
        lengths=lengths[group_rows],
        source=torch.tensor([in_group[job.reasonings[i].source] for i in group_rows], dtype=torch.long),
        prompt_ids=torch.tensor([identity(_image_digest(job.prompts[c].images)) for c in group], dtype=torch.long),
        prompt_index=torch.tensor(group, dtype=torch.long),
        reasoning_index=torch.tensor(group_rows, dtype=torch.long),
        matched=matched[image_rows],
        blank=blank[image_rows],
        blank_lengths=lengths[image_rows],
        blank_reasoning_index=torch.tensor(image_rows, dtype=torch.long),
    )


def image_probe_metrics(
    probe: ImageProbe, ema_state: dict[str, Tensor] | None = None
) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """`mi_metrics` of the swap matrix with keys prefixed `visual_`, plus `blank_drop` (0-dim float32).

    The swap metrics need >= 2 prompts in the swap group and >= 1 reasoning from it; otherwise
    only blank_drop is returned and the EMA state passes through unchanged.
    """
    metrics = {"blank_drop": probe.blank_drop.to(torch.float32)} if len(probe.matched) else {}
    if probe.visual_scores.shape[1] < 2 or probe.visual_scores.shape[0] < 1:
        return metrics, ema_state
    swap, new_state = mi_metrics(
        probe.visual_scores, probe.lengths, probe.source, ema_state=ema_state, prompt_ids=probe.prompt_ids
    )
    metrics.update({f"visual_{name}": value for name, value in swap.items()})
    return metrics, new_state
