"""A run folder holds one run's history: fresh runs into used folders refuse before any model loads, segment configs
are never overwritten, every loader (the evaluator too) verifies checkpoints, and damaged folders, unusable run_dirs
and a full disk end in one clear error (issue 37, classes 2, 5 and 8)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_trainer import TEXT as TRAINER_TEXT

from vagen.logging import MetricsLogger, read_metrics
from vagen.trainer import learner as learner_module
from vagen.trainer.checkpoint import MARKER_FILENAME, latest_checkpoint
from vagen.trainer.lock import LOCK_FILENAME
from vagen.trainer.run import train

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "configs"
TEXT = [*TRAINER_TEXT, "trainer.save_every=1"]


def config(run_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("train", overrides=[*TEXT, *overrides])
    cfg.run_dir = str(run_dir)
    return cfg


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A finished 2-iteration run (checkpoints 1 and 2, metrics, config), copied by the tests that change it."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train(config(run_dir, "trainer.iterations=2"))
    return run_dir


@pytest.fixture
def used_run(trained_run, tmp_path) -> Path:
    run_dir = tmp_path / "used"
    shutil.copytree(trained_run, run_dir)
    return run_dir


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if a model starts loading (the refusals must come before)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the run folder was checked")

    monkeypatch.setattr(learner_module, "load_policy", refuse)


def listing(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


# ---- class 2: one history per folder -------------------------------------------------------------------------


@pytest.mark.parametrize("history", ["checkpoints", "metrics only"])
def test_a_fresh_run_into_a_used_folder_refuses_before_any_model_loads(used_run, no_model, history):
    """resume=never into a used folder used to train, have its new checkpoint deleted by the rotation, mix its metrics
    with the old checkpoints, and leave the next plain rerun resuming the old run."""
    if history == "metrics only":  # a run that was stopped before its first checkpoint
        shutil.rmtree(used_run / "checkpoints")
    before = listing(used_run)
    with pytest.raises(ValueError, match=r"already holds a run .*trainer\.resume=auto.*new run_dir"):
        train(config(used_run, "trainer.iterations=3", "trainer.resume=never", "seed=1"))
    assert listing(used_run) == before


def test_continuing_another_runs_checkpoint_into_a_used_folder_refuses(used_run, trained_run, tmp_path, no_model):
    other = tmp_path / "other"
    shutil.copytree(trained_run, other)
    before = listing(used_run)
    with pytest.raises(ValueError, match=r"already holds a run .*trainer\.resume=auto"):
        train(config(used_run, "trainer.iterations=3", f"trainer.resume={latest_checkpoint(other)}"))
    assert listing(used_run) == before


def test_naming_the_folders_own_latest_checkpoint_continues_it(used_run):
    train(config(used_run, "trainer.iterations=3", f"trainer.resume={latest_checkpoint(used_run)}"))
    assert latest_checkpoint(used_run).name == "iter_000003"
    assert [record["step"] for record in read_metrics(used_run)] == [1, 2, 3]


@pytest.mark.parametrize(
    ("override", "key"), [("seed=7", "seed"), ("env.kwargs.max_turns=2", "env_kwargs"), ("algorithm=ppo", "algorithm")]
)
def test_resuming_with_another_setup_refuses_before_any_model_loads(used_run, no_model, override, key):
    """The seed too: a run resumed under another seed would record that seed in its segment config while its RNG and
    level cursor continue the first one's."""
    with pytest.raises(ValueError, match=rf"was made with a different setup \({key}: checkpoint"):
        train(config(used_run, "trainer.iterations=3", override))


def test_two_resumes_at_one_iteration_keep_every_segment_config(tmp_path):
    """Two resumes in a row at iteration 1 used to overwrite config.until_iter_000001.yaml."""
    run_dir = tmp_path / "run"
    for lr in ("2e-5", "3e-5", "4e-5"):  # iterations=1 each time: the resumes train nothing, each a new segment
        train(config(run_dir, "trainer.iterations=1", f"trainer.lr={lr}"))
    segments = sorted(run_dir.glob("config.until_iter_000001*.yaml"))
    assert len(segments) == 2, segments
    assert sorted(OmegaConf.load(p).trainer.lr for p in segments) == [2e-5, 3e-5]
    assert OmegaConf.load(run_dir / "config.yaml").trainer.lr == 4e-5


