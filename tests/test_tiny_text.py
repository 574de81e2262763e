"""The text default `model=tiny_text`: its grid tokenizer, its games, its configs, its recipe stamp and the shipped
build replaying its report."""

import glob
from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from vagen.bootstrap import tiny_text
from vagen.bootstrap.tiny import build_tiny_vl, load_tiny_text_lm
from vagen.bootstrap.tiny_text import (
    TEXT_GAMES,
    TINY_TEXT_CONTINUATION,
    TINY_TEXT_RECIPE,
    BoardReading,
    board_of,
    build_tiny_text,
    build_warm_tiny_text,
    cell_tokens,
    make_text_game,
    tiny_text_stamp,
)
from vagen.bootstrap.warmstart import SHIPPED_DIR, evaluate_model, read_report
from vagen.models.cache import read_stamp
from vagen.models.chat_template import QWEN_VL_SPECIAL_TOKENS
from vagen.models.processor import load_processor
from vagen.rollout.validation import eval_seeds

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
TEXT_ENVS = sorted(Path(p).stem for p in glob.glob(str(CONFIGS / "env" / "*_text.yaml")))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_text_lm(build_tiny_text())[1]


@pytest.mark.parametrize("game", list(TEXT_GAMES))
def test_every_grid_cell_is_one_token(tokenizer, game):
    env = make_text_game(game)
    for seed in range(8):
        observation, _ = env.reset(seed=seed)
        board = board_of(observation.text)
        tokens = cell_tokens(tokenizer, board)
        rows = board.split("\n")
        assert len(tokens) == sum(len(row) for row in rows) + len(rows) - 1  # one per cell and per newline
        assert tokenizer.decode(tokenizer(observation.text)["input_ids"]) == observation.text


def test_special_tokens_and_chat_template_are_tiny_vls(tokenizer):
    """The rollout, context building and generation suppression read these: the same ids as tiny_vl's."""
    vl = load_processor(build_tiny_vl(size="test")).tokenizer
    for token in QWEN_VL_SPECIAL_TOKENS:
        assert tokenizer.convert_tokens_to_ids(token) == vl.convert_tokens_to_ids(token)
    assert tokenizer.chat_template == vl.chat_template
    assert (tokenizer.eos_token, tokenizer.pad_token) == (vl.eos_token, vl.pad_token)


@pytest.mark.parametrize("name", list(TEXT_GAMES))
def test_the_tiny_text_games_are_the_env_configs(name):
    env_id, kwargs = TEXT_GAMES[name]
    config = OmegaConf.to_container(OmegaConf.load(CONFIGS / "env" / f"{name}.yaml"))
    assert (config["id"], config["kwargs"]) == (env_id, kwargs)


@pytest.mark.parametrize("env", TEXT_ENVS)
def test_every_text_env_trains_tiny_text_by_default_and_model_still_overrides(env):
    """tiny_text, or on frozenlake_text its continuation taught the holes (vagen/bootstrap/text_holes.py)."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        default = compose("train", overrides=[f"env={env}"])
        pretrained = compose("train", overrides=[f"env={env}", "model=smollm2_135m"])
        visual = compose("train", overrides=["env=sokoban_visual"])
    expected = ("tiny_text_holes",) * 2 if env == "frozenlake_text" else ("tiny_text", "tiny_text_warm")
    assert (default.model.name, default.model.source) == expected
    assert default.model.modality == "text" and "model" not in default.env
    assert pretrained.model.name == "smollm2_135m"
    assert visual.model.name == "tiny_vl"


def test_the_recipe_stamp_forces_a_rebuild(tmp_path, monkeypatch):
    """A build is reused while the recipe, the board reading and the continuation are the same and rebuilt when any
    changes; the shipped folder only while its stamp is the recipe's."""
    built = []

    def fake_warm_start(model, tokenizer, recipe, folder, *args, **kwargs):
        built.append(recipe)
        return {"env": "sokoban_text", "other_games": {"frozenlake_text": {"eval_before": {}}}, "eval_before": {}}

    monkeypatch.setattr(tiny_text, "warm_start", fake_warm_start)
    recipe, reading = replace(TINY_TEXT_RECIPE, size="test"), BoardReading(steps=2, batch_size=2, boards=2)
    more = replace(TINY_TEXT_CONTINUATION, size="test")
    folder = build_warm_tiny_text(tmp_path, recipe, reading, more)
    assert folder.parent == tmp_path and built == [recipe, more]  # SFT, then the continuation
    assert build_warm_tiny_text(tmp_path, recipe, reading, more) == folder and len(built) == 2  # the same: reused
    changed = replace(recipe, steps=recipe.steps + 1)
    assert build_warm_tiny_text(tmp_path, changed, reading, more) == folder and built[-2:] == [changed, more]
    assert read_stamp(folder)["recipe"]["steps"] == changed.steps
    more_reading = replace(reading, steps=3)
    assert build_warm_tiny_text(tmp_path, changed, more_reading, more) == folder and len(built) == 6  # rebuilt
    assert read_report(folder)["board_reading"]["steps"] == 3 and len(read_report(folder)["board_reading"]["loss"])
    longer = replace(more, steps=more.steps + 1)
    assert build_warm_tiny_text(tmp_path, changed, more_reading, longer) == folder and built[-1] == longer  # rebuilt
    assert "first_pass" in read_report(folder) and read_stamp(folder)["continuation"]["steps"] == longer.steps
    assert build_warm_tiny_text(tmp_path, changed, more_reading, None) == folder and built[-1] == changed  # one pass
    assert "first_pass" not in read_report(folder) and read_stamp(folder)["continuation"] is None
    base = build_tiny_text(tmp_path, size="test")
    assert read_stamp(folder) == tiny_text_stamp(changed, more_reading, base, None)


@pytest.mark.slow(seconds=40)
def test_shipped_tiny_text_is_the_current_recipe_and_replays_its_report(tmp_path):
    """The committed tiny_text is used while its stamp is today's recipe, and its weights replay the report: greedy
    success and format-ok on the report's held-out seeds within 3 episodes (CPU float reductions differ with the
    thread count), for both games."""
    folder = build_warm_tiny_text(cache_dir=tmp_path)
    assert folder.parent == SHIPPED_DIR, "the tiny_text recipe changed: rebuild it and ship the new folder"
    assert not list(tmp_path.glob("warm-*"))
    assert (folder / "model.safetensors").stat().st_size <= 20 * 2**20
    report = read_report(folder)
    model, tokenizer = load_tiny_text_lm(folder)
    episodes = report["recipe"]["eval_episodes"]
    games = {report["env"]: report, **report["other_games"]}
    assert list(games) == list(TEXT_GAMES)
    for name, block in games.items():
        assert block["eval"]["seeds"] == [eval_seeds(episodes)[0], eval_seeds(episodes)[-1]]
        greedy = evaluate_model(model, tokenizer, episodes, 0.0, report["recipe"]["max_new_tokens"],
                                lambda name=name: make_text_game(name), name)  # fmt: skip
        for key in ("success", "format_ok"):
            assert abs(greedy[key] - block["eval"]["greedy"][key]) <= 3 / episodes, (name, key)
        assert block["eval_before"]["greedy"]["format_ok"] < block["eval"]["greedy"]["format_ok"]
