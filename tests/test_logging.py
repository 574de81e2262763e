"""Metric sinks (JSONL + real offline wandb) and the progress display in terminal and CI modes."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from vagen.logging import MetricsLogger, ProgressBar, read_metrics
from vagen.logging.progress import format_value


@pytest.fixture
def quiet_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))


def _reject_non_standard(constant: str):
    raise AssertionError(f"{constant} is not valid JSON")


def test_jsonl_records_numbers_tensors_and_non_finite_values(tmp_path):
    with MetricsLogger(tmp_path, wandb_mode="disabled") as logger:
        logger.log({"env/success": torch.tensor(0.5), "rollout/turns": np.int64(3), "loss/total": 1.25}, step=1)
        logger.log({"policy/approx_kl": float("nan"), "perf/grad_norm": torch.tensor(float("inf"))}, step=2)
        logger.log({"policy/entropy": -math.inf, "filter/empty": True}, step=3)

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    raw = [json.loads(line, parse_constant=_reject_non_standard) for line in lines]  # strictly valid JSON
    assert raw[1]["policy/approx_kl"] == "nan" and raw[1]["perf/grad_norm"] == "inf"
    records = read_metrics(tmp_path)
    assert [record["step"] for record in records] == [1, 2, 3]
    assert records[0]["env/success"] == 0.5 and records[0]["rollout/turns"] == 3 and records[0]["loss/total"] == 1.25
    assert math.isnan(records[1]["policy/approx_kl"]) and records[1]["perf/grad_norm"] == math.inf
    assert records[2]["policy/entropy"] == -math.inf and records[2]["filter/empty"] is True
    assert all(isinstance(record["time"], float) for record in records)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["metrics.jsonl"]  # disabled: nothing else


def test_each_line_is_on_disk_before_close(tmp_path):
    logger = MetricsLogger(tmp_path, wandb_mode="disabled")
    logger.log({"env/reward": 2.0}, step=7)
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["env/reward"] == 2.0  # a crash now loses nothing
    logger.close()
    logger.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        logger.log({"env/reward": 1.0}, step=8)


def test_bad_metric_values_and_names_are_refused(tmp_path):
    with MetricsLogger(tmp_path, wandb_mode="disabled") as logger:
        with pytest.raises(ValueError, match=r"'loss/total' is a tensor of shape \(2,\).*\.mean\(\)"):
            logger.log({"loss/total": torch.ones(2)}, step=1)
        with pytest.raises(TypeError, match="'env/name' has type str"):
            logger.log({"env/name": "sokoban"}, step=1)
        with pytest.raises(ValueError, match="'step' is not allowed"):
            logger.log({"step": 3}, step=1)
    assert read_metrics(tmp_path) == []
    with pytest.raises(ValueError, match=r"choose one of \['offline', 'online', 'disabled'\]"):
        MetricsLogger(tmp_path, wandb_mode="cloud")


def test_resume_truncates_steps_logged_after_the_checkpoint(tmp_path):
    with MetricsLogger(tmp_path, wandb_mode="disabled") as logger:
        for step in range(1, 6):
            logger.log({"env/reward": float(step)}, step=step)
    with open(tmp_path / "metrics.jsonl", "a") as file:
        file.write('{"step": 6, "env/rew')  # torn line: the process died mid-write

    with MetricsLogger(tmp_path, wandb_mode="disabled", resume=True) as logger:
        assert logger.truncate_after(3) == 3  # steps 4, 5 and the torn line
        logger.log({"env/reward": 40.0}, step=4)

    records = read_metrics(tmp_path)
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    assert records[-1]["env/reward"] == 40.0


def test_new_run_in_an_old_folder_moves_old_metrics_aside(tmp_path):
    with MetricsLogger(tmp_path, wandb_mode="disabled") as logger:
        logger.log({"env/reward": 1.0}, step=1)
    with pytest.warns(UserWarning, match="resume=False"), MetricsLogger(tmp_path, wandb_mode="disabled") as logger:
        logger.log({"env/reward": 9.0}, step=1)
    assert [record["env/reward"] for record in read_metrics(tmp_path)] == [9.0]
    backups = list(tmp_path.glob("metrics.jsonl.*.bak"))
    assert len(backups) == 1 and read_metrics(backups[0])[0]["env/reward"] == 1.0
    for reward in (2.0, 3.0):  # more new runs within the same second: every old record is kept
        with pytest.warns(UserWarning, match="resume=False"), MetricsLogger(tmp_path, wandb_mode="disabled") as log:
            log.log({"env/reward": reward}, step=1)
    kept = sorted(read_metrics(path)[0]["env/reward"] for path in tmp_path.glob("metrics.jsonl.*.bak"))
    assert kept == [1.0, 2.0, 9.0]


def test_read_metrics_skips_a_torn_last_line_but_not_a_damaged_middle(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    with pytest.warns(UserWarning, match="torn last line"):
        assert read_metrics(path) == [{"step": 1, "x": 1.0}]
    path.write_text('{"step": 1\n{"step": 2, "x": 1.0}\n')
    with pytest.raises(ValueError, match="line 1 is not valid JSON"):
        read_metrics(path)


def test_wandb_offline_run_holds_the_logged_history(tmp_path, quiet_wandb):
    run_dir = tmp_path / "run"
    with MetricsLogger(run_dir, wandb_mode="offline", run_name="unit", config={"lr": 1e-3}) as logger:
        for step in range(3):
            logger.log({"env/success": 0.25 * step, "loss/total": torch.tensor(1.5)}, step=step)

    import wandb

    wandb.teardown()  # finish() returns before wandb's writer process has flushed; teardown waits for it
    run_folders = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(run_folders) == 1
    history = list(run_folders[0].glob("run-*.wandb"))
    assert len(history) == 1 and history[0].stat().st_size > 0
    content = history[0].read_bytes()
    assert b"env/success" in content and b"loss/total" in content and b"iteration" in content
    run_id = (run_dir / "wandb_run_id.txt").read_text()
    assert run_folders[0].name.endswith(run_id)
    assert len(read_metrics(run_dir)) == 3  # JSONL is written alongside

    with MetricsLogger(run_dir, wandb_mode="offline", resume=True) as logger:
        logger.truncate_after(1)
        logger.log({"env/success": 0.9}, step=2)
    assert (run_dir / "wandb_run_id.txt").read_text() == run_id  # resumed into the same wandb run
    assert len(list((run_dir / "wandb").glob(f"offline-run-*{run_id}*"))) == 2


def test_online_without_credentials_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc from `wandb login`
    monkeypatch.delenv("NETRC", raising=False)
    with pytest.raises(ValueError, match=r"WANDB_API_KEY.*logger\.wandb_mode=offline"):
        MetricsLogger(tmp_path / "run", wandb_mode="online")
    assert not (tmp_path / "run").exists()


def test_progress_lines_when_not_a_terminal():
    output = io.StringIO()  # not a TTY, like a CI log
    with ProgressBar(10, initial=5, file=output) as progress:
        progress.update({"env/success": torch.tensor(0.3125), "env/reward": 2.1, "filter/kept_ratio": 0.62})
        progress.update({"env/reward": 1.0, "loss/total": 3.0})
        progress.update()
    lines = output.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("iter 6/10 | ") and "ETA " in lines[0] and "s/it" in lines[0]
    assert lines[0].endswith("succ 0.31 rew 2.10 kept 0.62")
    assert lines[1].startswith("iter 7/10") and "ETA " in lines[1]
    assert lines[1].endswith("rew 1.00") and "succ" not in lines[1] and "loss" not in lines[1]
    assert lines[2].startswith("iter 8/10")


def test_progress_bar_on_a_terminal_and_disabled():
    output = io.StringIO()
    progress = ProgressBar(4, keys={"env/success": "S", "loss/total": "L"}, file=output, tty=True)
    progress.update({"env/success": 0.5, "loss/total": 0.00012})
    progress.update({"env/success": 0.75, "loss/total": 0.00012})
    progress.close()
    shown = output.getvalue()
    assert "2/4" in shown and "S 0.75 L 1.20e-04" in shown and "\r" in shown  # tqdm redraws in place

    silent = io.StringIO()
    with ProgressBar(4, disable=True, file=silent, tty=True) as progress:
        progress.update({"env/success": 1.0})
        progress.write("hello")
    assert silent.getvalue() == "" and progress.done == 1


def test_format_value_keeps_small_and_large_numbers_readable():
    assert format_value(0.3125) == "0.31"
    assert format_value(0.0) == "0.00"
    assert format_value(3.2e-4) == "3.20e-04"
    assert format_value(123456.0) == "1.23e+05"
    assert format_value(float("nan")) == "nan"
