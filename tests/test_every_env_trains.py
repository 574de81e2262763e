"""Every registered env config (configs/env/*.yaml) trains one tiny iteration with the default validation on: the
held-out episodes and the first-move probe at iteration 0 and at the end, the MI diagnostics, a checkpoint and the
GIFs, on the tiny test model of its modality."""

import json
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from vagen.trainer.run import train

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
ENV_CONFIGS = sorted((CONFIG_DIR / "env").glob("*.yaml"))
TINY = [
    "trainer.iterations=1",
    "trainer.groups=2",
    "trainer.group_size=2",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=4",
    "trainer.eval_episodes=2",
    "trainer.viz_episodes=1",
    "rollout.max_new_tokens=8",
    "env.kwargs.max_turns=2",
    "logger.wandb_mode=disabled",
    "logger.progress=false",
]
PROBED = {"sokoban", "frozenlake", "navigation", "sudoku", "boxoban"}  # games with a solver, reasoning and moves


@pytest.mark.parametrize("path", ENV_CONFIGS, ids=lambda p: p.stem)
def test_every_env_config_trains_one_iteration_with_the_default_validation(path, tmp_path):
    visual = OmegaConf.load(path).kwargs.get("observation", "text") != "text"
    overrides = [f"env={path.stem}", f"model={'tiny_vl_test' if visual else 'tiny_text_test'}", *TINY]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("train", overrides=[*overrides, f"run_dir={tmp_path / 'run'}"])
    assert cfg.trainer.eval_every > 0 and cfg.trainer.eval_move_probe  # the defaults under test
    run_dir = train(cfg)
    (line,) = [json.loads(text) for text in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step": 1' in text]
    assert all(math.isfinite(value) for key, value in line.items() if key != "critic/explained_variance"), line
    assert 0 <= line["val/success"] <= 1 and line["val/episodes"] == 2
    assert ("val/move_optimal_mass" in line) == (path.stem.split("_")[0] in PROBED)
    assert (run_dir / "checkpoints" / "iter_000001").is_dir() and list((run_dir / "gifs").rglob("*.gif"))
