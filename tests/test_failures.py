"""scripts/evaluate.py mode=failures: evaluated episodes replayed next to the game's solver."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from vagen.env import make_env
from vagen.eval import evaluate, rename_overrides
from vagen.eval.failures import (
    EpisodeReplay,
    TurnReplay,
    cell_failure_report,
    failure_report,
    replay_cell,
    report_lines,
)

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def evaluate_cells(tmp_path: Path, models: str, episodes: int) -> Path:
    overrides = [f"out_dir={tmp_path}", f"model={models}", "env=sokoban_text", f"episodes={episodes}"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("evaluate", overrides=rename_overrides([*overrides, "gif_episodes=0", "plot=false"]))
    evaluate(cfg, CONFIG_DIR)
    return tmp_path


def load_cell(cell: Path) -> tuple[dict, list[dict]]:
    records = [json.loads(path.read_text()) for path in sorted((cell / "episodes").glob("*.json"))]
    return json.loads((cell / "settings.json").read_text()), records


def test_solver_play_replays_as_solved_optimal_and_demo_reasoned_random_play_fails(tmp_path):
    out = evaluate_cells(tmp_path, "[solver,random]", episodes=6)
    solver_replays = replay_cell(*load_cell(out / "solver" / "sokoban_text"))
    assert all(turn.optimal and turn.moved for replay in solver_replays for turn in replay.turns)
    solver = failure_report(solver_replays)
    assert solver["outcomes"]["solved"] == "6/6 (100%)"
    # the solver policy reasons with describe_state(), not the demonstrations' words
    assert solver["reasoning_matches_demo"]["solvable states"].startswith("0/")

    settings, records = load_cell(out / "random" / "sokoban_text")
    replays = replay_cell(settings, records)
    assert [replay.success for replay in replays] == [record["success"] for record in records]
    for replay in replays:  # each turn starts where the previous one ended; the first from the level's own distance
        assert replay.initial_distance == replay.turns[0].distance_before
        assert all(a.distance_after == b.distance_before for a, b in zip(replay.turns, replay.turns[1:], strict=False))
    for replay, record in zip(replays, records, strict=True):  # a turn of moves into walls changed nothing
        assert [turn.moved for turn in replay.turns] == [info["action_is_effective"] for info in record["infos"]]
    failed = [replay for replay in replays if not replay.success]
    assert failed and all(replay.outcome in ("dead end", "out of turns") for replay in failed)


def test_reasoning_is_compared_with_the_demonstration_of_the_state_seen(tmp_path):
    settings, records = load_cell(evaluate_cells(tmp_path, "solver", episodes=1) / "solver" / "sokoban_text")
    env = make_env(settings["env"]["id"], **settings["env"]["kwargs"])
    env.reset(seed=records[0]["seed"])
    first = next(message for message in records[0]["messages"] if message["role"] == "assistant")
    answer = first["content"][first["content"].index("<answer>") :]
    first["content"] = f"<think>{env.unwrapped.demo_reasoning()}</think>{answer}"
    turns = replay_cell(settings, records)[0].turns
    assert turns[0].reasoning_matches and not any(turn.reasoning_matches for turn in turns[1:])


def test_a_replay_that_disagrees_with_its_record_names_the_settings(tmp_path):
    settings, records = load_cell(evaluate_cells(tmp_path, "solver", episodes=1) / "solver" / "sokoban_text")
    records[0]["success"] = False
    with pytest.raises(ValueError, match=r"settings\.json"):
        replay_cell(settings, records)


def test_report_counts_outcomes_distances_and_turns():
    optimal, wasted, dead = (
        TurnReplay(3, 0, 3, True),
        TurnReplay(5, 5, 2, True, moved=False),
        TurnReplay(5, None, 1, False),
    )
    replays = [
        EpisodeReplay(0, True, 3, [optimal]),
        EpisodeReplay(1, False, 5, [wasted, TurnReplay(5, 4, 1, True)]),  # goal still 4 moves away
        EpisodeReplay(2, False, 5, [dead, TurnReplay(None, None, 3, False)]),
    ]
    assert [replay.outcome for replay in replays] == ["solved", "out of turns", "dead end"]
    report = failure_report(replays)
    assert report["outcomes"] == {"solved": "1/3 (33%)", "dead end": "1/3 (33%)", "out of turns": "1/3 (33%)"}
    assert report["outcomes_by_initial_distance"] == {
        "3": {"solved": "1/1 (100%)", "dead end": "0/1 (0%)", "out of turns": "0/1 (0%)"},
        "5": {"solved": "0/2 (0%)", "dead end": "1/2 (50%)", "out of turns": "1/2 (50%)"},
    }
    assert "       5: solved 0/2 (0%), dead end 1/2 (50%), out of turns 1/2 (50%)" in report_lines("m on e", report)
    assert report["optimal_turns_by_turn"] == {0: "1/3 (33%)", 1: "1/2 (50%)"}
    assert report["dead_ends_entered_by_turn"] == {0: "1/3 (33%)", 1: "0/2 (0%)"}
    assert report["reasoning_matches_demo"] == {"solvable states": "3/4 (75%)", "dead ends": "0/1 (0%)"}
    assert report["dead_ends_entered_by_reading"] == {
        "reading equal to the demonstration's": "0/3 (0%)",
        "reading not equal": "1/1 (100%)",
    }
    assert "in reading not equal 1/1 (100%)" in "\n".join(report_lines("m on e", report))
    assert report["turns_that_changed_nothing"] == {"solved episodes": "0/1 (0%)", "failed episodes": "1/4 (25%)"}
    assert "reading_facts_right" not in report  # no game here splits its reading into facts


def test_report_averages_the_reading_facts_over_solvable_states():
    turns = [TurnReplay(4, 3, 1, True, 1.0), TurnReplay(3, 2, 1, False, 0.6), TurnReplay(None, None, 1, False, 0.0)]
    report = failure_report([EpisodeReplay(0, False, 4, turns)])
    assert report["reading_facts_right"] == "80.0% of the facts in 2 solvable states"


def test_evaluate_mode_failures_prints_and_writes_each_cells_report(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, str(SCRIPTS / "evaluate.py"), "mode=failures", "model=[solver,random]"]
    command += ["env=[sokoban_text,bandit_text]", "episodes=2", "gif_episodes=0", "plot=false", f"out_dir={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=SCRIPTS.parent, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "solver on sokoban_text: 2 episodes" in done.stdout and "outcome: solved 2/2 (100%)" in done.stdout
    assert "turns that changed nothing: in solved episodes 0/" in done.stdout
    assert "solver on bandit_text: cannot be analysed" in done.stdout
    reports = json.loads((tmp_path / "failures.json").read_text())
    assert reports["solver on sokoban_text"] == json.loads(
        json.dumps(cell_failure_report(tmp_path / "solver" / "sokoban_text"))
    )
    assert reports["random on sokoban_text"]["episodes"] == 2 and "solver on bandit_text" not in reports
    with pytest.raises(ValueError, match=r"has no settings\.json"):
        cell_failure_report(tmp_path)
    refused = subprocess.run([*command[:2], "mode=why"], capture_output=True, text=True, cwd=SCRIPTS.parent)
    assert refused.returncode == 2 and "mode='why' is not one of play, failures, move_probe" in refused.stderr
