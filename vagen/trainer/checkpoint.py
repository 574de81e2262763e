"""Atomic checkpoints that resume a run exactly: weights, optimizer, scheduler, RNG and loop state.

Layout of one checkpoint, `run_dir/checkpoints/iter_{iteration:06d}/`:

    modules/<name>.safetensors   weights (`model.state_dict()`, tied tensors stored once)
    optimizers.pt                {name: optimizer.state_dict()}
    schedulers.pt                {name: scheduler.state_dict()}
    state.pt                     the trainer's plain-python `state` (ints, floats, small tensors, ...)
    rng.pt                       python `random`, numpy global, torch CPU (and CUDA) generator states
    complete.json                written LAST: iteration, time, vagen version, fingerprint, file sizes and sha256

Everything is written into a hidden temp folder beside the final one and renamed into place only
after `complete.json` exists, so a crash or Ctrl-C mid-save never leaves a folder that looks
complete. A folder without the marker is ignored by `latest_checkpoint` and refused by `load_checkpoint`.
Old checkpoints are deleted only after the new one is in place.

Exact resume needs every source of randomness to be either restored here (the global generators)
or carried in `state` (e.g. `torch.Generator.get_state()` of a private generator, a seed cursor).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model

import vagen

CHECKPOINTS_DIRNAME = "checkpoints"
MARKER_FILENAME = "complete.json"
_CHECKPOINT_NAME = re.compile(r"^iter_(\d+)$")
_MODULE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_TEMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_PLAIN_SCALARS = (bool, int, float, str, type(None))


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    """The folder a checkpoint of `iteration` lives in (whether or not it exists)."""
    return Path(run_dir) / CHECKPOINTS_DIRNAME / f"iter_{iteration:06d}"


def _check_plain(value: Any, where: str) -> None:
    """Raise unless `value` is made of containers, python scalars and tensors only.

    Checked at save time because `torch.load(weights_only=True)` refuses anything else on resume,
    and a run should fail at its first checkpoint, not when someone tries to resume it days later.
    """
    if type(value) in _PLAIN_SCALARS or isinstance(value, torch.Tensor):
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) not in _PLAIN_SCALARS:
                raise ValueError(f"{where} has a key of type {type(key).__name__}; use str or int keys.")
            _check_plain(item, f"{where}[{key!r}]")
        return
    raise ValueError(
        f"{where} is a {type(value).__name__}, which a checkpoint cannot store safely. Fix: convert it to "
        "python scalars, lists, dicts or torch tensors (e.g. float(x), x.tolist(), torch.from_numpy(x))."
    )


def _rng_states() -> dict[str, Any]:
    numpy_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        # numpy arrays are not allowed by torch.load(weights_only=True): store the key as a list of ints.
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": numpy_state["state"]["key"].tolist(),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _restore_rng_states(states: dict[str, Any]) -> None:
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    numpy_state = states["numpy"]
    np.random.set_state(
        {
            "bit_generator": numpy_state["bit_generator"],
            "state": {"key": np.asarray(numpy_state["key"], dtype=np.uint32), "pos": numpy_state["pos"]},
            "has_gauss": numpy_state["has_gauss"],
            "gauss": numpy_state["gauss"],
        }
    )
    torch.set_rng_state(states["torch"])
    saved_cuda = states["cuda"]
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if saved_cuda and len(saved_cuda) != available:
        warnings.warn(
            f"The checkpoint holds RNG states for {len(saved_cuda)} CUDA device(s) but {available} are visible; "
            "restoring the common ones only, so GPU sampling will not replay exactly.",
            stacklevel=3,
        )
    for device_index in range(min(len(saved_cuda), available)):
        torch.cuda.set_rng_state(saved_cuda[device_index], device_index)


def _json_ready(fingerprint: dict[str, Any] | None) -> dict[str, Any]:
    """The fingerprint as it will read back from JSON (tuples become lists), or a clear error."""
    if fingerprint is None:
        return {}
    try:
        return json.loads(json.dumps(fingerprint, sort_keys=True))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"The checkpoint fingerprint must be JSON-serialisable ({error}). Fix: use strings and numbers, "
            "e.g. {'model': cfg.model.name, 'env': cfg.env.name}."
        ) from error


def _fsync_tree(folder: Path) -> None:
    """Flush file contents and the folder entry so a power cut cannot leave a marker next to empty files."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    if hasattr(os, "O_DIRECTORY"):
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _write_contents(
    folder: Path,
    modules: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    state: dict[str, Any],
) -> None:
    (folder / "modules").mkdir()
    for name, module in modules.items():
        save_model(module, str(folder / "modules" / f"{name}.safetensors"))
    torch.save({name: optimizer.state_dict() for name, optimizer in optimizers.items()}, folder / "optimizers.pt")
    torch.save({name: scheduler.state_dict() for name, scheduler in schedulers.items()}, folder / "schedulers.pt")
    torch.save(state, folder / "state.pt")
    torch.save(_rng_states(), folder / "rng.pt")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_marker(folder: Path, iteration: int, fingerprint: dict[str, Any]) -> None:
    files = [path for path in sorted(folder.rglob("*")) if path.is_file()]
    sizes = {str(path.relative_to(folder)): path.stat().st_size for path in files}
    marker = {
        "iteration": iteration,
        "time": time.time(),
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "vagen_version": vagen.__version__,
        "fingerprint": fingerprint,
        "file_sizes": sizes,
        # Same-size corruption (a flipped block) passes the size check and would load as NaN weights.
        "file_sha256": {str(path.relative_to(folder)): _sha256(path) for path in files},
    }
    (folder / MARKER_FILENAME).write_text(json.dumps(marker, indent=2, sort_keys=True))


