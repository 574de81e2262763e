"""Warm-start SFT of the tiny VL: demonstration structure, the SFT loss going down, and the cached build."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from envs_text import sokoban as codes
from vagen.models.cache import read_stamp
from vagen.models.tiny import build_tiny_vl, load_tiny_vl
from vagen.models.warmstart import (
    DIRECTIONS,
    SHIPPED_DIR,
    WarmStartRecipe,
    build_warm_tiny_vl,
    demonstrations,
    evaluate_model,
    held_out_seeds,
    make_sokoban_visual,
    play_demo,
    pretrain_vision,
    read_report,
    sft_batch,
    sft_loss,
    sokoban_think,
    tile_direction_labels,
    train_sft,
)
from vagen.rollout import DialogueFormatter

TEST_RECIPE = WarmStartRecipe(
    size="test",
    train_episodes=6,
    steps=3,
    batch_size=3,
    warmup_steps=1,
    bf16=False,
    vision_steps=2,
    vision_batch_size=4,
    eval_episodes=2,
    max_new_tokens=16,
)


@pytest.fixture(scope="module")
def tiny_vl():
    return load_tiny_vl(build_tiny_vl(size="test"))


@pytest.fixture(scope="module")
def formatter(tiny_vl):
    _, processor = tiny_vl
    return DialogueFormatter(processor.tokenizer, processor.image_processor)


def test_think_text_names_relative_directions():
    grid = np.full((6, 6), codes.WALL, dtype=np.uint8)
    grid[1:5, 1:5] = codes.FLOOR
    grid[1, 3], grid[2, 2], grid[4, 3] = codes.PLAYER, codes.BOX, codes.TARGET
    assert sokoban_think(grid) == "box is down-left of me, target is down-right of box."
    grid[4, 3] = codes.FLOOR
    grid[2, 2] = codes.BOX_ON_TARGET
    assert sokoban_think(grid) == "all boxes are on targets."


def test_tile_labels_give_the_think_words_at_the_player_and_box_tiles():
    grid = np.full((6, 6), codes.WALL, dtype=np.uint8)
    grid[1:5, 1:5] = codes.FLOOR
    grid[1, 3], grid[2, 2], grid[4, 3] = codes.PLAYER, codes.BOX, codes.TARGET
    labels = tile_direction_labels(grid)  # columns: player, box, target as seen from each tile
    assert labels.shape == (36, 3)
    assert DIRECTIONS[labels[1 * 6 + 3, 1]] == "down-left"  # "box is down-left of me"
    assert DIRECTIONS[labels[2 * 6 + 2, 2]] == "down-right"  # "target is down-right of box"
    assert DIRECTIONS[labels[1 * 6 + 3, 0]] == "here" and DIRECTIONS[labels[0, 0]] == "down-right"


def test_vision_pretraining_learns_and_sft_keeps_the_vision_tower_frozen(formatter):
    model, processor = load_tiny_vl(build_tiny_vl(size="test"))
    demos = demonstrations(formatter, range(6), noise_eps=0.0)
    losses = pretrain_vision(model, processor, demos, replace(TEST_RECIPE, vision_steps=30, vision_lr=1e-2))
    assert len(losses) == 30 and np.mean(losses[-5:]) < losses[0] - 0.2
    vision_before = [p.detach().clone() for p in model.model.visual.parameters()]
    text_before = model.lm_head.weight.detach().clone()
    train_sft(model, processor, demos, replace(TEST_RECIPE, steps=2, vision_lr_scale=0.0))
    assert all(torch.equal(a, b) for a, b in zip(vision_before, model.model.visual.parameters(), strict=True))
    assert not torch.equal(text_before, model.lm_head.weight)
    assert all(p.requires_grad for p in model.parameters())


def test_noise_free_demos_succeed_with_one_image_per_turn_and_the_end_token(formatter):
    end_id = formatter.stop_token_ids()[0]
    demos = demonstrations(formatter, range(4), noise_eps=0.0)
    assert len(demos) == 4
    for demo in demos:
        trajectory = demo.trajectory
        assert trajectory.success and not any(demo.noisy_turns)
        assert len(trajectory.images) == len(trajectory.turns) == len(demo.noisy_turns)
        for turn in trajectory.turns:
            assert turn.response_ids[-1] == end_id and end_id not in turn.response_ids[:-1]
            assert formatter.tokenizer.decode(turn.response_ids[:-1]) == turn.response_text
            assert turn.response_text.startswith("<think>box is ") and turn.info["format_ok"]


def test_sft_mask_covers_exactly_the_solver_responses(formatter):
    env, rng = make_sokoban_visual(), np.random.default_rng(3)
    demos = [play_demo(env, formatter, seed, noise_eps=0.5, rng=rng) for seed in range(8)]
    demos = [d for d in demos if d.trajectory.turns and not all(d.noisy_turns)]
    assert any(any(d.noisy_turns) for d in demos), "the noise should hit some turn of 8 episodes"
    batch = sft_batch(demos, formatter.tokenizer.pad_token_id)
    for row, demo in enumerate(demos):
        expected = torch.zeros(batch.input_ids.shape[1])
        spans, turns = demo.trajectory.response_spans(), demo.trajectory.turns
        for (start, end), turn, noisy in zip(spans, turns, demo.noisy_turns, strict=True):
            assert batch.input_ids[row, start:end].tolist() == turn.response_ids
            if not noisy:
                expected[start:end] = 1.0
        assert torch.equal(batch.response_mask[row], expected)


def test_demo_ids_are_what_the_rollout_would_build(formatter):
    """Each turn's context is the previous ids + close + the formatter's next prompt (the RL layout)."""
    demo = demonstrations(formatter, [5], noise_eps=0.0)[0]
    ids, _ = demo.trajectory.token_ids_and_mask()
    image_pad = formatter.image_pad_id
    assert ids.count(image_pad) == sum(formatter.image_token_counts(demo.trajectory.images))
    assert ids[: len(demo.trajectory.turns[0].prompt_ids)] == formatter.first_prompt(
        make_sokoban_visual().reset(seed=5)[0]
    )


def test_a_few_sft_steps_reduce_the_loss_on_a_fixed_batch(tiny_vl, formatter):
    _, processor = tiny_vl
    model, _ = load_tiny_vl(build_tiny_vl(size="test"))  # a private copy: the module fixture stays untrained
    demos = demonstrations(formatter, range(4), noise_eps=0.0)
    batch = sft_batch(demos, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        before = float(sft_loss(model, batch, processor))
    recipe = replace(TEST_RECIPE, steps=8, batch_size=4, lr=3e-3)
    losses = train_sft(model, processor, demos, recipe)
    with torch.no_grad():
        after = float(sft_loss(model.eval(), batch, processor))
    assert len(losses) == 8 and all(np.isfinite(losses))
    assert after < before - 0.5


def test_cached_build_is_reused_and_reports(tmp_path):
    folder = build_warm_tiny_vl(tmp_path, TEST_RECIPE)
    report = read_report(folder)
    assert report["eval"]["seeds"] == [held_out_seeds(2)[0], held_out_seeds(2)[-1]]
    assert {"greedy", "temperature_0.5", "random", "solver"} <= set(report["eval"])
    assert 0.0 <= report["eval"]["greedy"]["success"] <= 1.0 and report["eval"]["solver"]["success"] == 1.0
    built_at = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_warm_tiny_vl(tmp_path, TEST_RECIPE) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == built_at  # not rebuilt
    assert read_stamp(folder)["recipe"]["steps"] == TEST_RECIPE.steps
    other = build_warm_tiny_vl(tmp_path, replace(TEST_RECIPE, steps=2))  # another recipe: rebuilt in place
    assert other == folder and read_stamp(folder)["recipe"]["steps"] == 2


def test_shipped_tiny_vl_is_the_current_recipe_and_plays_as_its_report_says(tmp_path):
    """The committed warm tiny_vl is used only while its stamp is today's recipe (else it is rebuilt), and its
    weights replay the report: greedy success on the report's held-out seeds within 3 of 128 episodes (CPU
    float reductions differ with the thread count, which can flip an episode or two)."""
    folder = build_warm_tiny_vl(cache_dir=tmp_path)  # the default recipe: no 15-minute build
    assert folder.parent == SHIPPED_DIR, "the recipe changed: rebuild with scripts/build_tiny_vl.py and ship it"
    assert not list(tmp_path.glob("warm-*"))
    report = read_report(folder)
    model, processor = load_tiny_vl(folder)
    seeds = held_out_seeds(report["recipe"]["eval_episodes"])
    greedy = evaluate_model(model, processor, seeds, 0.0, report["recipe"]["max_new_tokens"])
    assert abs(greedy["success"] - report["eval"]["greedy"]["success"]) <= 3 / len(seeds)
    assert greedy["success"] > 2 * report["eval"]["random"]["success"]
