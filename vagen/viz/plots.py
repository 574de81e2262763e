"""Plots of a training run from its `metrics.jsonl` records (`scripts/viz.py mode=plot`).

Four figures, each a function `records -> Figure | None` registered in `PLOTS`:

    training     held-out success (val/), success, reward, format-valid rate, response length over iterations
    filtering    Std(RV)/Mean(RV) with the docs/spec.md §3 reference levels, kept ratio, zero-spread groups
    diagnostics  entropy, grad norm, MI estimate under its log B ceiling, retrieval accuracy vs chance;
                 Echo Trap firings as vertical lines
    regimes      the path of the run in the MI × H(Z|X) plane split into the four regimes (docs/spec.md §4)

Records are the dicts of `vagen.logging.read_metrics`: `{"step": int, "<namespace>/<name>": float}`.
A metric may be absent from some rows (MI is logged every few steps) or from the whole run; a panel
whose metrics are absent is left out and a note is appended to `skipped`; a figure with no panel at
all is None. NaN/inf values are dropped point by point.

Figures are built with `matplotlib.figure.Figure` and the Agg canvas, never `pyplot`, so nothing
touches global state or needs a display, and figures are garbage-collected like any object.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter, PercentFormatter
from omegaconf import OmegaConf

from vagen.registry import Registry

Records = Sequence[dict[str, Any]]
PlotFunction = Callable[..., Figure | None]

PLOTS: Registry[PlotFunction] = Registry("plot")
PLOT_ORDER = ("training", "filtering", "diagnostics", "regimes")
DPI = 120
MI_SCOPES = ("first_turn", "trajectory")
REGIME_CODES = {0: "diverse", 1: "compressed", 2: "template_collapse", 3: "low_entropy_collapse"}
REGIME_COLOURS = {
    "diverse": "#cfe8cf",
    "compressed": "#cfe0f3",
    "template_collapse": "#f8d9c4",
    "low_entropy_collapse": "#e2d9ee",
}
# docs/spec.md §3: Std(RV)/Mean(RV) ≈ 1.2–1.3 on Sokoban (bimodal spreads: filtering pays), ≈ 0.3 on FrozenLake
# GRPO (spreads alike: filtering is close to dropping groups at random). Only meaningful for stat=std.
_REFERENCE_TEXT = {"xytext": (0, 3), "textcoords": "offset points", "ha": "right", "va": "bottom", "fontsize": 8}
RV_RATIO_REFERENCES = (  # (level, colour, annotation)
    (1.2, "tab:green", "≈1.2: spreads bimodal, filtering pays (Sokoban)"),
    (0.3, "tab:gray", "≈0.3: spreads alike, filtering ≈ random dropping (FrozenLake)"),
)
_SPREAD_RATIO_KEY = re.compile(r"^filter/reward_(\w+)_ratio$")
_SCOPE_COLOURS = {"first_turn": "tab:blue", "trajectory": "tab:orange", "visual": "tab:green"}


# ---------------------------------------------------------------- reading the records


def metric_series(records: Records, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows that hold a finite `key`, in row order; both float64 [n], n may be 0."""
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            steps.append(float(record["step"]))
            values.append(float(value))
    return np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)


