"""The transformers engine on tiny random models built here: batching, log-probs, sampling, stops, errors."""

import pytest
import torch
from PIL import Image
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from vagen.engines import ENGINES, Context, EngineSource, Generation, HFEngine, SamplingParams, build_engine
from vagen.engines.hf import distinct_contexts, restrict_to_top_k, restrict_to_top_p, sample_next_tokens

VOCAB = 64
IMAGE_PAD, VISION_START, VISION_END, VIDEO_PAD = 60, 61, 62, 63
MERGE = 2
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
# A larger init than the default makes next-token distributions peaked, so greedy picks are not
# near-ties that float rounding under different padding could flip.
INIT_RANGE = 0.3


@pytest.fixture(scope="module")
def text_model():
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=INIT_RANGE,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def vl_model():
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0},
            initializer_range=INIT_RANGE,
            bos_token_id=0,
            eos_token_id=1,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            patch_size=14,
            spatial_merge_size=MERGE,
            temporal_patch_size=2,
            fullatt_block_indexes=[1],
            window_size=56,
        ),
        image_token_id=IMAGE_PAD,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        video_token_id=VIDEO_PAD,
        initializer_range=INIT_RANGE,
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def image_processor():
    return Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 56)


def text_contexts(lengths=(3, 9, 5, 14), seed=1) -> list[Context]:
    generator = torch.Generator().manual_seed(seed)
    return [Context(torch.randint(2, IMAGE_PAD, (n,), generator=generator).tolist()) for n in lengths]


def image_block(image: Image.Image, image_processor) -> list[int]:
    grid = image_processor(images=[image], return_tensors="pt")["image_grid_thw"][0]
    return [VISION_START] + [IMAGE_PAD] * (int(grid.prod()) // MERGE**2) + [VISION_END]


def vl_contexts(image_processor) -> list[Context]:
    """Contexts of different lengths: two images, one image, none (text rows ride in a VL batch too)."""
    red, green = Image.new("RGB", (56, 56), (200, 30, 30)), Image.new("RGB", (30, 50), (20, 220, 60))
    blue = Image.new("RGB", (40, 40), (10, 10, 240))
    return [
        Context(
            [5, 6, *image_block(red, image_processor), 7, *image_block(green, image_processor), 8, 9],
            [red, green],
        ),
        Context([10, 11, 12, *image_block(blue, image_processor), 13], [blue]),
        Context([14, 15, 16, 17]),
    ]


def teacher_forced_logprobs(
    model, context: Context, generation: Generation, image_processor=None, temperature: float = 0.0
) -> torch.Tensor:
    """Log-probs of the generated ids from ONE plain forward over prompt + generation (the trainer's view), under
    the distribution sampled from: image / video pads banned, logits / temperature (greedy: T = 1)."""
    ids = torch.tensor([context.token_ids + generation.token_ids])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if context.images:
        inputs.update(image_processor(images=context.images, return_tensors="pt"))
        inputs["mm_token_type_ids"] = (ids == IMAGE_PAD).int()
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()  # (L, V)
    prompt_len = len(context.token_ids)
    if image_processor is not None:  # a vision-language model never samples its pads
        logits[:, [IMAGE_PAD, VIDEO_PAD]] = float("-inf")
    logprobs = torch.log_softmax(logits[prompt_len - 1 : -1] / (temperature or 1.0), dim=-1)
    return logprobs.gather(-1, ids[0, prompt_len:, None]).squeeze(-1)


def assert_same_generations(got: list[Generation], want: list[Generation], atol=1e-4):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=atol, rtol=0)


def test_text_batched_greedy_equals_each_context_alone(text_model):
    engine = HFEngine(text_model)
    contexts = text_contexts()
    batched = engine.generate(contexts, GREEDY)
    alone = [engine.generate([c], GREEDY)[0] for c in contexts]
    assert_same_generations(batched, alone)
    assert all(len(g.token_ids) == GREEDY.max_new_tokens and g.finish_reason == "length" for g in batched)
    assert len({tuple(g.token_ids) for g in batched}) > 1, "different prompts should give different outputs"


