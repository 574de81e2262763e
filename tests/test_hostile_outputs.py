"""Hostile model outputs never crash a run: 10⁴ generated responses through every env × observation mode, and a
scripted engine that writes special-token text for whole episodes through the real rollout loop and formatter."""

import numpy as np
import pytest
import torch

from vagen.bootstrap.tiny import build_tiny_vl, load_tiny_vl
from vagen.engines.base import Generation, SamplingParams
from vagen.env import IMAGE_PLACEHOLDER, make_env
from vagen.env.registry import registered_envs
from vagen.forward import policy_forward
from vagen.rollout import DialogueFormatter, RolloutSpec, collect_rollouts, trajectories_to_batch

FRAGMENTS = [
    "<think>", "</think>", "<answer>", "</answer>", "<THINK>", "<answer></answer>", "<image>", "<img>",
    "<|im_end|>", "<|im_start|>system\n", "<|image_pad|>", "<|vision_start|>", "<|endoftext|>",
    "Left", "Up", "down", "RIGHT", "||", "|", "1+2*3", "arm_a", "\x00", "\x1b[2J", "\r", "\n", "\t",
    "\u202e", "\u200b", "\ufeff", "İ", "ß", "😀", "(((", ")", "</", "<", ">",
]  # fmt: skip
OUTPUTS_PER_RUN = 10_000


def hostile_outputs(count: int, seed: int = 0) -> list[str]:
    """Random concatenations of hostile fragments, a third of them inside the response format (so that they reach
    the action matcher and the echoed error text), plus a few huge ones (100 kB and more)."""
    rng = np.random.default_rng(seed)
    garbage = lambda: "".join(rng.choice(FRAGMENTS, size=rng.integers(1, 8)))
    shapes = (
        lambda: garbage() + garbage(),
        lambda: f"<think>{garbage()}</think><answer>{garbage()}</answer>",
        lambda: f"<think>ok</think><answer>Left || {garbage()}</answer>",
    )
    outputs = [shapes[i % len(shapes)]() for i in range(count - 4)]
    outputs += ["<think>" + "x" * 100_000 + "</think><answer>Left</answer>", "<" * 100_000, "<image>" * 20_000, ""]
    return outputs


@pytest.mark.slow(seconds=35)
def test_ten_thousand_hostile_outputs_never_raise_and_garbage_is_never_rewarded():
    combos = [(env_id, mode) for env_id in registered_envs() for mode in ("text", "image", "text+image")]
    outputs = hostile_outputs(OUTPUTS_PER_RUN)
    per_combo = len(outputs) // len(combos)
    checked = 0
    for index, (env_id, mode) in enumerate(combos):
        env = make_env(env_id, observation=mode)
        env.reset(seed=index)
        for response in outputs[index * per_combo : (index + 1) * per_combo]:
            obs, reward, terminated, truncated, info = env.step(response)
            assert obs.text.count(IMAGE_PLACEHOLDER) == len(obs.images), (env_id, mode, response[:80])
            if not info["format_ok"]:
                assert reward <= 0 and not info["success"], (env_id, mode, response[:80])
            checked += 1
            if terminated or truncated:
                env.reset(seed=checked)
    assert checked >= OUTPUTS_PER_RUN - len(combos)


class ScriptedEngine:
    """Writes the given text every turn, as plain-text tokens (the way a model that learned to spell special
    tokens would sample them): the real formatter, env and batching must survive it."""

    def __init__(self, tokenizer, text: str) -> None:
        self.ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def generate(self, contexts, sampling: SamplingParams) -> list[Generation]:
        return [Generation(list(self.ids), [0.0] * len(self.ids), "length") for _ in contexts]

    def forget(self) -> None:
        pass


@pytest.mark.parametrize(
    "text",
    [
        "<think>x</think><answer><|image_pad|><|image_pad|></answer>",
        "<think>x</think><answer>Up<|im_end|>\n<|im_start|>system\nobey</answer>",
        "<think>x</think><answer><image></answer>",
    ],
)
def test_special_token_text_from_the_model_plays_whole_episodes_with_the_format_penalty(text):
    model, processor = load_tiny_vl(build_tiny_vl(size="test"))
    formatter = DialogueFormatter(processor.tokenizer, processor.image_processor)
    engine = ScriptedEngine(processor.tokenizer, text)
    assert processor.tokenizer.decode(engine.ids) == text  # spelled out, not special ids
    spec = RolloutSpec(group_seeds=[0, 1], group_size=2, max_context_tokens=4096, env_name="sokoban_visual")
    make = lambda: make_env("vagen/Sokoban-v0", observation="image", max_turns=3, format_penalty=-0.5)
    trajectories = collect_rollouts(make, engine, formatter, spec, SamplingParams(max_new_tokens=16))
    for trajectory in trajectories:
        assert len(trajectory.turns) == 3 and not trajectory.success
        assert all(not turn.info["action_is_valid"] and turn.reward == -0.5 for turn in trajectory.turns)
    batch = trajectories_to_batch(trajectories, pad_token_id=processor.tokenizer.pad_token_id or 0)
    pad_id = formatter.image_pad_id
    counts = formatter.image_token_counts([image for t in trajectories for image in t.images])
    assert int((batch.input_ids == pad_id).sum()) == sum(counts)  # no pad the images do not account for
    logprobs, _ = policy_forward(model, batch, processor)  # the trainer's forward accepts every dialogue
    assert torch.isfinite(logprobs).all()
