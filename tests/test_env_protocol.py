"""Every registered environment passes the one shared checker, in every observation mode."""

import pytest
from PIL import Image

from vagen.env import IMAGE_PLACEHOLDER, Observation, make_env, registered_envs
from vagen.env.checker import EnvCheckError, check_determinism, check_env

ENV_IDS = registered_envs()
MODES = ("text", "image", "text+image")


def test_all_games_are_registered():
    assert {"vagen/Sokoban-v0", "vagen/FrozenLake-v0", "vagen/Bandit-v0", "vagen/Countdown-v0"} <= set(ENV_IDS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_env_passes_checker(env_id, mode):
    check_env(env_id, seed=3, cross_process=False, observation=mode)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_game_takes_mark_no_effect(env_id):
    """The base class's feedback option reaches every game, and on the same episode it only adds marks."""
    plain, marked = make_env(env_id), make_env(env_id, mark_no_effect=True)
    plain.reset(seed=5), marked.reset(seed=5)
    response = plain.action_space.sample()
    plain_obs, *_ = plain.step(response)
    marked_obs, *_ = marked.step(response)
    assert marked_obs.text.replace(" (no effect)", "") == plain_obs.text


def test_episodes_are_identical_across_processes():
    cases = [(env_id, {"observation": mode}, 11) for env_id in ENV_IDS for mode in ("text", "image")]
    check_determinism(cases)


def test_checker_catches_a_broken_env():
    """The checker must be able to fail: a NaN reward is caught, an ignored seed is flagged."""
    from envs_text.bandit import BanditTextEnv
    from envs_text.frozenlake import FrozenLakeTextEnv
    from vagen.env import ActionResult
    from vagen.env.checker import check_seeds_vary, check_step_contract

    class NanBandit(BanditTextEnv):
        def _apply(self, action):
            return ActionResult(reward=float("nan"), effective=True, terminated=True)

    with pytest.raises(EnvCheckError, match="finite"):
        check_step_contract(NanBandit(), seed=0)
    with pytest.warns(UserWarning, match="seed"):
        check_seeds_vary(FrozenLakeTextEnv(desc=["SFFF", "FHFH", "FFFH", "HFFG"]), seed=0)


def test_unknown_env_lists_the_valid_ones():
    with pytest.raises(ValueError, match="vagen/Sokoban-v0"):
        make_env("vagen/Sokobn-v0")


def test_unknown_observation_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="observation mode"):
        make_env("vagen/Sokoban-v0", observation="video")


def test_text_only_class_refuses_image_mode():
    from envs_text.sokoban import SokobanTextEnv

    with pytest.raises(ValueError, match="envs_visual"):
        SokobanTextEnv(observation="image")


def test_observation_checks_placeholders():
    image = Image.new("RGB", (4, 4))
    assert Observation(f"a {IMAGE_PLACEHOLDER}", [image]).images == [image]
    with pytest.raises(ValueError, match="placeholder"):
        Observation("no placeholder", [image])
    with pytest.raises(ValueError, match="placeholder"):
        Observation(f"{IMAGE_PLACEHOLDER}{IMAGE_PLACEHOLDER}", [image])
    with pytest.raises(TypeError, match="PIL"):
        Observation(IMAGE_PLACEHOLDER, ["not an image"])