def _validate_save_args(iteration: int, modules, optimizers, schedulers, state, keep_last) -> None:
    if not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be a non-negative int, got {iteration!r}.")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (or None to keep every checkpoint), got {keep_last}.")
    for name in modules:
        if not _MODULE_NAME.match(name):
            raise ValueError(f"Module name {name!r} is not usable as a file name; use letters, digits, '_', '-', '.'.")
    _check_plain(state, "state")
    for name, scheduler in schedulers.items():
        _check_plain(scheduler.state_dict(), f"schedulers[{name!r}].state_dict()")
    for name, optimizer in optimizers.items():
        _check_plain(optimizer.state_dict(), f"optimizers[{name!r}].state_dict()")


def _remove_leftovers(parent: Path) -> None:
    """Delete temp/trash folders left by a save or cleanup that was killed; they never hold a usable checkpoint."""
    for path in parent.iterdir():
        if path.is_dir() and path.name.startswith((_TEMP_PREFIX, _TRASH_PREFIX)):
            shutil.rmtree(path, ignore_errors=True)


def _delete_checkpoint(path: Path) -> None:
    # Rename first: a deletion killed halfway then leaves a hidden trash folder, not a damaged `iter_*`.
    trash = path.with_name(f"{_TRASH_PREFIX}{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def save_checkpoint(
    run_dir: Path,
    iteration: int,
    *,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
    state: dict[str, Any],
    keep_last: int | None = 2,
    fingerprint: dict[str, Any] | None = None,
) -> Path:
    """Write `run_dir/checkpoints/iter_{iteration:06d}/` atomically and return its path.

    Args:
        run_dir: the run's output folder.
        iteration: the trainer's iteration counter (by convention, the number of completed iterations,
            i.e. where the loop resumes).
        modules, optimizers, schedulers: name -> object; the same names must be passed to `load_checkpoint`.
        state: plain python (scalars, lists, dicts, tensors) the loop needs to continue: seed cursor, EMAs, ...
        keep_last: how many complete checkpoints to keep (older ones deleted after this one is in place);
            None keeps all.
        fingerprint: JSON-able facts that must match on resume (model name, env, ...).
    """
    _validate_save_args(iteration, modules, optimizers, schedulers, state, keep_last)
    fingerprint_json = _json_ready(fingerprint)
    final = checkpoint_dir(run_dir, iteration)
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(parent)
    temp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{final.name}-", dir=parent))
    try:
        _write_contents(temp, modules, optimizers, schedulers, state)
        _fsync_tree(temp)
        _write_marker(temp, iteration, fingerprint_json)
        _fsync_tree(temp)
        if final.exists():  # saving the same iteration again, e.g. after resuming from it
            _delete_checkpoint(final)
        os.replace(temp, final)
    except BaseException as error:
        # BaseException on purpose: Ctrl-C mid-save must not leave a half-written folder behind.
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            previous = _checkpoint_folders(run_dir)
            kept = f"the last complete checkpoint {previous[-1][1]} is intact" if previous else "no earlier checkpoint"
            raise ValueError(
                f"No space left on the device while saving checkpoint {final} ({kept}). Fix: free disk space "
                f"under {parent} (or lower trainer.keep_checkpoints) and rerun the command to resume."
            ) from error
        raise
    if keep_last is not None:
        for old in complete_checkpoints(run_dir)[:-keep_last]:
            _delete_checkpoint(old)
    return final


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / MARKER_FILENAME).read_text())
    except (OSError, ValueError):
        return None