# ---- class 5: the evaluator runs the same verification ------------------------------------------------------


def _flip_last_bytes(checkpoint: Path) -> None:
    weights = checkpoint / "modules" / "policy.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(255 - b for b in data[-8:])
    weights.write_bytes(bytes(data))


def _drop_hashes(checkpoint: Path) -> None:
    marker = json.loads((checkpoint / MARKER_FILENAME).read_text())
    del marker["file_sha256"]
    (checkpoint / MARKER_FILENAME).write_text(json.dumps(marker))


DAMAGE = {
    "flipped bytes": (_flip_last_bytes, r"policy\.safetensors is corrupt \(its sha256 differs"),
    "hashes deleted": (_drop_hashes, r"complete\.json.* has no 'file_sha256'"),
    "unlisted file": (lambda c: (c / "modules" / "extra.bin").write_bytes(b"x"), r"extra\.bin is not listed"),
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("entry", ["run folder", "checkpoint folder"])
def test_the_evaluator_refuses_what_resume_refuses(used_run, damage, entry):
    from vagen.eval.models import load_local_policy, resolve_model

    checkpoint = latest_checkpoint(used_run)
    damage_fn, message = DAMAGE[damage]
    damage_fn(checkpoint)
    folder = used_run if entry == "run folder" else checkpoint
    with pytest.raises(ValueError, match=message):  # a damaged marker is refused already when a run folder resolves
        load_local_policy(resolve_model(str(folder), OmegaConf.create({"name": "hf"}), CONFIG_DIR, {}), "cpu")
    with pytest.raises(ValueError, match=message):  # resume says the same
        train(config(used_run, "trainer.iterations=3"))


# ---- class 8: damaged folders and unusable run_dirs, one clear error each -----------------------------------


def _read_only_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "read_only"
    folder.mkdir()
    if os.geteuid() == 0:  # root writes through file permissions: mount a read-only tmpfs instead
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)])
        if mounted.returncode != 0:
            pytest.skip("cannot make a read-only folder here")
    else:
        folder.chmod(0o555)
    return folder


def _damage(kind: str, used_run: Path, tmp_path: Path) -> tuple[Path, str]:
    """Damage a copy of a used run folder (or pick an unusable run_dir); return the run_dir and the expected error."""
    if kind == "checkpoints is a file":
        shutil.rmtree(used_run / "checkpoints")
        (used_run / "checkpoints").write_text("")
        return used_run, r"checkpoints is a file, not a folder of checkpoints\. Fix: move it"
    if kind == ".run.lock is a directory":
        (used_run / LOCK_FILENAME).mkdir()
        return used_run, r"\.run\.lock is a directory, not a run lock\. Fix: remove it"
    if kind == "marker is a JSON list":
        (latest_checkpoint(used_run) / MARKER_FILENAME).write_text("[]")
        return used_run, r"iter_000002 has a missing or damaged complete\.json.*Fix: move that folder"
    if kind == "marker iteration is a string":
        checkpoint = latest_checkpoint(used_run)
        marker = json.loads((checkpoint / MARKER_FILENAME).read_text())
        (checkpoint / MARKER_FILENAME).write_text(json.dumps({**marker, "iteration": "2"}))
        return used_run, r"iter_000002 has a missing or damaged complete\.json"
    if kind == "run_dir is a file":
        (tmp_path / "file").write_text("")
        return tmp_path / "file", r"run_dir=.*/file is a file, not a folder\. Fix: choose another run_dir"
    if kind == "run_dir under /proc":
        return Path("/proc/vagen-run"), r"Cannot create run_dir=/proc/vagen-run \(No such file or directory\)"
    if kind == "run_dir read-only":
        return _read_only_folder(tmp_path) / "run", r"Cannot create run_dir=.*read_only/run \(Read-only file system"
    if kind == "run_dir read-only, existing":
        return _read_only_folder(tmp_path), r"Cannot write the run lock .*\(Read-only file system.*run_dir"
    raise AssertionError(kind)


