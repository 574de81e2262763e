"""The evaluation cell store: damaged, foreign or edited files are named or replayed, never crash or count, and
temp files go; episodes whose settings.json is gone are refused, never relabelled."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from vagen.eval import evaluate, rename_overrides
from vagen.eval.storage import CellStore
from vagen.rollout.chat import EpisodeResult, TurnResult

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def test_damaged_settings_are_named_with_the_fix(tmp_path):
    store = CellStore(tmp_path / "cell", "m", "e")
    store.check_settings({"episodes": 4})
    (tmp_path / "cell" / "settings.json").write_text('{"episodes": ')
    with pytest.raises(ValueError, match=r"settings\.json is damaged .*delete .*cell to start again"):
        store.check_settings({"episodes": 4})


def test_a_wrongly_typed_episode_file_is_played_again_and_kill_leftovers_are_removed(tmp_path):
    store = CellStore(tmp_path / "cell", "m", "e")
    store.check_settings({"episodes": 2})
    path = store.episode_path(0, 7)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([1, 2, 3]))  # valid JSON, but not an episode record
    assert store.load(0, 7) is None and not store.is_finished(0, 7, retry_failed=False)
    leftover = path.parent / ".tmp-ep00001_seed8.json-abc"
    leftover.write_text("{half")
    store.check_settings({"episodes": 2})
    assert not leftover.exists()


# ---- records are checked, not trusted ------------------------------------------------------------------------


def written_record(tmp_path, won: bool = False) -> tuple[CellStore, dict]:
    store = CellStore(tmp_path / "cell", "m", "e")
    turns = [TurnResult("obs", [], "<answer>Left</answer>", 1.0 if won else -0.1, {"success": won, "format_ok": True})]
    return store, store.write(EpisodeResult(7, "sys", turns, end_reason="success" if won else "max_turns"), 0)


TAMPERED = {
    "success-is-text": {"success": "no"},
    "success-is-int": {"success": 1},
    "success-without-its-info": {"success": True},
    "reward-is-text": {"reward": "1.0"},
    "turns-disagree": {"turns": 3},
    "error-not-text": {"error": 5},
    "tokens-is-text": {"response_tokens": "x"},
    "messages-not-list": {"messages": {"role": "user"}},
    "wall-time-nan": {"wall_time_s": float("nan")},
    "final-observation-is-text": {"final_observation": "obs"},
    "final-observation-without-images": {"final_observation": {"content": "obs"}},
}


@pytest.mark.parametrize("change", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_record_with_a_wrong_field_is_played_again_not_counted(tmp_path, change):
    store, record = written_record(tmp_path)
    assert store.load(0, 7) == record and store.is_finished(0, 7, retry_failed=True)
    store.episode_path(0, 7).write_text(json.dumps({**record, **change}))
    assert store.load(0, 7) is None and not store.is_finished(0, 7, retry_failed=False)


def run(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        overrides = [f"out_dir={tmp_path}", "gif_episodes=0", "plot=false", "+env_overrides.max_turns=3", *overrides]
        cfg = compose("evaluate", overrides=rename_overrides(overrides))
    return evaluate(cfg, CONFIG_DIR)


def test_success_no_counts_as_a_failure_end_to_end(tmp_path):
    args = ("model=[random]", "env=[sokoban_text]", "episodes=2")
    run(tmp_path, *args)
    path = next((tmp_path / "random/sokoban_text/episodes").glob("ep00000_*.json"))
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "success": "no" if not record["success"] else "yes"}))
    (row,) = run(tmp_path, *args).rows
    stored = [json.loads(p.read_text()) for p in sorted(path.parent.glob("*.json"))]
    assert all(isinstance(r["success"], bool) for r in stored)  # the tampered record was played again
    assert row["success"] == sum(r["success"] for r in stored) / 2


@pytest.mark.parametrize("temperature", ["1.0", "0.5"], ids=["other-settings", "same-settings"])
def test_a_deleted_settings_file_never_relabels_the_episodes_beside_it(tmp_path, temperature):
    args = ("model=[random]", "env=[sokoban_text]", "episodes=2")
    run(tmp_path, *args, "temperature=0.5")
    (tmp_path / "random/sokoban_text/settings.json").unlink()
    with pytest.raises(ValueError, match=r"settings\.json is missing.*Fix: restore it"):
        run(tmp_path, *args, f"temperature={temperature}")
    assert not (tmp_path / "random/sokoban_text/settings.json").exists()


def test_a_rewritten_episode_drops_its_stale_gif(tmp_path):
    store, _ = written_record(tmp_path)
    gif = store.gif_path(0, 7)
    gif.parent.mkdir(parents=True)
    gif.write_bytes(b"GIF89a old episode")
    written_record(tmp_path, won=True)
    assert not gif.exists()


def test_a_surrogate_anywhere_in_a_record_is_written_and_read_back(tmp_path):
    store = CellStore(tmp_path / "cell", "m", "e")
    turns = [TurnResult("obs \udc80", [], "reply \ud800", 0.0, {"echo": "\udfff"})]
    store.write(EpisodeResult(7, "sys", turns, end_reason="max_turns"), 0)
    assert store.load(0, 7)["messages"][2]["content"] == "reply \ud800"