def _checkpoint_folders(run_dir: Path) -> list[tuple[int, Path, bool]]:
    """(iteration, folder, marker readable) of every `iter_*` folder of a run, oldest first."""
    parent = Path(run_dir) / CHECKPOINTS_DIRNAME
    if not parent.is_dir():
        return []
    found = []
    for path in parent.iterdir():
        match = _CHECKPOINT_NAME.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path, _read_marker(path) is not None))
    return sorted(found)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest first (by iteration number).

    Saves write a temp folder and rename it whole, so an `iter_*` folder without a readable marker is damage, not
    an unfinished save. Skipping it would restart the run and later overwrite it, so this raises instead.
    """
    folders = _checkpoint_folders(run_dir)
    for _, path, readable in folders:
        if not readable:
            raise ValueError(
                f"Checkpoint {path} has a missing or damaged {MARKER_FILENAME}, so it cannot be trusted; it was "
                f"left untouched. Fix: move that folder out of {path.parent} (keep it if you want to inspect it), "
                "then rerun to continue from the previous complete checkpoint, or restore the marker."
            )
    return [path for _, path, _ in folders]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of `run_dir`, or None; temp folders and unmarked folders are ignored."""
    checkpoints = complete_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def _previous_hint(path: Path) -> str:
    match = _CHECKPOINT_NAME.match(path.name)
    iteration = int(match.group(1)) if match else None
    earlier = [
        other
        for number, other, readable in _checkpoint_folders(path.parent.parent)
        if readable and (iteration is None or number < iteration)
    ]
    return f"resume from {earlier[-1]}" if earlier else "start the run afresh (no earlier complete checkpoint)"


def _check_marker(path: Path, fingerprint: dict[str, Any] | None) -> dict[str, Any]:
    if not path.is_dir():
        raise ValueError(f"No checkpoint folder at {path}. Fix: pass a folder returned by latest_checkpoint(run_dir).")
    if not (path / MARKER_FILENAME).is_file():
        raise ValueError(
            f"Incomplete checkpoint {path} (no {MARKER_FILENAME}), probably interrupted while saving or damaged; "
            f"move it out of the run folder and {_previous_hint(path)}."
        )
    marker = _read_marker(path)
    if marker is None:
        raise ValueError(
            f"{path / MARKER_FILENAME} is unreadable or corrupt; move {path} out of the run folder and "
            f"{_previous_hint(path)}."
        )
    if fingerprint is not None:
        saved, current = marker.get("fingerprint", {}), _json_ready(fingerprint)
        differing = sorted(
            key for key in saved.keys() | current.keys() if saved.get(key, "<absent>") != current.get(key, "<absent>")
        )
        if differing:
            details = "; ".join(
                f"{key}: checkpoint {saved.get(key, '<absent>')!r}, config {current.get(key, '<absent>')!r}"
                for key in differing
            )
            raise ValueError(
                f"Checkpoint {path} was made with a different setup ({details}). Fix: resume with the config the "
                "run was started with, or start a new run in a fresh run_dir."
            )
    for name, size in marker.get("file_sizes", {}).items():
        file = path / name
        if not file.is_file() or file.stat().st_size != size:
            actual = file.stat().st_size if file.is_file() else "missing"
            raise ValueError(
                f"Checkpoint file {file} is corrupt or truncated (expected {size} bytes, found {actual}); "
                f"move {path} out of the run folder and {_previous_hint(path)}."
            )
    for name, expected in marker.get("file_sha256", {}).items():
        if _sha256(path / name) != expected:
            raise ValueError(
                f"Checkpoint file {path / name} is corrupt (its sha256 differs from the one recorded when it was "
                f"saved); move {path} out of the run folder and {_previous_hint(path)}."
            )
    return marker