BEFORE_LOAD = [
    "checkpoints is a file",
    ".run.lock is a directory",
    "marker is a JSON list",
    "marker iteration is a string",
    "run_dir is a file",
    "run_dir under /proc",
    "run_dir read-only",
    "run_dir read-only, existing",
]


@pytest.mark.parametrize("kind", BEFORE_LOAD)
def test_a_damaged_folder_or_unusable_run_dir_is_one_clear_error_before_any_model_loads(
    used_run, tmp_path, no_model, kind
):
    run_dir, message = _damage(kind, used_run, tmp_path)
    try:
        with pytest.raises(ValueError, match=message):
            train(config(run_dir, "trainer.iterations=3"))
    finally:
        if "read-only" in kind and os.geteuid() == 0:
            subprocess.run(["umount", "--lazy", str(tmp_path / "read_only")])


@pytest.mark.parametrize("line", ["[1, 2]", "5", '"text"', '{"step": "1"}', '{"time": 1.0}', '{"step": true}'])
def test_a_metrics_line_of_the_wrong_json_type_is_one_clear_error(used_run, no_model, line):
    path = used_run / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], line, *lines[1:]]) + "\n")
    message = r"metrics\.jsonl line 2 is not a metrics record .*Fix: delete or repair that line"
    with pytest.raises(ValueError, match=message):
        read_metrics(used_run)
    with pytest.raises(ValueError, match=message), MetricsLogger(used_run, wandb_mode="disabled", resume=True) as log:
        log.truncate_after(1)
    with pytest.raises(ValueError, match=message):  # resuming reads the log before any model loads
        train(config(used_run, "trainer.iterations=3"))


def test_a_failed_start_leaves_no_empty_run_folder(tmp_path, no_model):
    run_dir = tmp_path / "new"
    with pytest.raises(AssertionError, match="a model was loaded"):
        train(config(run_dir, "trainer.iterations=1"))
    assert not run_dir.exists()


# ---- class 8: a full disk during a run -------------------------------------------------------------------------


def test_a_real_full_disk_mid_run_names_the_last_complete_checkpoint(tmp_path):
    """On a small tmpfs filled up after the first checkpoint, the second one cannot be written: one error line naming
    the intact first checkpoint (safetensors used to raise its own SafetensorError as a traceback)."""
    import errno

    folder = tmp_path / "tmpfs"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        run_dir = folder / "run"
        train(config(run_dir, "trainer.iterations=1"))
        first = latest_checkpoint(run_dir)
        with open(folder / "filler", "wb", buffering=0) as filler:
            with pytest.raises(OSError) as error:
                while True:
                    filler.write(bytes(4096))
            assert error.value.errno == errno.ENOSPC
            filler.truncate(filler.tell() - 16 * 4096)  # room for the config and the metrics, not a checkpoint
        message = rf"No space left .*iter_000002 \(the last complete checkpoint {first} is intact\).*free disk space"
        with pytest.raises(ValueError, match=message):
            train(config(run_dir, "trainer.iterations=2", "trainer.lr=3e-5"))
        assert latest_checkpoint(run_dir) == first
    finally:
        subprocess.run(["umount", "--lazy", str(folder)])


# ---- the command line: one `error:` line, exit 2 -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["checkpoints is a file", "marker is a JSON list"])
def test_train_script_reports_a_damaged_folder_in_one_line(used_run, tmp_path, kind):
    run_dir, message = _damage(kind, used_run, tmp_path)
    script = ROOT / "scripts" / "train.py"
    result = subprocess.run(
        [sys.executable, str(script), *TEXT, "trainer.iterations=3", f"run_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and __import__("re").search(message, errors[0]), result.stderr
