"""Run plots (vagen/viz/plots.py, scripts/viz.py mode=plot) on a synthetic but realistic metrics log."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from matplotlib.image import imread
from test_trainer import repo_module

from vagen.logging import MetricsLogger
from vagen.viz.plots import (
    PLOT_ORDER,
    PLOTS,
    metric_series,
    moving_average,
    plot_diagnostics,
    plot_filtering,
    plot_regimes,
    plot_training,
    regime_thresholds,
    render_run,
    run_title,
    save_figure,
    spread_ratio_key,
)

REPO = Path(__file__).resolve().parents[1]
MI_EVERY = 5
LOG_B = math.log(32)
ECHO_STEP = 42
COLLAPSE_STEP = 51


def synthetic_records(iterations: int = 60, seed: int = 0) -> list[dict]:
    """A run whose success rises while MI falls into template collapse (entropy stays high) near
    iteration 40, with a grad-norm spike, one Echo Trap firing and one policy-collapse firing; MI rows only
    every MI_EVERY steps."""
    rng = np.random.default_rng(seed)
    records = []
    for step in range(iterations):
        progress = step / (iterations - 1)
        success = float(np.clip(0.08 + 0.5 / (1 + math.exp(-(step - 25) / 6)) + rng.normal(0, 0.05), 0, 1))
        record = {
            "step": step,
            "time": 1.7e9 + 30 * step,
            "env/success": success,
            "env/reward": -1.0 + 11 * success + rng.normal(0, 0.4),
            "env/format_ok": float(np.clip(0.72 + 0.25 * progress + rng.normal(0, 0.03), 0, 1)),
            "env/turns": 4.2 - 1.1 * progress + rng.normal(0, 0.15),
            "rollout/response_tokens": 128 - 55 * progress + rng.normal(0, 6),
            "filter/kept_ratio": float(np.clip(0.55 - 0.2 * progress + rng.normal(0, 0.06), 0.1, 1)),
            "filter/reward_std_ratio": 1.25 - 0.6 * progress + rng.normal(0, 0.08),
            "filter/zero_spread_count": float(rng.binomial(8, 0.15 + 0.45 * progress)),
            "policy/entropy": 1.15 - 0.12 * progress + rng.normal(0, 0.02),
            "policy/grad_norm": float(np.exp(rng.normal(-0.7, 0.25)) * (6.0 if step == ECHO_STEP - 1 else 1.0)),
            "policy/approx_kl": abs(rng.normal(0.01, 0.004)),
            "policy/clipfrac": abs(rng.normal(0.05, 0.01)),
            "loss/policy": rng.normal(0, 0.02),
            "echo/echo_trap": float(step == ECHO_STEP),
            "echo/policy_collapse": float(step == COLLAPSE_STEP),
        }
        if step == 17:
            record["policy/grad_norm"] = math.nan  # a non-finite row must be dropped, not crash the plot
        if step % MI_EVERY == 0 or step == iterations - 1:
            record.update(_mi_row(step, rng))
        if step % 10 == 0 or step == iterations - 1:  # held-out validation, as the trainer logs it
            held_out = float(np.clip(success + 0.05, 0, 1))
            record.update({"val/success": held_out, "val/success_ci_low": max(0.0, held_out - 0.06),
                           "val/success_ci_high": min(1.0, held_out + 0.06), "val/episodes": 256.0,
                           "val/greedy_success": float(np.clip(held_out + 0.03, 0, 1))})  # fmt: skip
        records.append(record)
    return records


def _mi_row(step: int, rng: np.random.Generator) -> dict:
    collapse = 1 / (1 + math.exp(-(step - 38) / 4))  # MI drops around iteration 40
    row = {"mi/mi_threshold": 0.1 * LOG_B, "mi/h_threshold": 0.55}
    for scope, scale in (("first_turn", 1.0), ("trajectory", 0.8)):
        mi = scale * (0.85 - 0.8 * collapse) + rng.normal(0, 0.03)
        row |= {
            f"mi/{scope}/mi_est": mi,
            f"mi/{scope}/h_cond_est": 1.1 - 0.1 * collapse * scale + 0.25 * (1 - scale) + rng.normal(0, 0.03),
            f"mi/{scope}/retrieval_acc": float(np.clip(0.7 * (1 - collapse) * scale + 0.04, 0, 1)),
            f"mi/{scope}/retrieval_chance": 1 / 32,
            f"mi/{scope}/mi_upper_bound": LOG_B,
            f"mi/{scope}/mi_zscore_ema": mi / 0.4,
        }
    row["mi/visual_retrieval_acc"] = float(np.clip(0.5 * (1 - collapse) + 0.05, 0, 1))
    row["mi/visual_mi_est"] = 0.3 * (1 - collapse) + 0.02
    row["mi/regime"] = 0.0 if row["mi/first_turn/mi_est"] >= row["mi/mi_threshold"] else 2.0
    return row


def _write_run(run_dir: Path, records: list[dict]) -> None:
    logger = MetricsLogger(run_dir, wandb_mode="disabled")
    for record in records:
        logger.log({k: v for k, v in record.items() if k not in ("step", "time")}, step=record["step"])
    logger.close()
    (run_dir / "config.yaml").write_text(
        "env:\n  name: sokoban_visual\nmodel:\n  name: tiny_vl\nalgorithm:\n  name: grpo\n"
        "filter:\n  strategy: top_p\n  value: 0.9\n"
    )


def _assert_png_not_blank(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 5_000, f"{path} missing or suspiciously small"
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels[..., :3].var() > 1e-3, f"{path} is a blank image"


def _titles(figure) -> list[str]:
    return [ax.get_title(loc="left") for ax in figure.axes if ax.get_visible() and ax.get_title(loc="left")]


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return synthetic_records()


def test_metric_series_keeps_only_finite_values_of_rows_that_have_the_key(records):
    steps = metric_series(records, "policy/grad_norm")[0]
    assert steps.size == len(records) - 1 and 17.0 not in steps  # the NaN row is dropped
    mi_steps, _ = metric_series(records, "mi/first_turn/mi_est")
    assert list(mi_steps) == [*range(0, 60, MI_EVERY), 59]
    assert metric_series(records, "not/logged")[0].size == 0


def test_moving_average_is_a_trailing_mean_with_a_short_start_window():
    smoothed = moving_average(np.array([1.0, 3.0, 5.0, 7.0]), window=2)
    np.testing.assert_allclose(smoothed, [1.0, 2.0, 4.0, 6.0])
    with pytest.raises(ValueError, match="window"):
        moving_average(np.ones(3), window=0)


def test_spread_ratio_key_follows_the_spread_statistic():
    assert spread_ratio_key([{"step": 0, "filter/reward_var_ratio": 0.4}]) == "filter/reward_var_ratio"
    assert spread_ratio_key([{"step": 0, "filter/reward_std_mean": 0.4}]) is None


def test_training_figure_has_one_titled_panel_per_metric_group(records):
    figure = plot_training(records, run_name="demo")
    assert _titles(figure) == ["Held-out success (fixed evaluation seeds)", "Task success", "Episode reward",
                               "Well-formed responses (<think>/<answer>)", "Response length"]  # fmt: skip
    assert "demo" in figure.get_suptitle()
    held_out_axes = figure.axes[0]
    assert next(line.get_label() for line in held_out_axes.get_lines()).startswith("held-out success (256 episodes")
    assert len(held_out_axes.collections) == 1  # the 95% interval band
    (greedy,) = [line for line in held_out_axes.get_lines() if line.get_label() == "held-out success, greedy"]
    logged = [(r["step"], r["val/greedy_success"]) for r in records if "val/greedy_success" in r]
    assert list(zip(greedy.get_xdata(), greedy.get_ydata(), strict=True)) == logged
    success_axes = figure.axes[1]
    assert success_axes.get_ylabel() == "episodes solved (%)"
    assert any("avg" in line.get_label() for line in success_axes.get_lines())  # the moving average is drawn


def test_filtering_figure_draws_the_spec_reference_levels_for_std(records):
    figure = plot_filtering(records)
    ratio_axes = figure.axes[0]
    levels = {round(line.get_ydata()[0], 3) for line in ratio_axes.get_lines() if len(set(line.get_ydata())) == 1}
    assert {1.2, 0.3} <= levels
    assert len(_titles(figure)) == 3


def test_filtering_with_variance_spread_names_it_and_omits_std_references(records):
    renamed = [{("filter/reward_var_ratio" if k == "filter/reward_std_ratio" else k): v for k, v in r.items()}
               for r in records]  # fmt: skip
    ratio_axes = plot_filtering(renamed).axes[0]
    assert ratio_axes.get_ylabel().startswith("Var(RV)")
    assert "RV = var" in ratio_axes.get_title(loc="left")
    assert all(len(set(line.get_ydata())) > 1 for line in ratio_axes.get_lines())  # no flat reference lines


def test_diagnostics_figure_marks_echo_trap_and_chance_and_log_scale(records):
    figure = plot_diagnostics(records)
    entropy, grad_norm, mi, retrieval = figure.axes[:4]
    assert grad_norm.get_yscale() == "log"
    for step, label in ((ECHO_STEP, "Echo Trap fired"), (COLLAPSE_STEP, "policy collapse fired")):
        lines = [line for line in entropy.get_lines() if list(line.get_xdata()) == [step, step]]
        assert len(lines) == 1 and lines[0].get_label() == label
    assert any(label.startswith("ceiling log B = 3.47") for label in mi.get_legend_handles_labels()[1])
    assert any(label == "chance 3.1%" for label in retrieval.get_legend_handles_labels()[1])


def test_regimes_figure_splits_the_plane_at_the_logged_thresholds(records):
    figure = plot_regimes(records)
    plane = figure.axes[0]
    assert plane.get_xlabel() == "H(Z|X) estimate (nats / token)"
    assert plane.get_ylabel() == "MI-Est I(X;Z) (nats / token)"
    texts = " ".join(text.get_text() for text in plane.texts)
    for name in ("diverse", "compressed", "template collapse", "low-entropy collapse"):
        assert name in texts
    assert len(plane.patches) == 4
    assert any(ax.get_ylabel() == "iteration" for ax in figure.axes)  # the colour bar
    assert "template collapse" in figure.get_suptitle()  # the last logged regime code, 2


def test_regime_thresholds_fall_back_to_documented_defaults_when_not_logged(records):
    bare = [{k: v for k, v in r.items() if k not in ("mi/mi_threshold", "mi/h_threshold")} for r in records]
    thresholds = regime_thresholds(bare, "first_turn")
    assert thresholds.mi == pytest.approx(0.1 * LOG_B)
    assert thresholds.h_cond == pytest.approx(0.5 * metric_series(bare, "mi/first_turn/h_cond_est")[1][0])
    assert "not logged" in thresholds.note


def test_missing_metrics_skip_panels_with_a_note_instead_of_crashing(records):
    without_mi = [
        {k: v for k, v in r.items() if not k.startswith(("mi/", "echo/", "env/reward", "val/"))} for r in records
    ]
    skipped: list[str] = []
    training = plot_training(without_mi, skipped=skipped)
    diagnostics = plot_diagnostics(without_mi, skipped=skipped)
    assert plot_regimes(without_mi, skipped=skipped) is None
    assert len(_titles(training)) == 3 and len(_titles(diagnostics)) == 2
    assert any("'reward' skipped" in note for note in skipped)
    assert any("'held-out success' skipped" in note for note in skipped)
    assert any("'MI estimate' skipped" in note for note in skipped)
    assert any(note.startswith("regimes: figure skipped") for note in skipped)
    only_step = [{"step": 0, "time": 0.0}]
    assert all(PLOTS.get(name)(only_step) is None for name in PLOT_ORDER)


def test_saved_pngs_exist_and_are_not_blank(records, tmp_path):
    paths, skipped = render_run(records, tmp_path / "plots")
    assert [path.name for path in paths] == [f"{name}.png" for name in PLOT_ORDER]
    assert not skipped
    for path in paths:
        _assert_png_not_blank(path)
    blank = save_figure(plot_training([{"step": 0, "env/success": 0.5}]), tmp_path / "single.png")
    _assert_png_not_blank(blank)  # a single point still renders (marker, axes, title)


def _viz(overrides: list[str]) -> list[str]:
    """scripts/viz.py's printed lines for `overrides` (scripts/ is not a package: loaded as a module)."""
    module = repo_module("scripts/viz.py")
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return module.run(compose(config_name="viz", overrides=overrides))


