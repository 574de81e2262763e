"""research/hole_probe.py: the truth it reads off the game, and its linear probe finding a feature that is there and
none where there is none."""

import numpy as np
import pytest
import torch
from test_trainer import repo_module

from envs_text.frozenlake import PLAYER, SYMBOLS
from vagen.bootstrap.tiny import build_tiny_vl, load_tiny_text_lm, load_tiny_vl
from vagen.bootstrap.tiny_text import build_tiny_text
from vagen.env.registry import make_env
from vagen.rollout import DialogueFormatter


def hole_probe():
    return repo_module("research/hole_probe.py")


def test_holes_beside_the_player_come_from_the_game():
    env = make_env("vagen/FrozenLake-v0", desc=["SFFF", "FHFH", "FFFH", "HFFG"])
    env.reset(seed=0)
    assert hole_probe().holes_beside(env) == [False, False, False, False]  # (0, 0): ice below and to the right
    env.step("<think>go</think><answer>Down || Down</answer>")  # (2, 0): a hole below
    assert hole_probe().holes_beside(env) == [False, True, False, False]
    env.step("<think>go</think><answer>Right</answer>")  # (2, 1): a hole above (1, 1); (3, 1) is ice
    assert hole_probe().holes_beside(env) == [True, False, False, False]


def test_the_probe_reads_a_feature_that_is_there_and_finds_none_in_noise():
    rng = np.random.default_rng(0)
    labels = (rng.random((600, 4)) < 0.15).astype(float)  # holes on about 15% of the sides, as in the game
    noise = rng.normal(size=(600, 32))
    encoded = noise.copy()
    encoded[:, :4] += 5.0 * labels  # the four facts written, with noise, into four of 32 dimensions
    accuracy, recall = hole_probe().fit_probe(encoded, labels, train=420)
    assert (accuracy > 0.95).all() and (recall > 0.8).all()
    accuracy, recall = hole_probe().fit_probe(noise, labels, train=420)
    majority = np.maximum(labels[420:].mean(0), 1 - labels[420:].mean(0))
    assert (accuracy <= majority + 0.03).all() and (recall < 0.3).all()


def first_prompt(tokenizer, image_processor, env, seed: int) -> torch.Tensor:
    observation, _ = env.reset(seed=seed)
    return torch.tensor([DialogueFormatter(tokenizer, image_processor).first_prompt(observation)])


def test_the_players_token_from_text_is_the_players_board_cell():
    model, tokenizer = load_tiny_text_lm(build_tiny_text(size="test"))
    env = make_env("vagen/FrozenLake-v0", observation="text", size=5)
    for seed in range(5):  # the player starts on a random cell
        batch = first_prompt(tokenizer, None, env, seed)
        player = env.unwrapped.state_objects()[0][1]
        index = hole_probe().player_token(model, batch, env.unwrapped.desc, player)
        assert tokenizer.convert_ids_to_tokens(int(batch[0, index])) == SYMBOLS[PLAYER]


def test_the_players_image_token_needs_one_image_token_per_tile():
    model, processor = load_tiny_vl(build_tiny_vl(size="test"))
    for tile_px, fits in ((28, True), (32, False)):
        env = make_env("vagen/FrozenLake-v0", observation="image", tile_px=tile_px)
        batch = first_prompt(processor.tokenizer, processor.image_processor, env, 0)
        player = env.unwrapped.state_objects()[0][1]
        board = env.unwrapped.desc
        if fits:
            tiles = (batch[0] == model.config.image_token_id).nonzero().flatten()
            index = hole_probe().player_token(model, batch, board, player)
            assert index == tiles[player[0] * len(board[0]) + player[1]]
        else:  # 32-px tiles: the processor resizes the 128-px image to 5 x 5 merged tokens for a 4 x 4 lake
            with pytest.raises(ValueError, match="one merged image token per tile"):
                hole_probe().player_token(model, batch, board, player)
