"""The visual games show exactly the state their text shows, at exactly the stated resolution."""

import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from PIL import Image

import envs_visual  # noqa: F401  (registers the gymnasium ids)
from envs_text import frozenlake as frozenlake_text
from envs_text import sokoban as sokoban_text
from envs_visual.bandit import BanditEnv, render_bandit
from envs_visual.countdown import CountdownEnv, render_countdown
from envs_visual.frozenlake import FrozenLakeEnv
from envs_visual.navigation import NavigationEnv
from envs_visual.sokoban import SokobanEnv
from envs_visual.tiles import frozenlake_atlas, render_grid, sokoban_atlas
from vagen.env import IMAGE_PLACEHOLDER
from vagen.env.policies import POLICIES

ROOT = Path(__file__).resolve().parents[1]
GRID_GAMES = [
    (SokobanEnv, sokoban_atlas, sokoban_text.SYMBOLS, {"dim_room": (6, 6), "num_boxes": 2}),
    (FrozenLakeEnv, frozenlake_atlas, frozenlake_text.SYMBOLS, {"size": 5}),
]


def decode_grid(image: Image.Image, atlas: np.ndarray) -> np.ndarray:
    """Cut the image into tiles and name each tile by the atlas entry it equals exactly; -1 if none."""
    tile = atlas.shape[1]
    pixels = np.asarray(image)
    height, width = pixels.shape[0] // tile, pixels.shape[1] // tile
    tiles = pixels.reshape(height, tile, width, tile, 3).transpose(0, 2, 1, 3, 4)  # (H, W, t, t, 3)
    equal = (tiles[:, :, None] == atlas[None, None]).all(axis=(3, 4, 5))  # (H, W, n_codes)
    return np.where(equal.any(axis=2), equal.argmax(axis=2), -1)


def text_grid(observation_text: str, symbols: dict[int, str]) -> np.ndarray:
    """The grid that a text+image observation spells out, as codes."""
    code_of = {symbol: code for code, symbol in symbols.items()}
    rows = observation_text.split(IMAGE_PLACEHOLDER, 1)[1].strip().splitlines()
    return np.array([[code_of[char] for char in row] for row in rows])


@pytest.mark.parametrize("tile_px", [8, 16, 32])
@pytest.mark.parametrize("make_atlas", [sokoban_atlas, frozenlake_atlas])
def test_atlas_sprites_are_distinct_and_exactly_sized(make_atlas, tile_px):
    atlas = make_atlas(tile_px)
    assert atlas.dtype == np.uint8 and atlas.shape[1:] == (tile_px, tile_px, 3)
    flat = atlas.reshape(len(atlas), -1)
    assert len(np.unique(flat, axis=0)) == len(atlas)  # otherwise two codes would look the same
    assert make_atlas(tile_px) is atlas  # cached
    with pytest.raises(ValueError):
        atlas[0, 0, 0, 0] = 1  # the cached atlas is read-only


def test_render_grid_places_each_tile_row_major():
    atlas = sokoban_atlas(16)
    grid = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.uint8)
    pixels = np.asarray(render_grid(grid, atlas))
    assert pixels.shape == (32, 48, 3)
    for (row, col), code in np.ndenumerate(grid):
        assert np.array_equal(pixels[row * 16 : (row + 1) * 16, col * 16 : (col + 1) * 16], atlas[code])
    with pytest.raises(ValueError, match="codes"):
        render_grid(np.array([[7]]), atlas)


@pytest.mark.parametrize("tile_px", [16, 32])
@pytest.mark.parametrize(("env_class", "make_atlas", "symbols", "kwargs"), GRID_GAMES)
def test_image_decodes_to_the_same_grid_as_the_text(env_class, make_atlas, symbols, kwargs, tile_px):
    env = env_class(observation="text+image", tile_px=tile_px, max_turns=8, **kwargs)
    rng = np.random.default_rng(0)
    for seed in range(3):
        observation, _ = env.reset(seed=seed)
        done = False
        while True:
            image = observation.images[0]
            grid = env.grid()
            assert image.mode == "RGB"
            assert image.size == (grid.shape[1] * tile_px, grid.shape[0] * tile_px)
            assert np.array_equal(decode_grid(image, make_atlas(tile_px)), grid)
            assert np.array_equal(text_grid(observation.text, symbols), grid)
            if done:
                break
            observation, _, terminated, truncated, _ = env.step(POLICIES.get("random")(env, rng))
            done = terminated or truncated


