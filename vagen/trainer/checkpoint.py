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
complete. Old checkpoints are deleted only after the new one is in place, and a save never goes behind a newer
checkpoint (that folder holds another run's history). A full disk, however the writing library reports it,
ends with one error naming the last complete checkpoint.

`verify_checkpoint` is the one integrity check of every loader (resume, evaluation, warm starts): the marker's
sizes and sha256 are mandatory, every file must be listed, and an `iter_N` folder must hold iteration N.

Exact resume needs every source of randomness to be either restored here (the global generators)
or carried in `state` (e.g. `torch.Generator.get_state()` of a private generator, a seed cursor).
"""

from __future__ import annotations

import errno
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
from vagen.models.cache import check_files, file_manifest

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


def _torch_save(obj: Any, file: Path) -> None:
    # Through a python file object: on a full disk torch.save raises a bare RuntimeError, and only this way does
    # the OSError (ENOSPC) come with it, as its context.
    with open(file, "wb") as handle:
        torch.save(obj, handle)


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error` means a full disk or quota: an OSError, safetensors' SafetensorError ("... (os error 28)")
    or torch.save's RuntimeError with the OSError as its context."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if f"(os error {errno.ENOSPC})" in str(error) or f"(os error {errno.EDQUOT})" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


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
    _torch_save({name: optimizer.state_dict() for name, optimizer in optimizers.items()}, folder / "optimizers.pt")
    _torch_save({name: scheduler.state_dict() for name, scheduler in schedulers.items()}, folder / "schedulers.pt")
    _torch_save(state, folder / "state.pt")
    _torch_save(_rng_states(), folder / "rng.pt")


def _write_marker(folder: Path, iteration: int, fingerprint: dict[str, Any]) -> None:
    marker = {
        "iteration": iteration,
        "time": time.time(),
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "vagen_version": vagen.__version__,
        "fingerprint": fingerprint,
        # Sizes and sha256: same-size corruption (a flipped block) passes a size check and would load as NaN weights.
        **file_manifest(folder, MARKER_FILENAME),
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
    newer = [(path, problem) for number, path, problem in _checkpoint_folders(run_dir) if number > iteration]
    if newer:  # the rotation below would delete this save at once, and a resume would continue the other history
        path, problem = newer[-1]
        if problem is not None:  # a renamed or damaged folder, not a newer checkpoint: say that instead
            raise problem
        raise ValueError(
            f"Refusing to save iteration {iteration} into {parent}: it already holds a newer checkpoint "
            f"({path.name}) of another run. Fix: continue that run with trainer.resume=auto, or start this "
            "one in a new run_dir=..."
        )
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
        if is_disk_full(error):
            previous = [path for _, path, problem in _checkpoint_folders(run_dir) if problem is None]
            kept = f"the last complete checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint"
            raise ValueError(
                f"No space left on the device while saving checkpoint {final} ({kept}). Fix: free disk space "
                f"under {parent} (or lower trainer.keep_checkpoints) and rerun the command to resume."
            ) from error
        raise
    if keep_last is not None:
        for old in complete_checkpoints(run_dir)[:-keep_last]:
            _delete_checkpoint(old)
    return final


def _read_marker(path: Path) -> Any:
    """The parsed marker (any JSON value), or None when it is missing or not JSON."""
    try:
        return json.loads((path / MARKER_FILENAME).read_text())
    except (OSError, ValueError):
        return None


def _marker_problem(marker: Any) -> str | None:
    """What is wrong with the shape of a parsed marker, or None. Sizes and hashes are mandatory: without them a
    damaged file would load silently."""
    if not isinstance(marker, dict):
        return f"is a JSON {type(marker).__name__}, not an object"
    if type(marker.get("iteration")) is not int:
        return "has no integer 'iteration'"
    for field, kind in (("file_sizes", int), ("file_sha256", str)):
        listed = marker.get(field)
        if not isinstance(listed, dict) or not all(type(value) is kind for value in listed.values()):
            return f"has no '{field}' (file -> {kind.__name__}), which the integrity check needs"
    if marker["file_sizes"].keys() != marker["file_sha256"].keys():
        return "lists different files in 'file_sizes' and 'file_sha256'"
    if not isinstance(marker.get("fingerprint", {}), dict):
        return "has a 'fingerprint' that is not a JSON object"
    return None


def _renamed(path: Path, iteration: int) -> ValueError:
    return ValueError(
        f"Checkpoint {path} holds iteration {iteration} (its {MARKER_FILENAME}) but is named {path.name}: the folder "
        f"was renamed, and resuming it would rewind the run and then delete newer checkpoints. Fix: rename it back "
        f"to {checkpoint_dir(path.parent.parent, iteration).name}, or move it out of {path.parent}."
    )


def _folder_problem(path: Path, number: int) -> ValueError | None:
    marker = _read_marker(path)
    problem = "is missing or not JSON" if marker is None else _marker_problem(marker)
    if problem is not None:
        return ValueError(
            f"Checkpoint {path} has a missing or damaged {MARKER_FILENAME} (it {problem}), so it cannot be trusted; "
            f"it was left untouched. Fix: move that folder out of {path.parent} (keep it if you want to inspect it), "
            "then rerun to continue from the previous complete checkpoint, or restore the marker."
        )
    return _renamed(path, marker["iteration"]) if marker["iteration"] != number else None


def _checkpoint_folders(run_dir: Path) -> list[tuple[int, Path, ValueError | None]]:
    """(iteration of the name, folder, what is wrong with its marker or None) of every `iter_*` folder, oldest first."""
    parent = Path(run_dir) / CHECKPOINTS_DIRNAME
    if parent.exists() and not parent.is_dir():
        raise ValueError(
            f"{parent} is a file, not a folder of checkpoints. Fix: move it out of {parent.parent} (or choose "
            "another run_dir=...) and rerun."
        )
    if not parent.is_dir():
        return []
    found = []
    for path in parent.iterdir():
        match = _CHECKPOINT_NAME.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path, _folder_problem(path, int(match.group(1)))))
    return sorted(found, key=lambda item: item[:2])


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest first (by iteration number).

    Saves write a temp folder and rename it whole, so an `iter_*` folder without a readable marker is damage, not
    an unfinished save, and one whose marker holds another iteration was renamed. Skipping it would restart or
    rewind the run and later overwrite it, so this raises instead.
    """
    folders = _checkpoint_folders(run_dir)
    for _, _, problem in folders:
        if problem is not None:
            raise problem
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
        for number, other, problem in _checkpoint_folders(path.parent.parent)
        if problem is None and (iteration is None or number < iteration)
    ]
    return f"resume from {earlier[-1]}" if earlier else "start the run afresh (no earlier complete checkpoint)"


