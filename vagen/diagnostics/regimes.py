"""Reading the diagnostics: the four reasoning regimes (RAGEN v2) and the Echo Trap monitor (RAGEN v1).

Regimes (docs/spec.md §4) on two axes, input dependence I(X;Z) and within-input diversity H(Z|X):

                      H(Z|X) high            H(Z|X) low
    I(X;Z) high       diverse                compressed
    I(X;Z) low        template_collapse      low_entropy_collapse

Template collapse is the regime entropy metrics miss: reasoning still varies inside one input but
says the same thing for every input.

Echo Trap (docs/spec.md §2): the policy overfits to a few rewarded reasoning patterns; the signature is
within-group reward std falling, entropy falling and the gradient norm spiking together.

Policy collapse, the other way a long run breaks (seen in docs/learning.md: a vision-fixed tiny_vl run that
had climbed to 0.8 training success fell to 0.3 within a few iterations at ~9,500 episodes): the policy's
outputs degenerate rather than narrow, so success falls while entropy *rises*, and the gradient norm spikes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

REGIMES = ("diverse", "compressed", "template_collapse", "low_entropy_collapse")
COLLAPSE_REGIMES = ("template_collapse", "low_entropy_collapse")  # I(X;Z) low: the reasoning ignores its input
DEFAULT_MI_FRACTION = 0.1
ECHO_SIGNALS = ("reward_std", "entropy", "grad_norm", "success")


def default_mi_threshold(num_prompts: int, fraction: float = DEFAULT_MI_FRACTION) -> float:
    """A starting MI threshold: `fraction` of the log B ceiling of the MI estimates (nats).

    Every MI proxy of `vagen.diagnostics.mi` is <= log B, so a fraction of it is comparable across
    batch sizes. 0.1 · log B flags MI that has lost 90% of the headroom. Measured with
    research/bench_mi_regimes.py (B = 16, warm tiny_vl on sokoban_visual): per-token MI-Est of the
    healthy policy is 0.39 · log B (first turn) and 0.30 · log B (trajectory); with its image tokens
    made uninformative (template collapse by construction) it is 0.000 and 0.019 · log B. The 0.1
    rule separates the two with a wide margin there; a model whose healthy reasoning sits nearer the
    threshold should set `diagnostics.mi_threshold_fraction` from its own first measurement.
    """
    if num_prompts < 2 or not 0.0 < fraction <= 1.0:
        raise ValueError(f"need num_prompts >= 2 and fraction in (0, 1], got {num_prompts}, {fraction}.")
    return fraction * math.log(num_prompts)


def classify_regime(
    mi: float | Tensor, h_cond: float | Tensor, mi_threshold: float | Tensor, h_threshold: float | Tensor
) -> str:
    """Name the reasoning regime, one of `REGIMES`.

    Args:
        mi: an MI estimate (e.g. `mi_est` or `mi_seq_est`, nats); "high" means `mi >= mi_threshold`.
        h_cond: the H(Z|X) estimate in the same normalisation (`h_cond_est`, nats per token for
            `mi_est`); "high" means `h_cond >= h_threshold`.
        mi_threshold: below it, the reasoning is treated as input-agnostic. Same units as `mi`; a
            starting point is `default_mi_threshold(B)` = 0.1 · log B.
        h_threshold: below it, the reasoning is treated as near-deterministic given the input. No
            universal value: H(Z|X) per token depends on the model and the prompt format; a useful
            choice is half of `h_cond_est` at the start of training.

    0-dim tensors are accepted (this returns a Python string, so a tensor on an accelerator is synced).
    """
    mi_high = float(mi) >= float(mi_threshold)
    h_high = float(h_cond) >= float(h_threshold)
    if mi_high:
        return "diverse" if h_high else "compressed"
    return "template_collapse" if h_high else "low_entropy_collapse"


def echo_trap_init(window: int = 10, device: torch.device | str | None = None) -> dict[str, Tensor]:
    """Empty monitor state: NaN histories `[window]` float64 per signal, and a step counter."""
    if window < 2 or window % 2:
        raise ValueError(f"echo-trap window must be an even number >= 2 (it is split in halves), got {window}.")
    state = {name: torch.full((window,), math.nan, dtype=torch.float64, device=device) for name in ECHO_SIGNALS}
    state["num_updates"] = torch.zeros((), dtype=torch.long, device=device)
    return state


def _relative_change_of_halves(trend: Tensor) -> Tensor:
    """mean(newer half) / mean(older half) − 1 of a `[window]` series (0 when the older mean is 0)."""
    half = trend.numel() // 2
    older, newer = trend[:half].nanmean(), trend[half:].nanmean()
    safe_older = torch.where(older.abs() > 0, older, torch.ones_like(older))
    return torch.where(older.abs() > 0, newer / safe_older - 1.0, torch.zeros_like(older))


def _append_step(
    state: dict[str, Tensor], current: dict[str, float | Tensor]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Series `[window + 1]` (history then this step, oldest first) per signal, and the shifted new state."""
    series: dict[str, Tensor] = {}
    new_state: dict[str, Tensor] = {"num_updates": state["num_updates"] + 1}
    for name in ECHO_SIGNALS:
        # a state saved before `success` was monitored holds no history for it: start it empty
        history = state[name] if name in state else torch.full_like(state["grad_norm"], math.nan)
        value = torch.as_tensor(current[name], dtype=torch.float64, device=history.device).reshape(1)
        series[name] = torch.cat([history, value])
        new_state[name] = series[name][1:]
    return series, new_state


