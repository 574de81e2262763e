"""Atomic checkpoints: round trips, retention, damaged or interrupted saves, and exact resume of a training loop."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from vagen.trainer import checkpoint as ckpt
from vagen.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

FINGERPRINT = {"model": "tiny-mlp", "env": "bandit"}


def _objects(seed: int = 0):
    """A small model, AdamW and a warm-up LambdaLR: the pieces a trainer checkpoints."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
    return model, optimizer, scheduler


def _train_step(model, optimizer, scheduler) -> None:
    # Data comes from the global torch RNG inside the loop, so resume is exact only if the RNG is restored.
    inputs = torch.randn(16, 4)
    targets = inputs.sum(dim=1, keepdim=True) + 0.1 * torch.randn(16, 1)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def _save(run_dir, iteration, model, optimizer, scheduler, **kwargs):
    return save_checkpoint(
        run_dir,
        iteration,
        modules={"policy": model},
        optimizers={"policy": optimizer},
        schedulers={"policy": scheduler},
        state=kwargs.pop("state", {"iteration": iteration}),
        fingerprint=kwargs.pop("fingerprint", FINGERPRINT),
        **kwargs,
    )


def _load(path, model, optimizer, scheduler, fingerprint=FINGERPRINT):
    return load_checkpoint(
        path,
        modules={"policy": model},
        optimizers={"policy": optimizer},
        schedulers={"policy": scheduler},
        fingerprint=fingerprint,
    )


def test_round_trip_restores_weights_optimizer_scheduler_rng_and_state(tmp_path):
    model, optimizer, scheduler = _objects()
    for _ in range(3):
        _train_step(model, optimizer, scheduler)
    ema = torch.tensor([0.25, -1.5])
    random.seed(7), np.random.seed(7), torch.manual_seed(7)  # state at save time is what must come back...
    path = _save(tmp_path, 3, model, optimizer, scheduler, state={"iteration": 3, "seed_cursor": 48, "ema": ema})
    expected_draws = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # ...not whatever happened since

    fresh_model, fresh_optimizer, fresh_scheduler = _objects(seed=1)
    state = _load(path, fresh_model, fresh_optimizer, fresh_scheduler)

    assert state["iteration"] == 3 and state["seed_cursor"] == 48
    assert torch.equal(state["ema"], ema)
    for saved, restored in zip(model.state_dict().values(), fresh_model.state_dict().values(), strict=True):
        assert torch.equal(saved, restored)
    saved_moments = optimizer.state_dict()["state"]
    restored_moments = fresh_optimizer.state_dict()["state"]
    for index, moments in saved_moments.items():
        assert torch.equal(moments["exp_avg"], restored_moments[index]["exp_avg"])
        assert torch.equal(moments["exp_avg_sq"], restored_moments[index]["exp_avg_sq"])
        assert torch.equal(moments["step"], restored_moments[index]["step"])
    assert fresh_scheduler.last_epoch == scheduler.last_epoch == 3
    assert fresh_optimizer.param_groups[0]["lr"] == pytest.approx(optimizer.param_groups[0]["lr"])
    assert random.random() == expected_draws[0]
    assert np.random.rand() == expected_draws[1]
    assert torch.equal(torch.rand(3), expected_draws[2])


def test_four_steps_straight_equal_two_steps_save_load_two_steps(tmp_path):
    torch.manual_seed(123)
    straight = _objects()
    torch.manual_seed(123)
    for _ in range(4):
        _train_step(*straight)

    torch.manual_seed(123)
    first_half = _objects()
    torch.manual_seed(123)
    for _ in range(2):
        _train_step(*first_half)
    path = _save(tmp_path, 2, *first_half)
    torch.manual_seed(999)  # a new process would start from an unrelated RNG state
    resumed = _objects(seed=5)
    state = _load(path, *resumed)
    assert state["iteration"] == 2
    for _ in range(2):
        _train_step(*resumed)

    for expected, actual in zip(straight[0].parameters(), resumed[0].parameters(), strict=True):
        assert torch.allclose(expected, actual, atol=1e-6, rtol=0)
    assert not torch.allclose(next(first_half[0].parameters()), next(resumed[0].parameters()))


