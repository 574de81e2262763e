"""The teacher-forced first-move probe: optimal moves from the solver, preferences equal to full forwards, the
summary on a worked example, and scripts/evaluate.py mode=move_probe end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vagen.bootstrap.tiny import build_tiny_vl, load_tiny_vl
from vagen.bootstrap.warmstart import make_sokoban_visual
from vagen.diagnostics.move_preference import move_preferences, optimal_mass, probe_summary
from vagen.diagnostics.scoring import Reasoning, ScoringJob, ScoringPrompt, naive_cross_scores
from vagen.env import make_env
from vagen.rollout import DialogueFormatter
from vagen.rollout.move_probe import check_probeable, optimal_first_actions, probe_states

ROOT = Path(__file__).resolve().parent.parent


def test_the_solvers_first_move_is_optimal_and_a_move_into_a_wall_never_is():
    env = make_sokoban_visual()
    for seed in range(12):
        optimal = optimal_first_actions(env, seed)
        env.reset(seed=seed)
        game = env.unwrapped
        plan = game.solver_actions()
        assert optimal[game.action_names.index(plan[0])]
        for index, action in enumerate(game.action_names):
            env.reset(seed=seed)
            before = game.current_level().player
            env.step(f"<think>x</think><answer>{action}</answer>")
            if game.current_level().player == before:  # the move did nothing: the plan cannot be shorter
                assert not optimal[index], (seed, action)


def test_slippery_ice_is_refused_with_the_fix():
    check_probeable(make_env("vagen/FrozenLake-v0", observation="image"))
    with pytest.raises(ValueError, match=r"success_rate=0.8.*env.kwargs.success_rate=1.0"):
        check_probeable(make_env("vagen/FrozenLake-v0", observation="image", success_rate=0.8))


def test_preferences_are_the_softmax_of_full_forward_scores():
    model, processor = load_tiny_vl(build_tiny_vl(size="test"))
    formatter = DialogueFormatter(processor.tokenizer, processor.image_processor)
    states = probe_states(make_sokoban_visual, formatter, [1_000_000_000, 1_000_000_001])
    preferences = move_preferences(model, processor, states)
    assert preferences.shape == (2, 4) and np.allclose(preferences.sum(axis=1), 1.0)
    for state, row in zip(states, preferences, strict=True):
        job = ScoringJob(
            [ScoringPrompt(state.prompt_ids, state.images, 0)],
            [Reasoning(ids, (0, len(ids)), 0) for ids in state.responses],
        )
        naive, _ = naive_cross_scores(model, processor, job)
        assert np.allclose(row, torch.softmax(naive[:, 0].double(), dim=0).numpy(), atol=1e-4)
        texts = [processor.tokenizer.decode(ids) for ids in state.responses]
        assert all(
            text.endswith(f"<answer>{action}</answer>")
            for text, action in zip(texts, ("Up", "Down", "Left", "Right"), strict=True)
        )


def test_summary_on_a_worked_example():
    optimal = np.array([[True, False, False, False], [False, True, True, False]])
    after = np.array([[0.7, 0.1, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]])
    assert optimal_mass(after, optimal).tolist() == pytest.approx([0.7, 0.5])
    summary = probe_summary(after, optimal)
    expected = {"optimal_mass": 0.6, "top_optimal": 0.5, "rarely_optimal": 0.0, "chance": 0.375, "states": 2}
    assert summary == pytest.approx(expected)
    # a third state whose one optimal move gets 0.05 (< RARELY): rarely tried, and the mean mass falls with it
    optimal3 = np.vstack([optimal, [False, False, False, True]])
    after3 = np.vstack([after, [0.5, 0.3, 0.15, 0.05]])
    summary3 = probe_summary(after3, optimal3)
    assert summary3["rarely_optimal"] == pytest.approx(1 / 3)
    assert summary3["optimal_mass"] == pytest.approx(1.25 / 3)


@pytest.mark.slow(seconds=35)
def test_evaluate_mode_move_probe_prints_and_writes_each_models_probe_and_refuses_what_it_cannot_probe(tmp_path):
    command = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), "mode=move_probe", f"out_dir={tmp_path}"]
    done = subprocess.run([*command, "model=[tiny_vl_test,tiny_vl_warm_test]", "env=sokoban_visual", "episodes=6"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "move_probe.json").read_text())["sokoban_visual"]
    first, second = results["tiny_vl_test"], results["tiny_vl_warm_test"]
    assert first["states"] == second["states"] > 0 and first["chance"] == second["chance"]
    assert second["change_vs_first"] == pytest.approx(second["optimal_mass"] - first["optimal_mass"])
    assert second["change_ci"][0] <= second["change_vs_first"] <= second["change_ci"][1]
    assert (
        "tiny_vl_warm_test on sokoban_visual: mass on optimal first moves" in done.stdout
        and "paired change vs tiny_vl_test" in done.stdout
    )
    for bad, message in (
        (["model=solver", "env=sokoban_visual"], "built-in policy"),
        (["model=tiny_vl_test", "env=bandit_text"], "has no demonstration reasoning"),
    ):
        refused = subprocess.run([*command, *bad], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert refused.returncode == 2 and message in refused.stderr and "Traceback" not in refused.stderr


def test_a_game_whose_answer_is_free_form_is_refused_and_the_trainer_leaves_the_probe_out():
    """Cards (like Countdown) answers with one free-form formula: there is no finite set of first moves to score."""
    from hydra import compose, initialize_config_dir

    from vagen.trainer.starpo import StarPOTrainer

    for observation in ("text", "image"):
        with pytest.raises(ValueError, match=r"no finite set of moves"):
            check_probeable(make_env("vagen/Cards-v0", observation=observation))
    small = ["trainer.groups=2", "trainer.group_size=2", "trainer.mini_batch_size=4", "trainer.micro_batch_size=2"]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("train", overrides=["env=cards_text", "model=tiny_text_test", *small, "trainer.eval_episodes=2"])
    trainer = StarPOTrainer(cfg)
    assert trainer.learner.move_probe() == {} and trainer.learner.probe_states == []
