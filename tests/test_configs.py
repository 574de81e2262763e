"""Every env config in configs/env/ builds a working environment with exactly the options it documents."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vagen.env import IMAGE_PLACEHOLDER, make_env

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ENV_CONFIGS = sorted((CONFIGS / "env").glob("*.yaml"))
TUNED = sorted((CONFIGS / "tuned").glob("*.yaml"))


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
    folder = CONFIGS / "algorithm"
    base = OmegaConf.to_container(OmegaConf.load(folder / "base.yaml"))
    raw = OmegaConf.to_container(OmegaConf.load(folder / f"{preset}.yaml"))
    stated = {k: v for k, v in raw.get("algorithm", raw).items() if k not in ("defaults", "name")}
    assert set(stated) <= set(base), f"{preset} sets options the base does not document: {set(stated) - set(base)}"
    assert all(base[k] != v for k, v in stated.items()), f"{preset} restates base values: {stated}"


def test_the_demo_trains_the_visual_default_with_its_tuned_settings_and_validates_on_256_levels():
    """`python3 dev.py demo` runs `scripts/train.py` with DEMO's overrides: they compose and pass the checks that run
    before any model loads, with the game's tuned settings (the anneal over the last quarter, undiscounted step
    returns), and its budget is 9,984 episodes validated on 256 levels x 8 samples (the README's and the docs' numbers
    are for that)."""

    from test_trainer import config, repo_module

    from vagen.trainer.config import validate_config

    dev = repo_module("dev.py")
    (step,) = dev.DEMO
    assert step[0] == "scripts/train.py"
    cfg = config(step[1:])
    validate_config(cfg)
    assert (cfg.env.name, cfg.model.name, cfg.algorithm.name) == ("frozenlake_visual", "tiny_vl_holes", "gigpo")
    assert (cfg.trainer.lr_schedule, cfg.trainer.lr_decay_start, cfg.algorithm.gamma_turn) == ("linear", 0.75, 1.0)
    assert cfg.trainer.iterations * cfg.trainer.groups * cfg.trainer.group_size == 9984
    assert cfg.trainer.eval_episodes == 256 and cfg.trainer.eval_samples == 8
    assert cfg.trainer.iterations % cfg.trainer.eval_every == 0


@pytest.mark.parametrize("path", TUNED, ids=lambda p: p.stem)
def test_a_tuned_file_is_named_for_its_game_model_and_algorithm_and_sets_documented_options(path):
    """configs/tuned/<env>-<model>-<algorithm>.yaml: the three are configs that exist, the file sets options of
    `OPTIONS` only, and the run of that game, model and algorithm gets its values and passes the checks."""
    from test_trainer import config

    from vagen.trainer.config import OPTIONS, _leaves, validate_config

    env, model, algorithm = path.stem.split("-")
    for group, name in (("env", env), ("model", model), ("algorithm", algorithm)):
        assert (CONFIGS / group / f"{name}.yaml").is_file(), f"{path.name}: no configs/{group}/{name}.yaml"
    assert path.read_text().startswith("# @package _global_\n")
    tuned = OmegaConf.load(path)
    keys = list(_leaves(OmegaConf.to_container(tuned)))
    assert keys and set(keys) <= set(OPTIONS), set(keys) - set(OPTIONS)
    cfg = config([f"env={env}", f"model={model}", f"algorithm={algorithm}"])
    assert {key: OmegaConf.select(cfg, key) for key in keys} == {key: OmegaConf.select(tuned, key) for key in keys}
    validate_config(cfg)


def test_the_tuned_settings_yield_to_the_command_line_and_apply_to_their_triple_only():
    """The sokoban_visual file sets trainer.freeze_vision and algorithm.sft_coef for tiny_vl with gigpo; another
    algorithm or model, `~tuned`, or the key on the command line each give something else, and the run's line says
    which values it uses."""
    from test_trainer import config

    from vagen.trainer.config import tuned_line

    def chosen(*overrides):
        cfg = config(["env=sokoban_visual", *overrides])
        return cfg.trainer.freeze_vision, cfg.algorithm.sft_coef

    assert chosen() == (True, 1.0)
    assert chosen("algorithm.sft_coef=0.5") == (True, 0.5)
    assert chosen("~tuned") == chosen("algorithm=grpo") == chosen("model=tiny_vl_test") == (False, 0.0)
    cfg = config(["env=sokoban_visual", "trainer.freeze_vision=false"])
    assert tuned_line(str(CONFIGS), "sokoban_visual-tiny_vl-gigpo", cfg) == (
        "Tuned for sokoban_visual-tiny_vl-gigpo (configs/tuned/sokoban_visual-tiny_vl-gigpo.yaml): "
        "trainer.freeze_vision=false algorithm.sft_coef=1.0. key=value overrides one; ~tuned drops all."
    )
    assert tuned_line(str(CONFIGS), "sokoban_visual-tiny_vl-grpo", cfg) is None  # no such file
    assert tuned_line(str(CONFIGS), None, cfg) is None  # ~tuned