def test_keep_last_retains_newest_complete_checkpoints(tmp_path):
    objects = _objects()
    for iteration in range(1, 5):
        _save(tmp_path, iteration, *objects, keep_last=2)
    names = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert names == ["iter_000003", "iter_000004"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "iter_000004"
    _save(tmp_path, 5, *objects, keep_last=None)
    assert len(list((tmp_path / "checkpoints").iterdir())) == 3
    with pytest.raises(ValueError, match="keep_last"):
        _save(tmp_path, 6, *objects, keep_last=0)


def test_damaged_marker_stops_with_the_folder_named_and_nothing_deleted(tmp_path):
    """Saves rename a finished temp folder into place, so an `iter_*` folder without a readable marker is damage:
    skipping it would restart the run and overwrite it. It stops with the folder and the fix, and stays on disk."""
    objects = _objects()
    assert latest_checkpoint(tmp_path) is None
    good = _save(tmp_path, 1, *objects)
    broken = _save(tmp_path, 2, *objects)
    (tmp_path / "checkpoints" / ".tmp-iter_000003-abc").mkdir()  # a save killed by SIGKILL: not a checkpoint
    (broken / ckpt.MARKER_FILENAME).write_text('{"iteration": 2, "file_si')  # damaged
    with pytest.raises(ValueError, match=r"iter_000002 has a missing or damaged complete\.json.*move that folder"):
        latest_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="damaged"):
        _save(tmp_path, 3, *objects)  # the keep_last clean-up must not delete what it cannot read
    assert broken.is_dir() and (broken / "modules").is_dir()
    (broken / ckpt.MARKER_FILENAME).unlink()
    with pytest.raises(ValueError, match=r"Incomplete checkpoint .*interrupted while saving") as error:
        _load(broken, *_objects())
    assert f"resume from {good}" in str(error.value)

    broken.rename(tmp_path / "inspect-later")  # the fix the message gives
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "iter_000003"
    assert not (tmp_path / "checkpoints" / ".tmp-iter_000003-abc").exists()  # leftovers are cleaned on the next save
    assert good.is_dir()


def test_same_size_corruption_inside_the_tensor_data_is_caught_by_the_checksum(tmp_path):
    """Bytes flipped in the weights (the header intact, so safetensors parses it) used to load silently."""
    path = _save(tmp_path, 1, *_objects())
    weights = path / "modules" / "policy.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(255 - b for b in data[-8:])
    weights.write_bytes(bytes(data))
    fresh = _objects(seed=3)
    before = [parameter.clone() for parameter in fresh[0].parameters()]
    with pytest.raises(ValueError, match=r"policy\.safetensors is corrupt \(its sha256 differs"):
        _load(path, *fresh)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh[0].parameters(), strict=True))


def test_corrupted_weights_give_a_clear_error_and_change_nothing(tmp_path):
    objects = _objects()
    path = _save(tmp_path, 1, *objects)
    weights = path / "modules" / "policy.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(b"\x00garbage" * (size // 8) + b"\x00" * (size % 8))  # same size: only the parser can tell
    fresh = _objects(seed=3)
    before = [parameter.clone() for parameter in fresh[0].parameters()]
    with pytest.raises(ValueError, match="corrupt"):
        _load(path, *fresh)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh[0].parameters(), strict=True))

    weights.write_bytes(b"short")
    with pytest.raises(ValueError, match="truncated"):
        _load(path, *fresh)


def test_corrupted_optimizer_file_gives_a_clear_error(tmp_path):
    path = _save(tmp_path, 1, *_objects())
    optimizer_file = path / "optimizers.pt"
    optimizer_file.write_bytes(bytes(optimizer_file.stat().st_size))
    with pytest.raises(ValueError, match=r"optimizers\.pt is corrupt"):
        _load(path, *_objects())


def test_fingerprint_mismatch_names_the_differing_key(tmp_path):
    path = _save(tmp_path, 1, *_objects())
    with pytest.raises(ValueError, match=r"model: checkpoint 'tiny-mlp', config 'other-model'") as error:
        _load(path, *_objects(), fingerprint={"model": "other-model", "env": "bandit"})
    assert "env" not in str(error.value).split("(")[1].split(")")[0]
    assert _load(path, *_objects(), fingerprint=None)["iteration"] == 1  # no fingerprint given: not checked
    marker = json.loads((path / ckpt.MARKER_FILENAME).read_text())
    assert marker["iteration"] == 1 and marker["fingerprint"] == FINGERPRINT and "vagen_version" in marker


