"""Where offline model sources are found and built artefacts live, and how a folder gets there without
ever looking half-built.

Sources are data files inside installed PyPI distributions, located through the distribution's
file list rather than by importing the package (some of them cannot be imported without their
undeclared-here dependencies).

A built folder counts as complete only when its marker file exists and records the same recipe
stamp the caller asks for. The folder is built in a temporary sibling directory, the marker is
written last, and the directory is renamed into place in one `os.replace`: a build killed at any
point leaves either nothing at the target or a stray temporary directory, never a target that
looks finished. A target without a (matching) marker is treated as absent and rebuilt. The marker also lists
every file's size and sha256 (`file_manifest`), which `verify_built_folder` checks whenever a model loads: a file
changed, resized, missing or added since the build is refused, as a checkpoint's would be (`check_files`, shared with
`vagen.trainer.checkpoint`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

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


FILE_FIELDS = ("file_sizes", "file_sha256")  # the marker's manifest, beside the recipe stamp


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_manifest(folder: Path, marker_name: str) -> dict[str, dict[str, Any]]:
    """{"file_sizes": {name: bytes}, "file_sha256": {name: hex}} of every file under `folder` but its marker."""
    files = [path for path in sorted(Path(folder).rglob("*")) if path.is_file() and path.name != marker_name]
    names = [str(path.relative_to(folder)) for path in files]
    return {
        "file_sizes": {name: path.stat().st_size for name, path in zip(names, files, strict=True)},
        "file_sha256": {name: sha256_file(path) for name, path in zip(names, files, strict=True)},
    }


def check_files(folder: Path, manifest: Mapping[str, Any], marker_name: str) -> tuple[str, str] | None:
    """(file name, what is wrong) for the first file of `folder` that its manifest does not vouch for: not listed,
    missing, resized, or (same size) changed; None when every file is as recorded."""
    folder = Path(folder)
    sizes, hashes = manifest["file_sizes"], manifest["file_sha256"]
    on_disk = {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()} - {marker_name}
    unlisted = sorted(on_disk - sizes.keys())
    if unlisted:
        return unlisted[0], "unlisted"
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return name, f"expected {size} bytes, found {path.stat().st_size if path.is_file() else 'none'}"
    for name, expected in hashes.items():
        if sha256_file(folder / name) != expected:
            return name, "sha256 differs"
    return None


def _read_marker(folder: Path) -> dict | None:
    try:
        marker = json.loads((Path(folder) / COMPLETE_MARKER).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    return marker if isinstance(marker, dict) else None


def read_stamp(folder: Path) -> dict | None:
    """The recipe stamp recorded in `folder`'s marker, or None when the folder is absent or incomplete."""
    marker = _read_marker(folder)
    return None if marker is None else {key: value for key, value in marker.items() if key not in FILE_FIELDS}


def is_complete(folder: Path, stamp: Mapping[str, object]) -> bool:
    """True when `folder` was fully built by the recipe described by `stamp` (and its marker lists its files)."""
    marker = _read_marker(folder)
    return marker is not None and all(field in marker for field in FILE_FIELDS) and read_stamp(folder) == dict(stamp)


def verify_built_folder(folder: Path) -> None:
    """Raise ValueError when a folder built by `build_once` (it has the marker) no longer holds what was built:
    sizes and hashes are mandatory. Folders without the marker (a user's own model folder) are not ours to check."""
    folder = Path(folder)
    if not (folder / COMPLETE_MARKER).is_file():
        return
    marker = _read_marker(folder)
    fix = f"Fix: delete {folder} and load again (it is rebuilt; a shipped folder comes back with `pip install`)."
    if marker is None or not all(isinstance(marker.get(field), dict) for field in FILE_FIELDS):
        raise ValueError(f"{folder / COMPLETE_MARKER} is damaged or lists no file hashes, so {folder} cannot be "
                         f"verified. {fix}")  # fmt: skip
    problem = check_files(folder, marker, COMPLETE_MARKER)
    if problem is not None:
        name, what = problem
        raise ValueError(f"Model file {folder / name} is not what was built ({what}). {fix}")


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
        marker = {**dict(stamp), **file_manifest(staging, COMPLETE_MARKER)}
        (staging / COMPLETE_MARKER).write_text(json.dumps(marker, sort_keys=True))
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
