"""Cross-scoring for the MI proxies: shared-prefix scores equal the naive reference, jobs, think spans, image probe."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

from vagen.bootstrap.tiny import build_tiny_text_lm, build_tiny_vl, load_tiny_text_lm, load_tiny_vl
from vagen.diagnostics.mi import mi_metrics
from vagen.diagnostics.scoring import (
    Reasoning,
    ScoringJob,
    ScoringPrompt,
    build_scoring_job,
    cross_scores,
    image_probe,
    image_probe_metrics,
    naive_cross_scores,
    think_span,
    turn_context,
)
from vagen.engines import HFEngine, SamplingParams
from vagen.env import make_env
from vagen.env.policies import POLICIES
from vagen.rollout import DialogueFormatter, RolloutSpec, Trajectory, Turn, collect_rollouts


@pytest.fixture(scope="module")
def tiny_vl():
    return load_tiny_vl(build_tiny_vl(size="test"))


@pytest.fixture(scope="module")
def tiny_text():
    return load_tiny_text_lm(build_tiny_text_lm(size="test"))


def sokoban_visual():
    return make_env("vagen/Sokoban-v0", observation="image", tile_px=28, max_turns=3)


def solver_trajectories(processor, group_seeds, group_size, max_turns=2):
    """Trajectories whose responses are the tokenised solver responses: every turn has a valid think block."""
    formatter = DialogueFormatter(processor.tokenizer, processor.image_processor)
    solver, trajectories = POLICIES.get("solver"), []
    for group_id, seed in enumerate(group_seeds):
        for _ in range(group_size):
            env, trajectory = sokoban_visual(), Trajectory(group_id=group_id, seed=seed, env_name="sokoban")
            obs, _ = env.reset(seed=seed)
            prompt = formatter.first_prompt(obs)
            for _ in range(max_turns):
                text = solver(env, np.random.default_rng(0))
                ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
                turn = Turn(obs.text, list(obs.images), prompt, ids, response_text=text)
                turn.close_ids = formatter.close_ids(ids, "length")
                trajectory.turns.append(turn)
                obs, turn.reward, terminated, truncated, turn.info = env.step(text)
                if terminated or truncated:
                    break
                prompt = formatter.next_prompt(obs)
            trajectories.append(trajectory)
    return trajectories


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---- think_span ------------------------------------------------------------------------------
def test_think_span_on_sampled_ids(tiny_vl):
    tokenizer = tiny_vl[1].tokenizer
    ids = encode(tokenizer, "<think>abc</think><answer>Up</answer>")
    start, end = think_span(ids, tokenizer)
    assert tokenizer.decode(ids[start:end]) == "abc"
    assert tokenizer.decode(ids[:start]) == "<think>" and tokenizer.decode(ids[end:]).startswith("</think>")
    # Preamble before the block; z may contain other tags.
    ids = encode(tokenizer, "ok <think><b>go</b></think>")
    start, end = think_span(ids, tokenizer)
    assert tokenizer.decode(ids[start:end]).endswith("go</b>")
    for text in ("<answer>Up</answer>", "<think>abc <answer>Up</answer>", "<think></think><answer>Up</answer>", ""):
        assert think_span(encode(tokenizer, text), tokenizer) is None, text


def test_think_span_tokens_straddling_a_tag_belong_to_the_tag(tiny_vl):
    tokenizer = tiny_vl[1].tokenizer
    # '><' completes `<think>` and starts z; '.</' ends z and starts `</think>`: both stay out of z.
    pieces = ["<", "think", "><", "b", ">", "Up", ".</", "think", ">"]
    ids = [tokenizer.convert_tokens_to_ids(piece) for piece in pieces]
    assert tokenizer.decode(ids) == "<think><b>Up.</think>"
    assert think_span(ids, tokenizer) == (3, 6)


# ---- shared == naive ---------------------------------------------------------------------------
def assert_scores_equal(shared, naive, lengths):
    """Per token (what MI-Est uses) within 1e-5 nats; sums of ~100 fp32 log-probs within 1e-4 or 1e-6 relative."""
    per_token = lengths[:, None].float()
    torch.testing.assert_close(shared / per_token, naive / per_token, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared, naive, atol=1e-4, rtol=1e-6)


def text_job(tokenizer):
    prompts = [
        ScoringPrompt(encode(tokenizer, text), [], identity)
        for identity, text in enumerate(["Go.", "The box is left of the wall, move now.", "x"])
    ]
    reasonings = []
    for source, text in enumerate(
        ["<think>The box is left.</think>", "<think>up</think>", "<think>a b c d e f</think>"]
    ):
        ids = encode(tokenizer, text)
        start, end = think_span(ids, tokenizer)
        reasonings.append(Reasoning(ids[:end], (start, end), source))
    reasonings.append(Reasoning(encode(tokenizer, "Move up"), (0, 2), 1))  # z at index 0: predicted by x[-1]
    return ScoringJob(prompts, reasonings)


def test_shared_scores_equal_naive_for_a_text_model(tiny_text):
    model, tokenizer = tiny_text
    job = text_job(tokenizer)
    model.train()
    shared, lengths = cross_scores(model, tokenizer, job, micro_batch=3)
    assert model.training  # mode restored
    model.eval()
    naive, _ = naive_cross_scores(model, tokenizer, job)
    assert shared.shape == (4, 3) and shared.dtype == torch.float32
    assert lengths.tolist() == [r.span[1] - r.span[0] for r in job.reasonings]
    assert (shared < 0).all()
    assert_scores_equal(shared, naive, lengths)
    assert not torch.allclose(shared[:, 0], shared[:, 1])  # the prompt matters


@pytest.mark.parametrize("scope", ["first_turn", "trajectory"])
def test_shared_scores_equal_naive_for_image_prompts(tiny_vl, scope):
    model, processor = tiny_vl
    trajectories = solver_trajectories(processor, group_seeds=[0, 1, 2], group_size=1)
    job = build_scoring_job(trajectories, processor.tokenizer, scope, max_prompts=4, max_reasonings=4)
    assert len(job.prompts) >= 3 and all(p.images for p in job.prompts)
    assert len({len(p.token_ids) for p in job.prompts}) > 1 or scope == "first_turn"
    shared, lengths = cross_scores(model, processor, job, micro_batch=2)
    naive, _ = naive_cross_scores(model, processor, job)
    assert_scores_equal(shared, naive, lengths)
    assert len(set(lengths.tolist())) > 1  # reasonings of different lengths


# ---- jobs ---------------------------------------------------------------------------------------
def test_first_turn_job_from_real_rollouts(tiny_vl):
    model, processor = tiny_vl
    formatter = DialogueFormatter(processor.tokenizer, processor.image_processor)
    spec = RolloutSpec(group_seeds=[0, 1], group_size=2, max_context_tokens=4096)
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    trajectories = collect_rollouts(sokoban_visual, HFEngine(model, processor), formatter, spec, sampling)
    job = build_scoring_job(trajectories, processor.tokenizer, "first_turn")
    assert [p.token_ids for p in job.prompts] == [
        trajectories[0].turns[0].prompt_ids,
        trajectories[2].turns[0].prompt_ids,
    ]
    assert job.prompt_ids().tolist() == [0, 1]
    assert all(len(p.images) == 1 for p in job.prompts)
    assert job.stats["candidates"] == 4 and len(job.reasonings) == job.stats["with_think"]
    for reasoning in job.reasonings:  # the random model rarely closes a think block; any it did must be right
        index, turn = reasoning.origin
        assert reasoning.source == trajectories[index].group_id and turn == 0


def test_first_turn_job_groups_and_identities(tiny_vl):
    processor = tiny_vl[1]
    trajectories = solver_trajectories(processor, group_seeds=[0, 1, 0], group_size=2, max_turns=1)
    job = build_scoring_job(trajectories, processor.tokenizer, "first_turn")
    assert len(job.prompts) == 3 and len(job.reasonings) == 6
    assert job.source().tolist() == [0, 0, 1, 1, 2, 2]
    assert job.prompt_ids().tolist() == [0, 1, 0]  # groups 0 and 2 play the same seed: identical prompts
    reasoning = job.reasonings[2]
    response = trajectories[2].turns[0].response_ids
    assert reasoning.prefix_ids == response[: reasoning.span[1]]
    assert processor.tokenizer.decode(response[slice(*reasoning.span)]).startswith("Player at")
    capped = build_scoring_job(trajectories, processor.tokenizer, "first_turn", max_prompts=2, max_reasonings=3)
    assert len(capped.prompts) == 2 and len(capped.reasonings) == 3
    assert max(capped.source().tolist()) <= 1


def test_trajectory_job_samples_turns_deterministically(tiny_vl):
    processor = tiny_vl[1]
    trajectories = solver_trajectories(processor, group_seeds=[0, 1, 2], group_size=2, max_turns=3)
    total = sum(len(t.turns) for t in trajectories)

    def build(seed, cap=5):
        rng = np.random.default_rng(seed)
        return build_scoring_job(trajectories, processor.tokenizer, "trajectory", max_prompts=cap, rng=rng)

    job = build(0)
    assert job.stats == {"candidates": total, "with_think": total}
    assert len(job.prompts) == len(job.reasonings) == 5 and job.source().tolist() == list(range(5))
    assert [r.origin for r in build(0).reasonings] == [r.origin for r in job.reasonings]
    draws = {tuple(r.origin for r in build(seed).reasonings) for seed in range(6)}
    assert len(draws) > 1
    for prompt, reasoning in zip(job.prompts, job.reasonings, strict=True):
        index, turn = reasoning.origin
        ids, images = turn_context(trajectories[index], turn)
        assert prompt.token_ids == ids and len(prompt.images) == turn + 1 == len(images)
        full, mask = trajectories[index].token_ids_and_mask()
        start = len(ids)
        assert mask[start] == 1 and full[start : start + len(reasoning.prefix_ids)] == reasoning.prefix_ids
    everything = build(0, cap=total)
    identity = {r.origin: p.identity for p, r in zip(everything.prompts, everything.reasonings, strict=True)}
    assert identity[(0, 0)] == identity[(1, 0)] != identity[(2, 0)]  # same group, first turn: identical


def test_job_errors_name_the_fix(tiny_vl):
    with pytest.raises(ValueError, match="max_prompts"):
        build_scoring_job([], tiny_vl[1].tokenizer, "first_turn", max_prompts=1)
    with pytest.raises(ValueError, match="Nothing to score"):
        cross_scores(tiny_vl[0], tiny_vl[1], ScoringJob([], []))


# ---- image probe and metrics --------------------------------------------------------------------
def test_image_probe_swaps_images_under_the_source_text(tiny_vl):
    model, processor = tiny_vl
    trajectories = solver_trajectories(processor, group_seeds=[0, 1, 2, 0], group_size=1, max_turns=1)
    job = build_scoring_job(trajectories, processor.tokenizer, "first_turn")
    scores, _ = cross_scores(model, processor, job)
    probe = image_probe(model, processor, job, micro_batch=3)
    assert probe.visual_scores.shape == (4, 4) and probe.prompt_ids.tolist() == [0, 1, 2, 0]
    matched = probe.visual_scores.gather(1, probe.source[:, None]).squeeze(1)
    torch.testing.assert_close(matched, scores.diagonal(), atol=1e-5, rtol=0)  # own image = matched score
    torch.testing.assert_close(probe.matched, scores.diagonal(), atol=1e-5, rtol=0)
    torch.testing.assert_close(probe.visual_scores[:, 0], probe.visual_scores[:, 3], atol=1e-5, rtol=0)
    # Reference: the text of prompt 1 with the image of prompt 2, scored naively.
    swapped = ScoringPrompt(job.prompts[1].token_ids, job.prompts[2].images, 0)
    gray = [Image.new("RGB", image.size, (128, 128, 128)) for image in job.prompts[1].images]
    blank = ScoringPrompt(job.prompts[1].token_ids, gray, 1)
    reference, _ = naive_cross_scores(model, processor, ScoringJob([swapped, blank], [job.reasonings[1]]))
    assert math.isclose(probe.visual_scores[1, 2], reference[0, 0], abs_tol=1e-4)
    assert math.isclose(probe.blank[1], reference[0, 1], abs_tol=1e-4)
    assert torch.isfinite(probe.blank_drop) and probe.blank_drop != 0
    metrics, ema = image_probe_metrics(probe)
    assert {"blank_drop", "visual_retrieval_acc", "visual_mi_est", "visual_mi_upper_bound"} <= set(metrics)
    # Prompts 0 and 3 show the same image: their z have 2 indistinguishable columns, the others 1.
    assert math.isclose(metrics["visual_mi_upper_bound"], (2 * math.log(2) + 2 * math.log(4)) / 4, rel_tol=1e-5)
    assert ema is not None


def test_image_probe_reuses_cross_scores_exactly(tiny_vl):
    """Given the job's cross scores, the probe skips the swaps whose text equals the image's own prompt (all of
    them for Sokoban first turns) and gets the same numbers as scoring every variant."""
    model, processor = tiny_vl
    trajectories = solver_trajectories(processor, group_seeds=[0, 1, 2], group_size=1, max_turns=1)
    job = build_scoring_job(trajectories, processor.tokenizer, "first_turn")
    assert len({tuple(p.token_ids) for p in job.prompts}) == 1  # same text, different images
    scores, _ = cross_scores(model, processor, job)
    full = image_probe(model, processor, job, micro_batch=3)
    reused = image_probe(model, processor, job, micro_batch=3, scores=scores)
    # The scores are sums of hundreds of log-probs (|score| ~ 450, where one float32 ulp is 3e-5), computed in
    # differently composed batches: equal up to summation order, so the tolerance is relative.
    for name in ("visual_scores", "matched", "blank"):
        torch.testing.assert_close(getattr(reused, name), getattr(full, name), atol=1e-5, rtol=1e-6)


def test_image_probe_keeps_to_one_image_signature(tiny_vl):
    model, processor = tiny_vl
    trajectories = solver_trajectories(processor, group_seeds=[0, 1, 2], group_size=1, max_turns=2)
    job = build_scoring_job(trajectories, processor.tokenizer, "trajectory", max_prompts=6)
    counts = [len(p.images) for p in job.prompts]
    probe = image_probe(model, processor, job)
    group = probe.prompt_index.tolist()
    majority = max(set(counts), key=counts.count)
    assert len(group) == counts.count(majority) and all(counts[c] == majority for c in group)
    assert len(probe.blank) == len(job.reasonings)  # blank scores for every image reasoning
    assert image_probe(tiny_vl[0], processor, ScoringJob([ScoringPrompt([5, 6], [], 0)], job.reasonings[:1])) is None


def test_cross_scores_feed_mi_metrics(tiny_vl):
    model, processor = tiny_vl
    trajectories = solver_trajectories(processor, group_seeds=[0, 1, 2], group_size=2, max_turns=1)
    job = build_scoring_job(trajectories, processor.tokenizer, "first_turn")
    scores, lengths = cross_scores(model, processor, job)
    metrics, ema = mi_metrics(scores, lengths, job.source(), prompt_ids=job.prompt_ids())
    assert {"mi_est", "mi_zscore_ema", "retrieval_acc", "h_cond_est", "mi_upper_bound"} <= set(metrics)
    assert math.isclose(metrics["mi_upper_bound"], math.log(3), rel_tol=1e-5)
    assert all(torch.isfinite(value) for value in metrics.values()) and ema["num_updates"] == 1
