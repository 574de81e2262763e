"""The evaluation cell store: damaged or foreign files are named or replayed, never crash, and temp files go."""

import json

import pytest

from vagen.eval.storage import CellStore


def test_damaged_settings_are_named_with_the_fix(tmp_path):
    store = CellStore(tmp_path / "cell", "m", "e")
    store.check_settings({"episodes": 4})
    (tmp_path / "cell" / "settings.json").write_text('{"episodes": ')
    with pytest.raises(ValueError, match=r"settings\.json is damaged .*delete .*cell to start again"):
        store.check_settings({"episodes": 4})


def test_a_wrongly_typed_episode_file_is_played_again_and_kill_leftovers_are_removed(tmp_path):
    store = CellStore(tmp_path / "cell", "m", "e")
    path = store.episode_path(0, 7)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([1, 2, 3]))  # valid JSON, but not an episode record
    assert store.load(0, 7) is None and not store.is_finished(0, 7, retry_failed=False)
    leftover = path.parent / ".tmp-ep00001_seed8.json-abc"
    leftover.write_text("{half")
    store.check_settings({"episodes": 2})
    assert not leftover.exists()