def test_multimodal_batched_greedy_equals_each_context_alone(vl_model, image_processor):
    engine = HFEngine(vl_model, image_processor)
    contexts = vl_contexts(image_processor)
    batched = engine.generate(contexts, GREEDY)
    alone = [engine.generate([c], GREEDY)[0] for c in contexts]
    assert_same_generations(batched, alone)
    # This random model's favourite token is the image pad; the engine must never sample it.
    assert not any({IMAGE_PAD, VIDEO_PAD} & set(g.token_ids) for g in batched)


def test_micro_batches_equal_one_batch(text_model):
    contexts = text_contexts(lengths=(3, 9, 5, 14, 2, 7))
    one_batch = HFEngine(text_model).generate(contexts, GREEDY)
    micro = HFEngine(text_model, max_batch_size=4).generate(contexts, GREEDY)
    assert_same_generations(micro, one_batch)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_text_logprobs_equal_teacher_forced_recomputation(text_model, temperature):
    sampling = SamplingParams(max_new_tokens=10, temperature=temperature, seed=3)
    contexts = text_contexts()
    for context, generation in zip(contexts, HFEngine(text_model).generate(contexts, sampling), strict=True):
        recomputed = teacher_forced_logprobs(text_model, context, generation, temperature=temperature)
        torch.testing.assert_close(torch.tensor(generation.logprobs), recomputed, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_multimodal_logprobs_equal_teacher_forced_recomputation(vl_model, image_processor, temperature):
    sampling = SamplingParams(max_new_tokens=10, temperature=temperature, seed=3)
    contexts = vl_contexts(image_processor)
    for context, generation in zip(
        contexts, HFEngine(vl_model, image_processor).generate(contexts, sampling), strict=True
    ):
        recomputed = teacher_forced_logprobs(vl_model, context, generation, image_processor, temperature)
        torch.testing.assert_close(torch.tensor(generation.logprobs), recomputed, atol=1e-4, rtol=0)


def test_images_change_the_output(vl_model, image_processor):
    """The pixels reach the model: another image under the same pads gives other log-probs."""
    engine = HFEngine(vl_model, image_processor)
    context = vl_contexts(image_processor)[1]
    recoloured = Context(context.token_ids, [Image.new("RGB", (40, 40), (250, 250, 0))])
    a, b = engine.generate([context, recoloured], SamplingParams(max_new_tokens=1, temperature=0.0))
    assert abs(a.logprobs[0] - b.logprobs[0]) > 1e-4 or a.token_ids != b.token_ids


def test_seeded_sampling_is_reproducible(text_model):
    engine = HFEngine(text_model)
    contexts = text_contexts(lengths=(4,) * 8)
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, top_k=20, seed=7)
    first = engine.generate(contexts, sampling)
    assert_same_generations(engine.generate(contexts, sampling), first, atol=0)
    other_seed = engine.generate(contexts, SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=8))
    assert [g.token_ids for g in other_seed] != [g.token_ids for g in first]


def test_stop_tokens_end_each_sequence_where_they_first_appear(text_model):
    engine = HFEngine(text_model)
    contexts = text_contexts()
    free = engine.generate(contexts, GREEDY)
    stop = free[0].token_ids[3]  # a token the first context is known to emit
    stopped = engine.generate(contexts, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=[stop]))
    assert stopped[0].finish_reason == "stop"
    for full, cut in zip(free, stopped, strict=True):
        if stop in full.token_ids:
            end = full.token_ids.index(stop) + 1
            assert (cut.token_ids, cut.finish_reason) == (full.token_ids[:end], "stop")
            assert cut.logprobs == pytest.approx(full.logprobs[:end], abs=1e-5)
        else:
            assert (cut.token_ids, cut.finish_reason) == (full.token_ids, "length")


def test_max_new_tokens_is_respected(text_model):
    generations = HFEngine(text_model).generate(text_contexts(), SamplingParams(max_new_tokens=3, temperature=1.0))
    assert [len(g.token_ids) for g in generations] == [3] * 4
    assert all(len(g.logprobs) == 3 and g.finish_reason == "length" for g in generations)