def test_script_end_to_end_on_a_run_folder(records, tmp_path):
    run_dir = tmp_path / "run"
    _write_run(run_dir, [{k: v for k, v in r.items() if not k.startswith("mi/")} for r in records])
    printed = _viz([f"run={run_dir}", f"out={tmp_path / 'out'}"])
    written = [Path(line.removeprefix("wrote ")) for line in printed if line.startswith("wrote ")]
    assert [path.name for path in written] == ["training.png", "filtering.png", "diagnostics.png"]
    assert all(path.parent == tmp_path / "out" for path in written)
    for path in written:
        _assert_png_not_blank(path)
    assert any(line.startswith("note: regimes: figure skipped") for line in printed)
    assert run_title(run_dir) == "sokoban_visual · tiny_vl · grpo · filter top_p 0.9"
    assert run_title(tmp_path) == tmp_path.name  # no config.yaml: the folder name


def test_script_default_out_dir_and_missing_metrics_message(records, tmp_path):
    run_dir = tmp_path / "run"
    _write_run(run_dir, records[:3])
    _viz([f"run={run_dir}"])
    assert (run_dir / "plots" / "training.png").is_file()
    with pytest.raises(ValueError, match=r"No metrics\.jsonl"):
        _viz([f"run={tmp_path / 'empty'}"])
    with pytest.raises(ValueError, match="mode=plot needs run="):
        _viz([])