def _check_names(kind: str, saved: set[str], given: set[str], path: Path) -> None:
    if saved != given:
        raise ValueError(
            f"Checkpoint {path} holds {kind} {sorted(saved)} but {sorted(given)} were passed. Fix: pass the same "
            f"{kind} names to load_checkpoint as to save_checkpoint."
        )


def _torch_load(file: Path, checkpoint: Path) -> Any:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(
            f"Cannot read checkpoint file {file} ({type(error).__name__}: {error}); it is corrupt or not from "
            f"vagen. Fix: move {checkpoint} out of the run folder and {_previous_hint(checkpoint)}."
        ) from error


def _check_module_file(name: str, module: torch.nn.Module, file: Path, checkpoint: Path) -> None:
    """Compare names and shapes from the file header before touching the module, so a mismatch changes nothing."""
    try:
        with safe_open(str(file), framework="pt") as reader:
            saved_shapes = {key: tuple(reader.get_slice(key).get_shape()) for key in reader.keys()}  # noqa: SIM118
    except Exception as error:
        raise ValueError(
            f"Cannot read weights {file} ({type(error).__name__}: {error}); the file is corrupt. "
            f"Fix: move {checkpoint} out of the run folder and {_previous_hint(checkpoint)}."
        ) from error
    current = {key: tuple(tensor.shape) for key, tensor in module.state_dict().items()}
    unexpected = sorted(set(saved_shapes) - set(current))
    mismatched = [
        f"{key}: checkpoint {saved_shapes[key]}, model {current[key]}"
        for key in sorted(saved_shapes.keys() & current.keys())
        if saved_shapes[key] != current[key]
    ]
    if unexpected or mismatched:
        problems = (f"unexpected keys {unexpected[:5]}" if unexpected else "") + (
            f" shape mismatches {mismatched[:5]}" if mismatched else ""
        )
        raise ValueError(
            f"Module {name!r} ({type(module).__name__}) does not match checkpoint {checkpoint}: {problems.strip()}. "
            "Fix: build the model from the same config as the run that saved it, or start a fresh run_dir."
        )


def _load_module(name: str, module: torch.nn.Module, file: Path, checkpoint: Path) -> None:
    try:
        load_model(module, str(file), strict=True)
    except RuntimeError as error:
        raise ValueError(
            f"Module {name!r} does not match checkpoint {checkpoint}: {error}. Fix: build the model from the same "
            "config as the run that saved it, or start a fresh run_dir."
        ) from error


def load_checkpoint(
    path: Path,
    *,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
    fingerprint: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint in place (strict weights, optimizer, scheduler, global RNGs); return the saved `state`.

    Every file is read and checked before any object is changed, so an error leaves them as they were.
    Raises ValueError naming the cause and the fix: incomplete or corrupt checkpoint, fingerprint
    mismatch (`fingerprint` given and different from the saved one), or module names/keys/shapes that differ.
    """
    path = Path(path)
    _check_marker(path, fingerprint)
    saved_modules = {file.stem for file in (path / "modules").glob("*.safetensors")}
    _check_names("modules", saved_modules, set(modules), path)
    optimizer_states = _torch_load(path / "optimizers.pt", path)
    scheduler_states = _torch_load(path / "schedulers.pt", path)
    state = _torch_load(path / "state.pt", path)
    rng_states = _torch_load(path / "rng.pt", path)
    _check_names("optimizers", set(optimizer_states), set(optimizers), path)
    _check_names("schedulers", set(scheduler_states), set(schedulers), path)
    for name, module in modules.items():
        _check_module_file(name, module, path / "modules" / f"{name}.safetensors", path)
    for name, module in modules.items():
        _load_module(name, module, path / "modules" / f"{name}.safetensors", path)
    for name, optimizer in optimizers.items():
        try:
            optimizer.load_state_dict(optimizer_states[name])
        except (ValueError, KeyError) as error:
            raise ValueError(
                f"Optimizer {name!r} does not match checkpoint {path} ({error}). Fix: create it over the same "
                "parameters (same model, same param groups) as the run that saved it."
            ) from error
    for name, scheduler in schedulers.items():
        scheduler.load_state_dict(scheduler_states[name])
    _restore_rng_states(rng_states)
    return state