def test_top_k_one_and_tiny_top_p_sample_the_argmax(text_model):
    engine, contexts = HFEngine(text_model), text_contexts()
    greedy = engine.generate(contexts, GREEDY)
    for sampling in (SamplingParams(12, temperature=1.5, top_k=1, seed=0), SamplingParams(12, 1.5, top_p=1e-6, seed=0)):
        sampled = engine.generate(contexts, sampling)
        assert [g.token_ids for g in sampled] == [g.token_ids for g in greedy]
        # One token left to sample from: its log-prob under the distribution sampled from is 0.
        assert all(logprob == 0.0 for g in sampled for logprob in g.logprobs)


def test_truncation_filters_keep_the_right_tokens():
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]))
    assert torch.isfinite(restrict_to_top_k(scores, 2)).tolist() == [
        [True, True, False, False],
        [False, False, True, True],
    ]
    # 0.5 < 0.7 so the second token is needed; 0.5 + 0.3 >= 0.7 so the third is not.
    assert torch.isfinite(restrict_to_top_p(scores, 0.7)).tolist() == [
        [True, True, False, False],
        [False, False, True, True],
    ]
    assert torch.equal(restrict_to_top_p(scores, 1.0), scores)


def test_banned_ids_are_never_sampled_and_logprobs_are_the_sampled_distributions():
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0], [0.0, 1.0, 5.0, 2.0]])
    banned = torch.tensor([0, 2])
    tokens, logprobs = sample_next_tokens(logits, GREEDY, None, banned)
    assert tokens.tolist() == [1, 3]
    allowed = logits[:, [1, 3]]  # the ban removes ids 0 and 2 from the distribution
    torch.testing.assert_close(logprobs, torch.log_softmax(allowed, -1)[[0, 1], [0, 1]])
    hot = SamplingParams(temperature=0.5, top_k=1, seed=0)  # top-k 1 leaves one token: log-prob 0
    torch.testing.assert_close(sample_next_tokens(logits, hot, None, banned)[1], torch.zeros(2))
    sampled, _ = sample_next_tokens(logits.repeat(50, 1), SamplingParams(temperature=2.0, seed=0), None, banned)
    assert not set(sampled.tolist()) & {0, 2}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": 1.5}, "seed"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
    ],
)
def test_bad_sampling_params_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_contexts_raise_clear_errors(text_model, vl_model, image_processor):
    with pytest.raises(ValueError, match="no token ids"):
        HFEngine(text_model).generate([Context([])], GREEDY)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        HFEngine(text_model).generate([Context([3, VOCAB + 5])], GREEDY)
    with pytest.raises(ValueError, match="takes no images"):
        HFEngine(text_model).generate([Context([3, 4], [Image.new("RGB", (28, 28))])], GREEDY)
    good = vl_contexts(image_processor)[1]
    with pytest.raises(ValueError, match="image pad tokens"):
        HFEngine(vl_model, image_processor).generate([Context([*good.token_ids, IMAGE_PAD], good.images)], GREEDY)
    with pytest.raises(ValueError, match="no image processor"):
        HFEngine(vl_model).generate([good], GREEDY)
    with pytest.raises(ValueError, match="no images"):
        HFEngine(vl_model, image_processor).generate([Context(good.token_ids)], GREEDY)


def test_registry_builds_the_engine_with_one_signature(text_model):
    assert "hf" in ENGINES
    engine = build_engine("hf", EngineSource(model=text_model), max_batch_size=2)
    assert isinstance(engine, HFEngine) and engine.max_batch_size == 2
    assert engine.generate([], GREEDY) == []
    with pytest.raises(ValueError, match=r"EngineSource\.model is None"):
        build_engine("hf", EngineSource(model_path="some/folder"))
    with pytest.raises(ValueError, match="Unknown engine"):
        build_engine("no-such-engine", EngineSource(model=text_model))