def _ratio_to_median(value: Tensor, history: Tensor) -> Tensor:
    """value / nanmedian(history) as a 0-dim tensor; 0 when the median is not positive (no scale yet)."""
    median = history.nanmedian()
    positive = median > 0
    return torch.where(
        positive, value / torch.where(positive, median, torch.ones_like(median)), torch.zeros_like(value)
    )


def echo_trap_update(
    state: dict[str, Tensor] | None,
    reward_std: float | Tensor,
    entropy: float | Tensor,
    grad_norm: float | Tensor,
    window: int = 10,
    drop_fraction: float = 0.1,
    spike_factor: float = 3.0,
    success: float | Tensor = math.nan,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Feed one training step's scalars; return the new state and this step's Echo Trap and collapse signals.

    Rule, with h_x the `window` values of signal x before this step and x_t this step's value:
      - reward_std_falling: over the last `window` values including x_t, the mean of the newer half
        is at least `drop_fraction` below the mean of the older half (relative change <= −drop_fraction);
      - entropy_falling: the same rule on the entropy;
      - grad_norm_spike: grad_norm_t > `spike_factor` × median(h_grad_norm). The median, not the mean,
        so one earlier spike does not raise the bar for the next;
      - echo_trap: all three at once, and only after `window` earlier steps (`warmed_up`), so the
        first steps of a run never fire;
      - success_falling: the half-window rule on the training success rate;
      - entropy_rising: the entropy's relative change of halves is at least +drop_fraction;
      - policy_collapse: success_falling, entropy_rising and grad_norm_spike at once (after warm-up).
    Trends compare half-window means rather than consecutive steps so single noisy steps do not fire.
    NaN inputs are stored but ignored by the means and the median (NaN never counts as a spike).

    Args:
        state: None at the start, else the state returned by the previous call (a dict of tensors,
            safe to checkpoint); it is not modified.
        reward_std: mean within-group reward std of this step's batch.
        entropy: mean token entropy of this step's policy.
        grad_norm: the gradient norm of this step's update (before clipping).
        success: the share of this step's episodes that succeeded (NaN: not monitored, never fires).
        window: even history length; drop_fraction in (0, 1); spike_factor > 1.

    Returns:
        new_state, and signals: 0-dim float32 tensors `reward_std_change`, `entropy_change`,
        `success_change` (relative change of half-window means), `grad_norm_ratio` (grad_norm / median
        history, 0 if the median is 0), and 0/1 flags `reward_std_falling`, `entropy_falling`,
        `grad_norm_spike`, `echo_trap`, `success_falling`, `entropy_rising`, `policy_collapse`, `warmed_up`
        (floats, so averaging over steps gives a firing rate).
    """
    if not 0.0 < drop_fraction < 1.0 or not spike_factor > 1.0:
        raise ValueError(f"need drop_fraction in (0, 1) and spike_factor > 1, got {drop_fraction}, {spike_factor}.")
    if state is None:
        device = next((x.device for x in (reward_std, entropy, grad_norm) if isinstance(x, Tensor)), None)
        state = echo_trap_init(window, device)
    if state["grad_norm"].shape != (window,):
        raise ValueError(
            f"state holds a window of {state['grad_norm'].shape[0]} steps but window={window}; keep it fixed."
        )
    current = {"reward_std": reward_std, "entropy": entropy, "grad_norm": grad_norm, "success": success}
    series, new_state = _append_step(state, current)
    warmed_up = state["num_updates"] >= window
    reward_std_change = _relative_change_of_halves(series["reward_std"][-window:])
    entropy_change = _relative_change_of_halves(series["entropy"][-window:])
    success_change = _relative_change_of_halves(series["success"][-window:])
    grad_ratio = _ratio_to_median(series["grad_norm"][-1], history=state["grad_norm"])
    flags = {
        "reward_std_falling": warmed_up & (reward_std_change <= -drop_fraction),
        "entropy_falling": warmed_up & (entropy_change <= -drop_fraction),
        "grad_norm_spike": warmed_up & (grad_ratio > spike_factor),
    }
    flags["echo_trap"] = flags["reward_std_falling"] & flags["entropy_falling"] & flags["grad_norm_spike"]
    flags["success_falling"] = warmed_up & (success_change <= -drop_fraction)
    flags["entropy_rising"] = warmed_up & (entropy_change >= drop_fraction)
    flags["policy_collapse"] = flags["success_falling"] & flags["entropy_rising"] & flags["grad_norm_spike"]
    flags["warmed_up"] = warmed_up
    signals = {
        "reward_std_change": reward_std_change,
        "entropy_change": entropy_change,
        "success_change": success_change,
        "grad_norm_ratio": grad_ratio,
    }
    signals.update(flags)
    return new_state, {name: value.to(torch.float32) for name, value in signals.items()}
