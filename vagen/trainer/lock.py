"""One run per run folder: `run_dir/.run.lock`, held with an OS lock and naming its holder (pid and host).

Two runs started into one `run_dir` would interleave their metrics, configs and checkpoints. A run holds an
exclusive `fcntl.flock` on the lock file for as long as it runs: the kernel grants it to one process only and
releases it when that process ends, however it ends. The file never exists without its holder's pid: a new lock is
written to a temp file, flocked, and then linked into place (the link fails if another taker was first).

A lock file whose flock is free was left by a run that ended without removing it (kill -9). It is stale and taken
over with a warning, unless it names a live process on this host (a run of an older vagen that wrote the pid but
holds no flock; refusing is the safe side) or another host, which cannot be checked from here: both are refused
with the command to remove it.
"""

from __future__ import annotations

import contextlib
import fcntl
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
    """The {"pid": int, "host": str} a lock file names, or {} when it is empty, unreadable or of another shape."""
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(owner, dict) or type(owner.get("pid")) is not int or not isinstance(owner.get("host"), str):
        return {}
    return owner


def _flocked(descriptor: int) -> bool:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _is_at(descriptor: int, path: Path) -> bool:
    """Whether `path` is still the file `descriptor` was opened on (a holder removes it before letting go)."""
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        return False


def _new_lock(path: Path, me: dict) -> tuple[int, Path]:
    """A flocked temp file beside `path` that already names us; the caller puts it in place."""
    temp = path.with_name(f"{LOCK_FILENAME}.{me['pid']}.{os.urandom(4).hex()}")
    descriptor = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    os.write(descriptor, json.dumps(me).encode())
    os.fsync(descriptor)
    return descriptor, temp


def _refusal(run_dir: Path, path: Path, owner: dict, me: dict) -> ValueError:
    if owner.get("host", me["host"]) != me["host"]:
        return ValueError(
            f"{run_dir} is in use by pid {owner.get('pid')} on host {owner['host']} ({path}). Wait for that run, "
            f"choose another run_dir, or if it is dead delete {path}."
        )
    return ValueError(
        f"{run_dir} is in use by another run (pid {owner.get('pid', 'unknown')} on this host). Wait for it to "
        "finish, stop it, or choose another run_dir=...; two runs in one folder would mix their metrics and "
        f"checkpoints. If no run is using it, delete {path}."
    )


def _take(run_dir: Path, path: Path, me: dict) -> int:
    """The descriptor that holds the lock of `run_dir`, or ValueError naming the run that holds it."""
    while True:
        try:
            held = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            descriptor, temp = _new_lock(path, me)
            try:
                os.link(temp, path)  # atomic, and fails if another taker linked its lock first
            except OSError as error:
                os.close(descriptor)
                if isinstance(error, FileExistsError):
                    continue
                raise
            finally:
                temp.unlink()
            return descriptor
        if not _flocked(held):
            os.close(held)
            raise _refusal(run_dir, path, _owner(path), me)
        if not _is_at(held, path):  # its holder removed it between our open and our flock: look again
            os.close(held)
            continue
        owner = _owner(path)
        if owner and (owner["host"] != me["host"] or _alive(owner["pid"])):
            os.close(held)
            raise _refusal(run_dir, path, owner, me)
        warnings.warn(
            f"Taking over the stale lock of a run that no longer exists ({owner or 'no owner'}): {path}", stacklevel=4
        )
        try:
            descriptor, temp = _new_lock(path, me)
            os.replace(temp, path)  # still holding the old file's flock, so no other taker can come between
        finally:
            os.close(held)
        return descriptor


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[Path]:
    """Hold `run_dir/.run.lock` for the duration of the block; raise ValueError if another run holds it."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILENAME
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a run lock. Fix: remove it (rmdir {path}) and rerun.")
    try:
        descriptor = _take(run_dir, path, me)
    except OSError as error:
        raise ValueError(
            f"Cannot write the run lock {path} ({error.strerror}). Fix: choose a run_dir=... that exists (or can be "
            "created) and that you can write to."
        ) from error
    try:
        yield path
    finally:
        if _is_at(descriptor, path):
            path.unlink()
        os.close(descriptor)  # releases the flock