def test_update_weights_copies_new_weights_and_restores_train_mode(text_model):
    clone = Qwen2ForCausalLM(text_model.config)
    clone.load_state_dict(text_model.state_dict())
    engine = HFEngine(clone)
    contexts = text_contexts()
    engine.update_weights(clone.state_dict())  # its own tensors: nothing to do
    before = engine.generate(contexts, GREEDY)
    torch.manual_seed(5)
    other = Qwen2ForCausalLM(text_model.config).eval()
    engine.update_weights(other.state_dict())
    clone.train()
    after = engine.generate(contexts, GREEDY)
    assert clone.training, "generate must give the trainer its module back in train mode"
    assert_same_generations(after, HFEngine(other).generate(contexts, GREEDY))
    assert [g.token_ids for g in after] != [g.token_ids for g in before]


def test_identical_prompts_are_prefilled_once_and_decode_as_if_alone(vl_model, image_processor, text_model):
    """A GRPO group's N copies of one prompt share one prefill; each copy still decodes exactly as that prompt alone
    (greedy ids and log-probs), in text and in image batches (the copies' images are equal pixels, other objects)."""
    text = text_contexts()
    repeated = [text[0], text[1], text[0], text[2], text[0]]
    unique, copy_of_row = distinct_contexts(repeated)
    assert [c.token_ids for c in unique] == [text[0].token_ids, text[1].token_ids, text[2].token_ids]
    assert copy_of_row == [0, 1, 0, 2, 0]
    engine = HFEngine(text_model)
    assert_same_generations(engine.generate(repeated, GREEDY), [engine.generate([c], GREEDY)[0] for c in repeated])

    first, other = vl_contexts(image_processor)[1], vl_contexts(image_processor)[1]  # equal pixels, new objects
    recoloured = Context(first.token_ids, [Image.new("RGB", (40, 40), (250, 250, 0))])  # same ids, other pixels
    batch = [first, other, recoloured]
    assert distinct_contexts(batch)[1] == [0, 0, 1]
    vl_engine = HFEngine(vl_model, image_processor)
    assert_same_generations(vl_engine.generate(batch, GREEDY), [vl_engine.generate([c], GREEDY)[0] for c in batch])


def test_inverse_cdf_sampling_follows_the_distribution_and_each_row_only_its_own_draw():
    """Row b takes the first token whose cumulative probability exceeds its draw: frequencies match the
    (tempered) softmax, and a row samples the same token alone as inside any batch."""
    logits = torch.tensor([[2.0, 0.5, -1.0, 1.0]])
    hot = SamplingParams(temperature=0.8, seed=0)
    draws = torch.rand(20_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    tokens, _ = sample_next_tokens(logits.repeat(len(draws), 1), hot, draws)
    frequencies = torch.bincount(tokens, minlength=4).double() / len(draws)
    torch.testing.assert_close(frequencies, torch.softmax(logits[0].double() / 0.8, -1), atol=0.01, rtol=0)
    mixed = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    batched, _ = sample_next_tokens(mixed, hot, draws[:6])
    alone = [int(sample_next_tokens(mixed[i : i + 1], hot, draws[i : i + 1])[0]) for i in range(6)]
    assert batched.tolist() == alone


def test_grouped_query_attention_without_copies_gives_the_same_numbers(vl_model, image_processor):
    """vagen's CPU attention (`enable_gqa` under a mask, no repeated KV heads) against transformers' `sdpa`: the same
    sampled tokens and log-probs and training logits, bit for bit, and the same gradients up to the order in which
    the grouped heads' key/value gradients are summed."""
    import copy

    from vagen.models.attention import ATTENTION, use_fast_attention

    reference, fast = copy.deepcopy(vl_model), copy.deepcopy(vl_model)
    use_fast_attention(fast)
    assert fast.config.text_config._attn_implementation == ATTENTION
    assert reference.config.text_config._attn_implementation == "sdpa"
    contexts, sampling = vl_contexts(image_processor), SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    want = HFEngine(reference, image_processor).generate(contexts, sampling)
    assert_same_generations(HFEngine(fast, image_processor).generate(contexts, sampling), want, atol=0)

    padded = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17]])
    mask = (torch.arange(8) >= torch.tensor([[3], [0]])).long()  # a left-padded row: the mask reaches attention
    grads = []
    for model in (reference, fast):
        model.zero_grad()
        logits = model(input_ids=padded, attention_mask=mask).logits
        logits.square().mean().backward()
        grads.append((logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert torch.equal(grads[0][0], grads[1][0])
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * float(a.abs().max()))


def next_turns(contexts: list[Context], generations: list[Generation], image_processor) -> list[Context]:
    """Each dialogue's next turn, as the rollout builds it: the prompt, the sampled reply, then an observation (text,
    and in image dialogues a new image)."""
    turns = []
    for k, (context, generation) in enumerate(zip(contexts, generations, strict=True)):
        reply, images = [20 + k, 21], []
        if context.images:
            images = [Image.new("RGB", (28 + 14 * k, 28), (40 * k, 90, 200))]
            reply = [*reply, *image_block(images[0], image_processor), 22]
        turns.append(Context(context.token_ids + generation.token_ids + reply, context.images + images))
    return turns


def prefill_widths(model, call) -> list[int]:
    """The widths of the multi-token forwards (prefills) that `call()` runs through `model`."""
    widths = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: widths.append(args[0].shape))
    try:
        call()
    finally:
        hook.remove()
    return [shape[1] for shape in widths if shape[1] > 1]