def verify_checkpoint(path: Path, fingerprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """The integrity check every loader runs before it reads anything else; returns the marker.

    Raises ValueError naming the cause and the fix when: the marker is missing, unreadable or of the wrong shape
    (sizes and sha256 are mandatory); an `iter_N` folder holds another iteration (it was renamed); a file is not
    listed in the marker, or is missing, resized or changed since the save; or, with `fingerprint`, the checkpoint
    was made with a different setup.
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"No checkpoint folder at {path}. Fix: pass a folder returned by latest_checkpoint(run_dir).")
    if not (path / MARKER_FILENAME).is_file():
        raise ValueError(
            f"Incomplete checkpoint {path} (no {MARKER_FILENAME}), probably interrupted while saving or damaged; "
            f"move it out of the run folder and {_previous_hint(path)}."
        )
    marker = _read_marker(path)
    problem = "is unreadable or corrupt" if marker is None else _marker_problem(marker)
    if problem is not None:
        raise ValueError(
            f"{path / MARKER_FILENAME} {problem}, so the checkpoint cannot be verified; move {path} out of the run "
            f"folder and {_previous_hint(path)}."
        )
    match = _CHECKPOINT_NAME.match(path.name)
    if match and int(match.group(1)) != marker["iteration"]:
        raise _renamed(path, marker["iteration"])
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
    problem = check_files(path, marker, MARKER_FILENAME)
    if problem is None:
        return marker
    name, what = problem
    if what == "unlisted":
        raise ValueError(
            f"Checkpoint file {path / name} is not listed in its {MARKER_FILENAME}: the save that completed the "
            f"checkpoint did not write it, so it cannot be trusted. Fix: move it out of {path} (or move {path} out "
            f"of the run folder and {_previous_hint(path)})."
        )
    damage = "corrupt (its sha256 differs from the one recorded when it was saved)"
    if what != "sha256 differs":
        damage = f"corrupt or truncated ({what})"
    raise ValueError(
        f"Checkpoint file {path / name} is {damage}; move {path} out of the run folder and {_previous_hint(path)}."
    )


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


def _loop_state(path: Path, marker: dict[str, Any]) -> Any:
    """The checkpoint's state.pt, checked to be of the iteration its (verified) marker names."""
    state = _torch_load(path / "state.pt", path)
    saved_iteration = state.get("iteration", marker["iteration"]) if isinstance(state, dict) else marker["iteration"]
    if saved_iteration != marker["iteration"]:
        raise ValueError(
            f"Checkpoint {path}: its state.pt is of iteration {saved_iteration} but its {MARKER_FILENAME} says "
            f"{marker['iteration']}, so the folder was renamed and its marker edited. Fix: move {path} out of the "
            f"run folder and {_previous_hint(path)}."
        )
    return state


def read_state(path: Path) -> dict[str, Any]:
    """The loop `state` a checkpoint holds, verified like every load but restoring nothing: what an analysis of a run
    reads (e.g. `val_history`, each validation's success per held-out level). Raises ValueError as `load_checkpoint`
    does for an incomplete or corrupt checkpoint."""
    path = Path(path)
    return _loop_state(path, verify_checkpoint(path))


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
    marker = verify_checkpoint(path, fingerprint)
    saved_modules = {file.stem for file in (path / "modules").glob("*.safetensors")}
    _check_names("modules", saved_modules, set(modules), path)
    optimizer_states = _torch_load(path / "optimizers.pt", path)
    scheduler_states = _torch_load(path / "schedulers.pt", path)
    state = _loop_state(path, marker)
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
