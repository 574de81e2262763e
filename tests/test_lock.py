"""The run lock: exactly one holder among many concurrent takers (none, a stale or an empty lock present), its
holder named in the file, damaged lock files as one clear error or a stale takeover."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from vagen.trainer.lock import LOCK_FILENAME, run_dir_lock

TAKERS, TRIALS = 8, 25
SCENARIOS = ("no lock", "stale lock", "empty lock")


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _taker(run_dirs: list[str], start, hold, results) -> None:
    """Per trial: take the lock at the same moment as the others, report, keep it until every taker has tried."""
    warnings.simplefilter("ignore")  # the stale-lock warning
    for trial, run_dir in enumerate(run_dirs):
        start.wait(timeout=60)
        lock = run_dir_lock(Path(run_dir))
        try:
            lock.__enter__()
            took = True
        except ValueError:
            took = False
        results.put((trial, took))
        hold.wait(timeout=60)
        if took:
            lock.__exit__(None, None, None)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_concurrent_takers_get_exactly_one_holder(tmp_path, scenario):
    """8 processes take one run folder's lock at once, 25 times: every time exactly one holds it, and the lock is gone
    after it is released. (The O_EXCL lock, created before its pid was written, was held twice in many trials.)"""
    run_dirs = []
    for trial in range(TRIALS):
        run_dir = tmp_path / f"trial{trial}"
        run_dir.mkdir()
        if scenario == "stale lock":  # a killed run's lock
            owner = {"pid": _dead_pid(), "host": socket.gethostname()}
            (run_dir / LOCK_FILENAME).write_text(json.dumps(owner))
        elif scenario == "empty lock":  # a run killed between creating its lock and writing its pid
            (run_dir / LOCK_FILENAME).touch()
        run_dirs.append(str(run_dir))
    context = multiprocessing.get_context("spawn")
    start, hold, results = context.Barrier(TAKERS), context.Barrier(TAKERS), context.Queue()
    takers = [context.Process(target=_taker, args=(run_dirs, start, hold, results)) for _ in range(TAKERS)]
    for taker in takers:
        taker.start()
    holders = [0] * TRIALS
    deadline = time.monotonic() + 240
    for _ in range(TAKERS * TRIALS):
        trial, took = results.get(timeout=max(1.0, deadline - time.monotonic()))
        holders[trial] += took
    for taker in takers:
        taker.join(timeout=60)
        assert taker.exitcode == 0
    wrong = {trial: count for trial, count in enumerate(holders) if count != 1}
    assert not wrong, f"trials without exactly one holder (trial: holders): {wrong}"
    assert not any((Path(run_dir) / LOCK_FILENAME).exists() for run_dir in run_dirs)
    assert not [p.name for run_dir in run_dirs for p in Path(run_dir).iterdir()]  # no temp files left behind


def test_the_holder_is_named_in_the_lock_and_a_second_taker_is_refused(tmp_path):
    with run_dir_lock(tmp_path) as path:
        owner = json.loads(path.read_text())
        assert owner == {"pid": os.getpid(), "host": socket.gethostname()}
        with pytest.raises(ValueError, match=f"in use by another run \\(pid {os.getpid()}"), run_dir_lock(tmp_path):
            pass
        assert path.exists()
    assert not path.exists()


def test_a_live_process_named_in_the_lock_is_refused(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_FILENAME).write_text(json.dumps({"pid": busy.pid, "host": socket.gethostname()}))
        with pytest.raises(ValueError, match=f"pid {busy.pid}"), run_dir_lock(tmp_path):
            pass
    finally:
        busy.kill()
        busy.wait()
    with pytest.raises(ValueError, match="on host elsewhere"):
        (tmp_path / LOCK_FILENAME).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
        with run_dir_lock(tmp_path):
            pass


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "7", '{"pid": "12"}', '{"host": 5, "pid": 3}', "{not json"])
def test_a_lock_with_content_of_the_wrong_type_is_stale(tmp_path, content):
    (tmp_path / LOCK_FILENAME).write_text(content)
    with pytest.warns(UserWarning, match="stale lock"), run_dir_lock(tmp_path) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()


def test_a_lock_that_is_a_directory_is_one_clear_error(tmp_path):
    (tmp_path / LOCK_FILENAME).mkdir()
    with (
        pytest.raises(ValueError, match=r"\.run\.lock is a directory, not a run lock.*remove it"),
        run_dir_lock(tmp_path),
    ):
        pass


def test_a_missing_run_dir_is_one_clear_error(tmp_path):
    with (
        pytest.raises(ValueError, match=r"Cannot write the run lock .*No such file or directory.*run_dir"),
        run_dir_lock(tmp_path / "missing"),
    ):
        pass