def has_metric(records: Records, key: str) -> bool:
    return metric_series(records, key)[0].size > 0


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` points (fewer at the start), same length as `values` [n]."""
    if window < 1:
        raise ValueError(f"moving-average window must be >= 1, got {window}.")
    cumulative = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(ends - window, 0)
    return (cumulative[ends] - cumulative[starts]) / (ends - starts)


def spread_ratio_key(records: Records) -> str | None:
    """The logged `filter/reward_<stat>_ratio` key (the spread statistic is part of the name), or None."""
    for record in records:
        for key in record:
            if _SPREAD_RATIO_KEY.match(key):
                return key
    return None


def fired_steps(records: Records, key: str) -> np.ndarray:
    """Steps at which a monitor flag fired (`key` >= 0.5: `echo/echo_trap`, `echo/policy_collapse`), float64 [k]."""
    steps, fired = metric_series(records, key)
    return steps[fired >= 0.5]


def last_value(records: Records, key: str) -> float | None:
    values = metric_series(records, key)[1]
    return float(values[-1]) if values.size else None


# ---------------------------------------------------------------- drawing helpers


def _smoothing_window(num_points: int) -> int:
    # ~1/12 of the run: smooths iteration noise without hiding a trend that lasts a tenth of the run
    return max(3, round(num_points / 12))


def _curve(
    ax: Axes, records: Records, key: str, label: str, colour: str, smooth: bool = True, linestyle: str = "-"
) -> bool:
    """Raw points as a faint line plus a bold moving average; False (nothing drawn) when `key` is absent."""
    steps, values = metric_series(records, key)
    if steps.size == 0:
        return False
    if smooth and steps.size >= 4:
        window = _smoothing_window(steps.size)
        ax.plot(steps, values, color=colour, alpha=0.3, linewidth=1.0)
        ax.plot(steps, moving_average(values, window), color=colour, linewidth=2.0, label=f"{label} (avg {window})")
    else:
        ax.plot(steps, values, color=colour, linewidth=1.8, marker="o", markersize=3.5, label=label, ls=linestyle)
    return True


def _style(ax: Axes, title: str, ylabel: str, percent: bool = False, legend_columns: int = 1) -> None:
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3, linewidth=0.6)
    if percent:
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8, framealpha=0.85, ncols=legend_columns)


def _leave_headroom(ax: Axes, bottom: float, fraction: float = 0.45) -> None:
    """Raise the top of the y axis by `fraction` of the data range: a free band for a many-entry legend."""
    top = ax.get_ylim()[1]
    ax.set_ylim(bottom, top + fraction * (top - bottom))


def _mark_firings(axes: Sequence[Axes], steps: np.ndarray, name: str, color: str) -> None:
    """Dotted vertical lines at the firing steps; named in the first panel's legend only, to keep the others light."""
    for ax_index, ax in enumerate(axes):
        for index, step in enumerate(steps):
            label = f"{name} fired" if index == 0 and ax_index == 0 else None
            ax.axvline(step, color=color, linewidth=1.2, linestyle=":", alpha=0.8, label=label)


@dataclass(frozen=True)
class Panel:
    """One subplot: `draw` fills the axes when any of `keys` is present in the records."""

    name: str
    keys: tuple[str, ...]
    draw: Callable[[Axes, Records], None]


def new_figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)  # Agg canvas: renders off-screen, no display or pyplot state needed
    return figure


def _grid_figure(
    panels: Sequence[Panel], records: Records, title: str, figure_name: str, skipped: list[str] | None
) -> tuple[Figure | None, list[Axes]]:
    """Lay out the panels whose metrics are present (1–3 stacked, 4+ in two columns), sharing the x axis."""
    present = [panel for panel in panels if any(has_metric(records, key) for key in panel.keys)]
    for panel in panels:
        if panel not in present and skipped is not None:
            skipped.append(f"{figure_name}: panel '{panel.name}' skipped (no {' / '.join(panel.keys)} in the log)")
    if not present:
        return None, []
    columns = 1 if len(present) <= 3 else 2
    rows = math.ceil(len(present) / columns)
    figure = new_figure(10, 6 if rows <= 2 else 7.5)
    grid = figure.subplots(rows, columns, sharex=True, squeeze=False)
    axes = list(grid.flat)
    for ax, panel in zip(axes, present, strict=False):
        panel.draw(ax, records)
    for ax in axes[len(present) :]:
        ax.set_visible(False)
    for ax in grid[-1]:
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if columns == 2 and len(present) % 2:
        axes[len(present) - columns].tick_params(labelbottom=True)  # above the hidden cell: needs its own ticks
        axes[len(present) - columns].set_xlabel("iteration")
    figure.suptitle(title, fontsize=13, fontweight="bold")
    return figure, axes[: len(present)]


# ---------------------------------------------------------------- training.png


def _draw_success(ax: Axes, records: Records) -> None:
    _curve(ax, records, "env/success", "success rate", "tab:green")
    ax.set_ylim(-0.03, 1.03)
    _style(ax, "Task success", "episodes solved (%)", percent=True)


def draw_held_out(ax: Axes, records: Records, label: str = "held-out", colour: str = "tab:red") -> Any:
    """`val/success` with its 95% interval as a band; returns the line, or None when no validation was logged."""
    steps, values = metric_series(records, "val/success")
    if steps.size == 0:
        return None
    low, high = metric_series(records, "val/success_ci_low")[1], metric_series(records, "val/success_ci_high")[1]
    if low.size == values.size == high.size:
        ax.fill_between(steps, low, high, color=colour, alpha=0.15, linewidth=0)
    (line,) = ax.plot(steps, values, color=colour, linewidth=2.0, marker="o", markersize=4, label=label)
    return line


def _draw_held_out(ax: Axes, records: Records) -> None:
    episodes = last_value(records, "val/episodes")
    draw_held_out(ax, records, label=f"held-out success ({episodes:.0f} episodes, 95% CI)")
    _curve(ax, records, "val/greedy_success", "held-out success, greedy", "tab:red", False, "--")
    _curve(ax, records, "val/move_optimal_mass", "held-out mass on optimal first moves (probe)", "tab:orange", False)
    _curve(ax, records, "env/success", "training rollouts", "tab:green")
    ax.set_ylim(-0.03, 1.03)
    _style(ax, "Held-out success (fixed evaluation seeds)", "episodes solved (%)", percent=True)


def _draw_reward(ax: Axes, records: Records) -> None:
    _curve(ax, records, "env/reward", "episode return", "tab:blue")
    _style(ax, "Episode reward", "return per episode")


def _draw_format(ax: Axes, records: Records) -> None:
    _curve(ax, records, "env/format_ok", "format-valid", "tab:purple")
    ax.set_ylim(-0.03, 1.03)
    _style(ax, "Well-formed responses (<think>/<answer>)", "responses parsed (%)", percent=True)


def _draw_length(ax: Axes, records: Records) -> None:
    """Tokens per response on the left axis, turns per episode on a right axis (either may be absent)."""
    has_tokens = _curve(ax, records, "rollout/response_tokens", "response length", "tab:brown")
    turns_ax = ax.twinx() if has_tokens and has_metric(records, "env/turns") else ax
    _curve(turns_ax, records, "env/turns", "turns per episode" + (" (right)" if turns_ax is not ax else ""), "tab:gray")
    _style(ax, "Response length", "tokens per response" if has_tokens else "turns per episode")
    if turns_ax is not ax:
        turns_ax.set_ylabel("turns per episode")
        turns_ax.legend(loc="upper right", fontsize=8, framealpha=0.85)
        ax.legend(loc="upper left", fontsize=8, framealpha=0.85)


TRAINING_PANELS = (
    Panel("held-out success", ("val/success",), _draw_held_out),
    Panel("success", ("env/success",), _draw_success),
    Panel("reward", ("env/reward",), _draw_reward),
    Panel("format-ok", ("env/format_ok",), _draw_format),
    Panel("response length", ("rollout/response_tokens", "env/turns"), _draw_length),
)


@PLOTS.register("training")
def plot_training(records: Records, run_name: str = "", skipped: list[str] | None = None) -> Figure | None:
    """Success, reward, format-valid rate and response length per iteration (faint raw, bold moving average)."""
    figure, _ = _grid_figure(TRAINING_PANELS, records, _title("Training progress", run_name), "training", skipped)
    return figure


def _title(what: str, run_name: str) -> str:
    return f"{what} — {run_name}" if run_name else what


# ---------------------------------------------------------------- filtering.png


def _draw_spread_ratio(ax: Axes, records: Records) -> None:
    key = spread_ratio_key(records)
    assert key is not None  # the panel is only drawn when the key is present
    stat = _SPREAD_RATIO_KEY.match(key).group(1)
    ratio_name = f"{stat.capitalize()}(RV) / Mean(RV)"
    _curve(ax, records, key, ratio_name, "tab:blue")
    if stat == "std":
        for level, colour, text in RV_RATIO_REFERENCES:
            ax.axhline(level, color=colour, linestyle="--", linewidth=1.2)
            ax.annotate(text, (0.995, level), xycoords=ax.get_yaxis_transform(), color=colour, **_REFERENCE_TEXT)
        ax.set_ylim(bottom=0.0, top=max(1.5, ax.get_ylim()[1]))
        note = ""
    else:
        note = f" (RV = {stat}; the reference levels 1.2 / 0.3 of docs/spec.md §3 hold for RV = std)"
    _style(ax, f"Reward-spread dispersion across groups{note}", f"{ratio_name} (ratio)")


def _draw_kept(ax: Axes, records: Records) -> None:
    _curve(ax, records, "filter/kept_ratio", "groups kept", "tab:green")
    _curve(ax, records, "filter/kept_spread_fraction", "spread mass kept", "tab:olive")
    ax.set_ylim(-0.03, 1.03)
    _style(ax, "Groups kept by the filter", "fraction of groups (%)", percent=True)


def _draw_zero_spread(ax: Axes, records: Records) -> None:
    _curve(ax, records, "filter/zero_spread_count", "zero-spread groups", "tab:red")
    steps, skipped_update = metric_series(records, "filter/skipped_update")
    for index, step in enumerate(steps[skipped_update >= 0.5]):
        ax.axvline(
            step, color="black", alpha=0.5, linewidth=1.0, label="update skipped (all dropped)" if not index else None
        )
    ax.set_ylim(bottom=0)
    _style(ax, "Groups with identical rewards (no task gradient)", "groups per batch")


@PLOTS.register("filtering")
def plot_filtering(records: Records, run_name: str = "", skipped: list[str] | None = None) -> Figure | None:
    """Std(RV)/Mean(RV) against the docs/spec.md §3 reference levels, kept ratio, zero-spread groups per iteration."""
    ratio_key = spread_ratio_key(records) or "filter/reward_<stat>_ratio"
    panels = (
        Panel("reward-spread ratio", (ratio_key,), _draw_spread_ratio),
        Panel("kept ratio", ("filter/kept_ratio", "filter/kept_spread_fraction"), _draw_kept),
        Panel("zero-spread groups", ("filter/zero_spread_count",), _draw_zero_spread),
    )
    figure, _ = _grid_figure(panels, records, _title("SNR-aware filtering", run_name), "filtering", skipped)
    return figure


# ---------------------------------------------------------------- diagnostics.png


def _draw_entropy(ax: Axes, records: Records) -> None:
    _curve(ax, records, "policy/entropy", "policy entropy", "tab:purple")
    # from zero: an entropy that "stays high" while MI falls must look high
    ax.set_ylim(0.0, 1.1 * max(metric_series(records, "policy/entropy")[1].max(), 1e-6))
    _style(ax, "Policy entropy (within-input diversity only)", "nats / token")


def _draw_grad_norm(ax: Axes, records: Records) -> None:
    _curve(ax, records, "policy/grad_norm", "grad norm (before clipping)", "tab:red")
    values = metric_series(records, "policy/grad_norm")[1]
    if (values > 0).all():
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    _style(ax, "Policy gradient norm", "L2 norm (log scale)")


def _mi_sources(suffix: str) -> list[tuple[str, str, str]]:
    """(key, label, colour) of each MI scope for a metric suffix such as "mi_est"; the image probe first, so that the
    first-turn scope it often equals is drawn over it."""
    sources = [(f"mi/{scope}/{suffix}", scope.replace("_", " "), _SCOPE_COLOURS[scope]) for scope in MI_SCOPES]
    visual = {"mi_est": "mi/visual_mi_est", "retrieval_acc": "mi/visual_retrieval_acc"}.get(suffix)
    if visual:
        sources.insert(0, (visual, "image probe", _SCOPE_COLOURS["visual"]))
    return sources


def _probe_style(key: str) -> str:
    """The image probe dashed and under the scopes: where it equals the first-turn curve, both stay visible."""
    return "--" if key.startswith("mi/visual_") else "-"


def _draw_mi(ax: Axes, records: Records) -> None:
    for key, label, colour in _mi_sources("mi_est"):
        _curve(ax, records, key, f"MI-Est {label}", colour, smooth=False, linestyle=_probe_style(key))
    threshold = last_value(records, "mi/mi_threshold")
    if threshold is not None:
        ax.axhline(threshold, color="black", linestyle="--", linewidth=1.0, label=f"collapse threshold {threshold:.2g}")
    ceiling = last_value(records, "mi/first_turn/mi_upper_bound") or last_value(records, "mi/trajectory/mi_upper_bound")
    if ceiling is not None:
        # Per-token MI-Est sits far below log B: drawing the ceiling there would flatten the curve, so
        # a far ceiling is only named in the legend (an empty line handle), a near one is drawn.
        near = ceiling <= 3 * ax.get_ylim()[1]
        ax.plot(
            [],
            [],
            color="tab:gray",
            linestyle="-.",
            label=f"ceiling log B = {ceiling:.2f}" + ("" if near else " (off scale)"),
        )
        if near:
            ax.axhline(ceiling, color="tab:gray", linestyle="-.", linewidth=1.0)
    _leave_headroom(ax, bottom=min(0.0, ax.get_ylim()[0]))
    _style(ax, "Input dependence I(X;Z): MI-Est", "nats / token", legend_columns=2)


def _draw_retrieval(ax: Axes, records: Records) -> None:
    chances: list[float] = []
    for key, label, colour in _mi_sources("retrieval_acc"):
        if _curve(ax, records, key, f"retrieval acc {label}", colour, smooth=False, linestyle=_probe_style(key)):
            chance_key = key.replace("retrieval_acc", "retrieval_chance")
            chance = last_value(records, chance_key) if chance_key != key else None
            if chance is not None and chance not in chances:  # scopes usually share B: one line, one label
                chances.append(chance)
                ax.axhline(chance, color="dimgray", linestyle="--", linewidth=1.0, label=f"chance {chance:.1%}")
    ax.set_ylim(top=max(0.3, ax.get_ylim()[1]))
    _leave_headroom(ax, bottom=0.0)
    ax.set_ylim(top=min(ax.get_ylim()[1], 1.02))  # an accuracy: the axis never runs past 100%
    _style(
        ax, "Retrieval accuracy (own prompt scores highest)", "reasoning samples (%)", percent=True, legend_columns=2
    )


DIAGNOSTIC_PANELS = (
    Panel("entropy", ("policy/entropy",), _draw_entropy),
    Panel("grad norm", ("policy/grad_norm",), _draw_grad_norm),
    Panel("MI estimate", tuple(key for key, _, _ in _mi_sources("mi_est")), _draw_mi),
    Panel("retrieval accuracy", tuple(key for key, _, _ in _mi_sources("retrieval_acc")), _draw_retrieval),
)


@PLOTS.register("diagnostics")
def plot_diagnostics(records: Records, run_name: str = "", skipped: list[str] | None = None) -> Figure | None:
    """Entropy, grad norm, MI-Est under log B, retrieval accuracy vs chance; Echo Trap and policy-collapse
    firings as dotted lines."""
    title = _title("Collapse diagnostics", run_name)
    figure, axes = _grid_figure(DIAGNOSTIC_PANELS, records, title, "diagnostics", skipped)
    if figure is None:
        return None
    marked = False
    signatures = (("echo/echo_trap", "Echo Trap", "crimson"), ("echo/policy_collapse", "policy collapse", "darkorange"))
    for key, name, color in signatures:
        steps = fired_steps(records, key)
        _mark_firings(axes, steps, name, color)
        marked |= bool(steps.size)
    if marked:
        axes[0].legend(loc="best", fontsize=8, framealpha=0.85)
    elif skipped is not None and not has_metric(records, "echo/echo_trap"):
        skipped.append("diagnostics: Echo Trap markers skipped (no echo/echo_trap in the log)")
    return figure


# ---------------------------------------------------------------- regimes.png


@dataclass(frozen=True)
class Thresholds:
    """Where the regime plane is split, and whether the values were logged or guessed here."""

    mi: float
    h_cond: float
    note: str


def regime_thresholds(records: Records, scope: str) -> Thresholds:
    """The last logged `mi/mi_threshold` and `mi/h_threshold`; when absent, the defaults of
    `vagen.diagnostics.regimes` (0.1 · log B, and half of the first H(Z|X) estimate)."""
    mi_threshold, h_threshold = last_value(records, "mi/mi_threshold"), last_value(records, "mi/h_threshold")
    guessed = []
    if mi_threshold is None:
        ceiling = last_value(records, f"mi/{scope}/mi_upper_bound")
        mi_threshold = 0.1 * ceiling if ceiling is not None else 0.0
        guessed.append("MI = 0.1·log B" if ceiling is not None else "MI = 0")
    if h_threshold is None:
        h_threshold = 0.5 * float(metric_series(records, f"mi/{scope}/h_cond_est")[1][0])
        guessed.append("H = ½·first H(Z|X)")
    note = f"not logged, defaults: {', '.join(guessed)}" if guessed else ""
    return Thresholds(mi_threshold, h_threshold, note)


def _padded_range(values: np.ndarray, threshold: float, include_zero: bool, margin: float) -> tuple[float, float]:
    """Axis limits covering the values and the threshold (so all four quadrants show), with relative margins."""
    points = np.concatenate([values, [threshold], [0.0] if include_zero else []])
    low, high = float(points.min()), float(points.max())
    pad = margin * max(high - low, 1e-3)
    return low - pad, high + pad


REGIME_LABELS = {  # name, axes-fraction corner of the label (each quadrant touches one corner of the axes)
    "diverse": ("diverse\nhigh MI, high H(Z|X)", (0.985, 0.975)),
    "compressed": ("compressed\nhigh MI, low H(Z|X)", (0.015, 0.975)),
    "template_collapse": ("template collapse\nlow MI, high H(Z|X)", (0.985, 0.025)),
    "low_entropy_collapse": ("low-entropy collapse\nlow MI, low H(Z|X)", (0.015, 0.025)),
}
_START_MARKER = {"s": 190, "facecolors": "none", "edgecolors": "black", "linewidths": 1.8, "zorder": 4}
_END_MARKER = {"s": 300, "marker": "*", "color": "crimson", "edgecolors": "black", "linewidths": 0.6, "zorder": 4}
_REGIME_TEXT = {
    "fontsize": 9,
    "weight": "bold",
    "color": "#333",
    "bbox": {"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.6, "edgecolor": "none"},
}
_ITERATION_TEXT = {"textcoords": "offset points", "fontsize": 8, "weight": "bold"}
_PATH_POINTS = {"cmap": "viridis", "s": 40, "edgecolors": "black", "linewidths": 0.4, "zorder": 3}


def _draw_quadrants(ax: Axes, thresholds: Thresholds, x_range: tuple[float, float], y_range: tuple[float, float]):
    """Four light rectangles split at the thresholds, each named in its outer corner."""
    (x_low, x_high), (y_low, y_high) = x_range, y_range
    boxes = {  # regime: (x from, x to, y from, y to)
        "diverse": (thresholds.h_cond, x_high, thresholds.mi, y_high),
        "compressed": (x_low, thresholds.h_cond, thresholds.mi, y_high),
        "template_collapse": (thresholds.h_cond, x_high, y_low, thresholds.mi),
        "low_entropy_collapse": (x_low, thresholds.h_cond, y_low, thresholds.mi),
    }
    for regime, (x0, x1, y0, y1) in boxes.items():
        ax.add_patch(
            Rectangle((x0, y0), x1 - x0, y1 - y0, facecolor=REGIME_COLOURS[regime], edgecolor="none", zorder=0)
        )
        label, (corner_x, corner_y) = REGIME_LABELS[regime]
        alignment = {"ha": "right" if corner_x > 0.5 else "left", "va": "top" if corner_y > 0.5 else "bottom"}
        ax.text(corner_x, corner_y, label, transform=ax.transAxes, **_REGIME_TEXT, **alignment)
    ax.axvline(thresholds.h_cond, color="black", linestyle="--", linewidth=1.0, label="H(Z|X) threshold")
    ax.axhline(thresholds.mi, color="black", linestyle=":", linewidth=1.3, label="MI threshold")
    ax.set_xlim(x_range)
    ax.set_ylim(y_range)


def _draw_regime_path(ax: Axes, records: Records, scope: str, colour_range: tuple[float, float]) -> Any:
    """The run's (H(Z|X), MI) path coloured by iteration; returns the scatter for the colour bar."""
    steps, mi = metric_series(records, f"mi/{scope}/mi_est")
    h_steps, h_cond = metric_series(records, f"mi/{scope}/h_cond_est")
    common, mi_index, h_index = np.intersect1d(steps, h_steps, return_indices=True)
    mi, h_cond = mi[mi_index], h_cond[h_index]
    thresholds = regime_thresholds(records, scope)
    x_range = _padded_range(h_cond, thresholds.h_cond, include_zero=False, margin=0.1)
    # wide y margins: the regime names sit in the top and bottom bands, clear of the path
    y_range = _padded_range(mi, thresholds.mi, include_zero=True, margin=0.22)
    _draw_quadrants(ax, thresholds, x_range, y_range)
    ax.plot(h_cond, mi, color="#555555", linewidth=1.0, alpha=0.8, zorder=2)
    points = ax.scatter(h_cond, mi, c=common, vmin=colour_range[0], vmax=colour_range[1], **_PATH_POINTS)
    ax.scatter(h_cond[:1], mi[:1], label="start", **_START_MARKER)
    ax.scatter(h_cond[-1:], mi[-1:], label="end", **_END_MARKER)
    for index, offset in ((0, (10, 8)), (-1, (10, -14)))[: min(2, common.size)]:
        ax.annotate(f"it {common[index]:.0f}", (h_cond[index], mi[index]), xytext=offset, **_ITERATION_TEXT)
    ax.set_xlabel("H(Z|X) estimate (nats / token)")
    ax.set_ylabel("MI-Est I(X;Z) (nats / token)")
    threshold_text = f"thresholds: MI {thresholds.mi:.3g}, H(Z|X) {thresholds.h_cond:.3g}"
    threshold_text += f" ({thresholds.note})" if thresholds.note else ""
    ax.set_title(f"{scope.replace('_', ' ')} reasoning — {threshold_text}", fontsize=10, loc="left")
    return points


@PLOTS.register("regimes")
def plot_regimes(records: Records, run_name: str = "", skipped: list[str] | None = None) -> Figure | None:
    """The run's path through the MI × H(Z|X) plane, in the four regimes of docs/spec.md §4 (one panel per scope)."""
    scopes = [
        s for s in MI_SCOPES if has_metric(records, f"mi/{s}/mi_est") and has_metric(records, f"mi/{s}/h_cond_est")
    ]
    if not scopes:
        if skipped is not None:
            skipped.append("regimes: figure skipped (no mi/<scope>/mi_est with mi/<scope>/h_cond_est in the log)")
        return None
    figure = new_figure(10 if len(scopes) == 1 else 14, 6)
    axes = figure.subplots(1, len(scopes), squeeze=False)[0]
    all_steps = np.concatenate([metric_series(records, f"mi/{s}/mi_est")[0] for s in scopes])
    colour_range = (float(all_steps.min()), float(max(all_steps.max(), all_steps.min() + 1)))
    points = [_draw_regime_path(ax, records, scope, colour_range) for ax, scope in zip(axes, scopes, strict=True)]
    figure.colorbar(points[-1], ax=list(axes), label="iteration", shrink=0.9)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=9, frameon=False)
    details = [run_name] if run_name else []
    regime_steps, codes = metric_series(records, "mi/regime")
    if codes.size:
        latest = REGIME_CODES.get(int(codes[-1]), f"code {codes[-1]:g}").replace("_", " ")
        details.append(f"logged regime at iteration {regime_steps[-1]:.0f}: {latest}")
    title = "Reasoning regimes: input dependence vs within-input diversity"
    figure.suptitle("\n".join([title, *details]), fontsize=13, fontweight="bold")
    return figure


# ---------------------------------------------------------------- saving


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Write `figure` as a PNG at `DPI`, creating the folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, facecolor="white")
    return path


def render_run(records: Records, out_dir: str | Path, run_name: str = "") -> tuple[list[Path], list[str]]:
    """Every figure of `PLOT_ORDER` that has data, saved as `out_dir/<name>.png`; returns (paths, skip notes)."""
    if not records:
        raise ValueError("the metrics log has no records; run at least one training iteration before plotting.")
    paths, skipped = [], []
    for name in PLOT_ORDER:
        figure = PLOTS.get(name)(records, run_name=run_name, skipped=skipped)
        if figure is not None:
            paths.append(save_figure(figure, Path(out_dir) / f"{name}.png"))
    return paths, skipped


def run_title(run_dir: Path) -> str:
    """'env · model · algorithm · filter' from the run's resolved config.yaml, or the folder name without one."""
    config_path = Path(run_dir) / "config.yaml"
    if not config_path.is_file():
        return Path(run_dir).name
    config = OmegaConf.load(config_path)
    parts = [OmegaConf.select(config, f"{group}.name") for group in ("env", "model", "algorithm")]
    strategy = OmegaConf.select(config, "filter.strategy")
    if strategy and strategy != "none":
        parts.append(f"filter {strategy} {OmegaConf.select(config, 'filter.value', default='')}".strip())
    named = [str(part) for part in parts if part]
    return " · ".join(named) if named else Path(run_dir).name