@pytest.mark.parametrize("env_class", [SokobanEnv, FrozenLakeEnv, NavigationEnv])
def test_default_tile_is_one_image_token_per_cell(env_class):
    """Without a tile_px, every grid game draws 28-px tiles (one merged 2x2 patch of Qwen2.5-VL's 14-px grid), the
    size every env config and tiny_vl use: a 6x6 Sokoban room is 168 x 168 pixels."""
    env = env_class(observation="image")
    observation, _ = env.reset(seed=0)
    rows, cols = env.grid().shape
    assert observation.images[0].size == (cols * 28, rows * 28)
    if env_class is SokobanEnv:
        assert (rows, cols) == (6, 6)


@pytest.mark.parametrize("env_class", [SokobanEnv, FrozenLakeEnv, BanditEnv, CountdownEnv])
def test_same_seed_same_image(env_class):
    first, _ = env_class(observation="image").reset(seed=7)
    second, _ = env_class(observation="image").reset(seed=7)
    assert first.images[0].tobytes() == second.images[0].tobytes()


def test_bandit_image_labels_the_arms_in_presentation_order():
    size = (240, 160)
    base = np.asarray(render_bandit(["Phoenix", "Dragon"], size))
    other_right = np.asarray(render_bandit(["Phoenix", "Tiger"], size))
    swapped = np.asarray(render_bandit(["Dragon", "Phoenix"], size))
    assert base.shape == (160, 240, 3)
    assert np.array_equal(base[:, :120], other_right[:, :120]) and not np.array_equal(
        base[:, 120:], other_right[:, 120:]
    )
    assert np.array_equal(base[:, :120], swapped[:, 120:])  # identical machines: only the label moves
    env = BanditEnv(observation="image", image_size=size)
    for seed in range(4):
        observation, _ = env.reset(seed=seed)
        expected = render_bandit(env.arm_names_in_order(), size)
        assert observation.images[0].tobytes() == expected.tobytes()


def test_countdown_image_shows_this_episodes_numbers_and_target():
    env = CountdownEnv(observation="image", image_size=(256, 128))
    images = set()
    for seed in range(3):
        observation, _ = env.reset(seed=seed)
        image = observation.images[0]
        assert image.size == (256, 128) and image.mode == "RGB"
        assert image.tobytes() == render_countdown(env.numbers, env.target, (256, 128)).tobytes()
        images.add(image.tobytes())
    assert len(images) == 3
    changed_target = render_countdown(env.numbers, env.target + 1, (256, 128))
    assert changed_target.tobytes() != image.tobytes()


@pytest.mark.parametrize("mode", ["text", "image", "text+image"])
@pytest.mark.parametrize("env_id", ["vagen/Sokoban-v0", "vagen/FrozenLake-v0", "vagen/Bandit-v0", "vagen/Countdown-v0"])
def test_gymnasium_make_in_every_observation_mode(env_id, mode):
    env = gymnasium.make(env_id, observation=mode)
    observation, _ = env.reset(seed=1)
    observation, _, _, _, info = env.step(POLICIES.get("solver")(env, np.random.default_rng(0)))
    assert info["format_ok"] and info["action_is_valid"], info
    assert len(observation.images) == (0 if mode == "text" else 1)
    assert observation.text.count(IMAGE_PLACEHOLDER) == len(observation.images)
    assert all(image.mode == "RGB" for image in observation.images)


def test_bad_resolution_is_a_clear_error():
    with pytest.raises(ValueError, match="tile_px"):
        SokobanEnv(tile_px=4)
    with pytest.raises(ValueError, match="image_size"):
        BanditEnv(image_size=(20, 10))


def test_make_env_finds_the_visual_games_without_importing_them():
    code = (
        "import sys; from vagen.env import make_env\n"
        "assert 'envs_visual' not in sys.modules\n"
        "obs, _ = make_env('vagen/Sokoban-v0', observation='image').reset(seed=0)\n"
        "print(obs.images[0].size)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(168, 168)"