@pytest.mark.parametrize("kind", ["text", "image"])
def test_a_next_turn_runs_only_its_new_tokens_and_samples_as_its_whole_prompt(
    kind, text_model, vl_model, image_processor
):
    """The engine keeps each call's keys and values: a context that continues a row of the last call (the next turn
    of its dialogue) runs only its tokens and images after that row. It samples the same ids with the same log-probs
    as the whole prompt run from scratch. A context that agrees with a row in its ids but not in an image's pixels,
    or continues nothing, runs whole."""
    model, processor = (text_model, None) if kind == "text" else (vl_model, image_processor)
    first = text_contexts() if kind == "text" else [*vl_contexts(image_processor)[:2], text_contexts()[3]]
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3, stop_token_ids=[2, 3, 4, 5, 6, 7])
    kept, whole = HFEngine(model, processor), HFEngine(model, processor, keep_cache=False)
    generations = kept.generate(first, sampling)
    assert_same_generations(generations, whole.generate(first, sampling))
    turns = next_turns(first, generations, image_processor)
    if kind == "image":  # the first dialogue again, its first image recoloured: same ids, other pixels
        turns.append(Context(turns[0].token_ids, [Image.new("RGB", (56, 56), (0, 0, 0)), *turns[0].images[1:]]))
    turns.append(text_contexts(lengths=(7,), seed=9)[0])  # a dialogue that continues nothing
    got: list[Generation] = []
    widths = prefill_widths(model, lambda: got.extend(kept.generate(turns, sampling)))
    assert_same_generations(got, whole.generate(turns, sampling))
    continuing = len(first)
    new_tokens = [
        len(turns[k].token_ids) - len(first[k].token_ids) - len(generations[k].token_ids) + 1 for k in range(continuing)
    ]
    assert widths == [max(len(c.token_ids) for c in turns[continuing:]), max(new_tokens)]


def test_kept_rows_are_dropped_when_the_weights_change(text_model):
    """An optimizer step (any in-place write) between two calls: the next turn runs its whole prompt, under the new
    weights, exactly as an engine that keeps nothing samples it."""
    model = Qwen2ForCausalLM(text_model.config).eval()
    model.load_state_dict(text_model.state_dict())
    engine = HFEngine(model)
    first = text_contexts()
    turns = next_turns(first, engine.generate(first, GREEDY), None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.tensor([turns[0].token_ids])).logits.sum().backward()
    optimizer.step()
    got: list[Generation] = []
    widths = prefill_widths(model, lambda: got.extend(engine.generate(turns, GREEDY)))
    assert widths == [max(len(c.token_ids) for c in turns)]
    assert_same_generations(got, HFEngine(model, keep_cache=False).generate(turns, GREEDY), atol=0)
