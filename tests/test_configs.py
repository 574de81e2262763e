"""Every env config in configs/env/ builds a working environment with exactly the options it documents."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vagen.env import IMAGE_PLACEHOLDER, make_env

ENV_CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "env").glob("*.yaml"))


def test_there_are_text_and_visual_configs_for_every_game():
    names = {path.stem for path in ENV_CONFIGS}
    for game in ("sokoban", "frozenlake", "bandit", "countdown"):
        assert {f"{game}_text", f"{game}_visual"} <= names


@pytest.mark.parametrize("path", ENV_CONFIGS, ids=lambda p: p.stem)
def test_env_config_builds_and_plays(path):
    config = OmegaConf.load(path)
    assert config.name == path.stem
    kwargs = OmegaConf.to_container(config.kwargs)
    env = make_env(config.id, **kwargs)
    obs, _ = env.reset(seed=0)
    visual = kwargs.get("observation", "text") != "text"  # image or text+image: one image per observation
    assert (IMAGE_PLACEHOLDER in obs.text) == visual
    assert len(obs.images) == (1 if visual else 0)
    if visual and "tile_px" in kwargs:
        height, width = env.unwrapped.grid().shape
        assert obs.images[0].size == (width * kwargs["tile_px"], height * kwargs["tile_px"])
    env.step(env.action_space.sample())


@pytest.mark.parametrize("preset", ["grpo", "gigpo", "drgrpo", "ppo", "dapo", "starpo_s"])
def test_algorithm_presets_state_only_what_differs_from_the_base(preset):
    folder = Path(__file__).resolve().parent.parent / "configs" / "algorithm"
    base = OmegaConf.to_container(OmegaConf.load(folder / "base.yaml"))
    raw = OmegaConf.to_container(OmegaConf.load(folder / f"{preset}.yaml"))
    stated = {k: v for k, v in raw.get("algorithm", raw).items() if k not in ("defaults", "name")}
    assert set(stated) <= set(base), f"{preset} sets options the base does not document: {set(stated) - set(base)}"
    assert all(base[k] != v for k, v in stated.items()), f"{preset} restates base values: {stated}"


def test_the_demo_trains_the_text_default_with_the_default_algorithm_and_validates_on_256_levels():
    """`python3 dev.py demo` runs `scripts/train.py` with DEMO's overrides: they compose and pass the checks that run
    before any model loads, and its budget is 2,496 episodes (the README's and the docs' numbers are for that)."""

    from test_trainer import config, repo_module

    from vagen.trainer.config import validate_config

    dev = repo_module("dev.py")
    (step,) = dev.DEMO
    assert step[0] == "scripts/train.py"
    cfg = config(step[1:])
    validate_config(cfg)
    assert (cfg.env.name, cfg.model.name, cfg.algorithm.name) == ("sokoban_text", "tiny_text", "gigpo")
    assert cfg.trainer.iterations * cfg.trainer.groups * cfg.trainer.group_size == 2496
    assert cfg.trainer.eval_episodes == 256 and cfg.trainer.iterations % cfg.trainer.eval_every == 0