def test_module_shape_mismatch_is_refused_before_anything_changes(tmp_path):
    path = _save(tmp_path, 1, *_objects())
    wider = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(wider.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    before = wider[0].weight.clone()
    with pytest.raises(ValueError, match=r"shape mismatches.*0\.weight: checkpoint \(8, 4\), model \(16, 4\)"):
        _load(path, wider, optimizer, scheduler)
    assert torch.equal(before, wider[0].weight)
    with pytest.raises(ValueError, match="holds modules"):
        load_checkpoint(path, modules={"critic": wider}, optimizers={}, schedulers={})


def test_unsafe_state_is_refused_at_save_time(tmp_path):
    with pytest.raises(ValueError, match=r"state\['cursor'\] is a ndarray"):
        _save(tmp_path, 1, *_objects(), state={"cursor": np.arange(3)})
    assert latest_checkpoint(tmp_path) is None


def test_interrupted_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    objects = _objects()
    previous = _save(tmp_path, 1, *objects)
    real_save = torch.save

    def interrupt_on_optimizer(obj, file, *args, **kwargs):
        if str(getattr(file, "name", file)).endswith("optimizers.pt"):
            raise KeyboardInterrupt  # fault injection: Ctrl-C while the optimizer file is being written
        return real_save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", interrupt_on_optimizer)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 2, *objects, keep_last=1)
    monkeypatch.undo()

    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == ["iter_000001"]
    assert latest_checkpoint(tmp_path) == previous
    assert _load(previous, *_objects(seed=4))["iteration"] == 1


def test_saving_the_same_iteration_again_replaces_it(tmp_path):
    model, optimizer, scheduler = _objects()
    _save(tmp_path, 1, model, optimizer, scheduler, state={"iteration": 1, "tag": "first"})
    path = _save(tmp_path, 1, model, optimizer, scheduler, state={"iteration": 1, "tag": "second"})
    assert _load(path, *_objects())["tag"] == "second"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["iter_000001"]


def test_tied_weights_model_round_trips(tmp_path):
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = save_checkpoint(
        tmp_path, 1, modules={"policy": model}, optimizers={"policy": optimizer}, schedulers={}, state={}
    )

    torch.manual_seed(1)
    fresh = Qwen2ForCausalLM(config)
    load_checkpoint(
        path, modules={"policy": fresh}, optimizers={"policy": torch.optim.AdamW(fresh.parameters())}, schedulers={}
    )

    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, fresh.state_dict()[key]), key
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()  # still tied


def test_disk_full_while_saving_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    objects = _objects()
    good = _save(tmp_path, 1, *objects)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "_write_contents", full_disk)  # fault injection: the disk fills mid-save
    with pytest.raises(ValueError, match=rf"No space left .*iter_000002 \(the last complete checkpoint {good} is"):
        _save(tmp_path, 2, *objects)
    assert latest_checkpoint(tmp_path) == good
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["iter_000001"]  # no half-written folder


# ---- one verification, mandatory hashes, renamed folders, damaged markers (issue 37, classes 5 and 8) ----------


def _edit_marker(path, edit):
    marker = json.loads((path / ckpt.MARKER_FILENAME).read_text())
    marker = edit(marker)
    (path / ckpt.MARKER_FILENAME).write_text(json.dumps(marker))


@pytest.mark.parametrize("field", ["file_sha256", "file_sizes", "iteration"])
def test_every_integrity_field_of_the_marker_is_mandatory(tmp_path, field):
    """Deleting the hashes (or sizes) from complete.json used to switch their check off."""
    path = _save(tmp_path, 1, *_objects())
    _edit_marker(path, lambda marker: {key: value for key, value in marker.items() if key != field})
    with pytest.raises(ValueError, match=rf"complete\.json .*{field}.*move .*iter_000001 out of the run folder"):
        _load(path, *_objects())


@pytest.mark.parametrize("extra", ["notes.txt", "modules/critic.safetensors", "rng.pt.orig"])
def test_a_file_the_marker_does_not_list_is_refused(tmp_path, extra):
    path = _save(tmp_path, 1, *_objects())
    (path / extra).write_bytes(b"not from this save")
    with pytest.raises(ValueError, match=rf"{extra} is not listed in its complete\.json"):
        _load(path, *_objects())


