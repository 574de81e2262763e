"""One run per run folder: a lock file holding the owner's pid and host, taken atomically, stale ones detected.

Two runs started into one `run_dir` would interleave their metrics, configs and checkpoints. The first
run creates `run_dir/.run.lock` with `O_CREAT | O_EXCL` (atomic on local filesystems) and removes it
when it ends; a second run finds the file and refuses. A lock whose process no longer exists on this
host (a killed run) is stale and taken over with a warning; a lock from another host cannot be checked
from here, so it is refused with the command to remove it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

LOCK_FILENAME = ".run.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _owner(path: Path) -> dict:
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # unreadable: treated as stale below
    return owner if isinstance(owner, dict) else {}


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[Path]:
    """Hold `run_dir/.run.lock` for the duration of the block; raise ValueError if another run holds it."""
    path = Path(run_dir) / LOCK_FILENAME
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    for _ in range(2):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _owner(path)
            if owner.get("host", me["host"]) != me["host"]:
                raise ValueError(
                    f"{run_dir} is in use by pid {owner.get('pid')} on host {owner['host']} ({path}). Wait for that "
                    f"run, choose another run_dir, or if it is dead delete {path}."
                ) from None
            pid = owner.get("pid")
            if isinstance(pid, int) and _alive(pid):
                raise ValueError(
                    f"{run_dir} is in use by another run (pid {pid} on this host). Wait for it to finish, stop it, "
                    "or choose another run_dir=...; two runs in one folder would mix their metrics and checkpoints."
                ) from None
            warnings.warn(f"Removing the stale lock of a run that no longer exists (pid {pid}): {path}", stacklevel=3)
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(descriptor, "w") as file:
            json.dump(me, file)
        break
    else:
        raise ValueError(f"Could not take {path}: another run keeps creating it.")
    try:
        yield path
    finally:
        if _owner(path).get("pid") == me["pid"]:
            path.unlink(missing_ok=True)