def test_a_renamed_checkpoint_folder_is_refused_and_nothing_is_deleted(tmp_path):
    """iter_000002 renamed to iter_000009 used to be taken as the latest: resume rewound to iteration 2 and the next
    save's keep-N rotation deleted the newer checkpoints."""
    objects = _objects()
    for iteration in (1, 2, 3):
        _save(tmp_path, iteration, *objects, keep_last=None)
    renamed = tmp_path / "checkpoints" / "iter_000009"
    (tmp_path / "checkpoints" / "iter_000002").rename(renamed)
    message = r"iter_000009 holds iteration 2 \(its complete\.json\) but is named iter_000009.*rename it back"
    with pytest.raises(ValueError, match=message):
        latest_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=message):
        _load(renamed, *_objects())
    with pytest.raises(ValueError, match=message):
        _save(tmp_path, 4, *objects, keep_last=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter_000001", "iter_000003", "iter_000009"]


def test_a_marker_edited_to_match_a_renamed_folder_is_refused_by_the_saved_state(tmp_path):
    path = _save(tmp_path, 2, *_objects())
    renamed = path.rename(path.with_name("iter_000009"))
    _edit_marker(renamed, lambda marker: {**marker, "iteration": 9})
    with pytest.raises(ValueError, match=r"its state\.pt is of iteration 2"):
        _load(renamed, *_objects())


@pytest.mark.parametrize(
    "marker",
    [
        "[]",
        '"complete"',
        "null",
        '{"iteration": "1"}',
        {"file_sizes": []},
        {"file_sha256": {"state.pt": 5}},
        {"file_sizes": {"state.pt": "12"}},
        {"fingerprint": ["tiny-mlp"]},
    ],
)
def test_a_marker_of_the_wrong_json_type_is_one_clear_error(tmp_path, marker):
    path = _save(tmp_path, 1, *_objects())
    if isinstance(marker, dict):
        _edit_marker(path, lambda saved: {**saved, **marker})
    else:
        (path / ckpt.MARKER_FILENAME).write_text(marker)
    with pytest.raises(ValueError, match=r"complete\.json"):
        latest_checkpoint(tmp_path)
        _load(path, *_objects())


def test_checkpoints_that_is_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "checkpoints").write_text("not a folder")
    with pytest.raises(ValueError, match=r"checkpoints is a file, not a folder.*move it"):
        latest_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"checkpoints is a file, not a folder"):
        _save(tmp_path, 1, *_objects())


def test_saving_behind_newer_checkpoints_is_refused_and_deletes_nothing(tmp_path):
    """A second run's first checkpoint in a folder of a longer run used to be deleted at once by the rotation."""
    objects = _objects()
    for iteration in range(1, 5):
        _save(tmp_path, iteration, *objects, keep_last=2)
    with pytest.raises(ValueError, match=r"iteration 1 .* newer checkpoint .*iter_000004.*trainer\.resume=auto"):
        _save(tmp_path, 1, *objects, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter_000003", "iter_000004"]


# ---- a full disk, as the writing libraries report it ---------------------------------------------------------


def _library_error(kind: str) -> BaseException:
    """The exception each writer raises when the disk fills (as seen on a full tmpfs)."""
    from safetensors import SafetensorError

    if kind == "safetensors":
        return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    error.__context__ = OSError(28, "No space left on device")  # torch.save into a python file object
    return error


@pytest.mark.parametrize("kind", ["safetensors", "torch.save"])
def test_a_full_disk_reported_by_the_writing_library_names_the_last_checkpoint(tmp_path, monkeypatch, kind):
    objects = _objects()
    good = _save(tmp_path, 1, *objects)

    def full_disk(*args, **kwargs):
        raise _library_error(kind)

    monkeypatch.setattr(ckpt, "save_model" if kind == "safetensors" else "_torch_save", full_disk)
    with pytest.raises(ValueError, match=rf"No space left .*iter_000002 \(the last complete checkpoint {good} is"):
        _save(tmp_path, 2, *objects)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["iter_000001"]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (root only; skipped where it cannot be mounted)."""
    import subprocess

    folder = tmp_path / "tmpfs"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", "--lazy", str(folder)], check=True)  # lazy: a failed torch.save may hold a handle


_FILES_IN_WRITE_ORDER = ["modules/policy.safetensors", "optimizers.pt", "schedulers.pt", "state.pt", "rng.pt"]


@pytest.mark.parametrize("fails_at", [*_FILES_IN_WRITE_ORDER, "complete.json"])
def test_a_real_full_disk_at_each_write_keeps_the_last_checkpoint(small_tmpfs, fails_at):
    """The disk fills while writing each file in turn (safetensors, torch.save, the marker): one clear error naming
    the intact checkpoint, and no half-written folder."""
    import errno

    objects = _objects()
    good = _save(small_tmpfs, 1, *objects)
    sizes = json.loads((good / ckpt.MARKER_FILENAME).read_text())["file_sizes"]
    order = [*_FILES_IN_WRITE_ORDER, ckpt.MARKER_FILENAME]
    free_pages = sum(-(-sizes[name] // 4096) for name in order[: order.index(fails_at)])  # room for the files before
    filler = small_tmpfs / "filler"
    with open(filler, "wb", buffering=0) as file:
        with pytest.raises(OSError) as error:
            while True:
                file.write(bytes(4096))
        assert error.value.errno == errno.ENOSPC
        file.truncate(filler.stat().st_size - free_pages * 4096)
    with pytest.raises(ValueError, match=rf"No space left .*iter_000002 \(the last complete checkpoint {good} is"):
        _save(small_tmpfs, 2, *objects)
    assert [p.name for p in (small_tmpfs / "checkpoints").iterdir()] == ["iter_000001"]
    filler.unlink()
    assert _load(latest_checkpoint(small_tmpfs), *_objects(seed=2))["iteration"] == 1
