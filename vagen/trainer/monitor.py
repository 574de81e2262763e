"""Training diagnostics: MI proxies on the unfiltered batch, the reasoning regime, the Echo Trap monitor.

State (MI-ZScore EMAs, the calibrated H(Z|X) threshold, the Echo Trap history) lives here and goes
into every checkpoint, so a resumed run reports exactly what an uninterrupted one would.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import torch

from vagen.diagnostics import COLLAPSE_REGIMES, REGIMES, classify_regime, echo_trap_update, mi_metrics
from vagen.diagnostics.scoring import build_scoring_job, image_probe_metrics
from vagen.rollout import Trajectory


class DiagnosticsMonitor:
    """Computes `mi/…` every `compute_freq` iterations and `echo/…` every iteration."""

    def __init__(self, cfg: Any, seed: int) -> None:
        self.cfg, self.seed = cfg, seed
        self.ema: dict[str, Any] = {}
        self.echo_state: dict[str, torch.Tensor] | None = None
        self.h_threshold: float | None = cfg.h_threshold
        self.regime: str | None = None  # the last measured regime: a collapse warns when it begins

    def mi(self, learner: Any, trajectories: list[Trajectory], iteration: int) -> dict[str, float]:
        """MI proxies for each scope (and the image-dependence probe) on this iteration's batch. The model's side, the
        scoring, is the learner's (`cross_score`, `image_probe`; a Learner or a Ray group of them); the maths and the
        state stay here."""
        freq = self.cfg.compute_freq
        if not freq or iteration % freq:
            return {}
        start = time.perf_counter()
        rng = np.random.default_rng([self.seed, iteration])
        metrics: dict[str, float] = {}
        for scope in self.cfg.scopes:
            job = build_scoring_job(
                trajectories, learner.tokenizer, scope, self.cfg.max_prompts, self.cfg.max_reasonings, rng
            )
            metrics[f"mi/{scope}/num_prompts"] = float(len(job.prompts))
            metrics[f"mi/{scope}/num_reasonings"] = float(len(job.reasonings))
            if len(job.prompts) < 2 or not job.reasonings:
                continue  # e.g. no response had a <think> block yet: nothing to measure
            scores, lengths = learner.cross_score(job, self.cfg.micro_batch)
            values, self.ema[scope] = mi_metrics(
                scores, lengths, job.source(), ema_state=self.ema.get(scope), prompt_ids=job.prompt_ids()
            )
            metrics.update({f"mi/{scope}/{name}": float(value) for name, value in values.items()})
            if scope == self.cfg.scopes[0] and self.cfg.image_probe:
                metrics.update(self._image_probe(learner, job, scores))
        metrics.update(self._regime(metrics, step=iteration + 1))
        metrics["perf/mi_s"] = time.perf_counter() - start
        return metrics

    def _image_probe(self, learner: Any, job, scores) -> dict[str, float]:
        probe = learner.image_probe(job, self.cfg.micro_batch, scores)
        if probe is None:
            return {}
        values, self.ema["visual"] = image_probe_metrics(probe, self.ema.get("visual"))
        return {f"mi/{name}": float(value) for name, value in values.items()}

    def _regime(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        """Place this step in the MI × H(Z|X) plane of the first scope (thresholds in the config); warn when the
        reasoning enters a collapse regime (input-agnostic: MI below its threshold). `step`: the iteration's step in
        metrics.jsonl."""
        scope = self.cfg.scopes[0]
        mi, h_cond = metrics.get(f"mi/{scope}/mi_est"), metrics.get(f"mi/{scope}/h_cond_est")
        if mi is None or h_cond is None:
            return {}
        if self.h_threshold is None:  # calibrate once: half of H(Z|X) at the first measurement
            self.h_threshold = 0.5 * h_cond
        mi_threshold = self.cfg.mi_threshold_fraction * metrics[f"mi/{scope}/mi_upper_bound"]
        regime = classify_regime(mi, h_cond, mi_threshold, self.h_threshold)
        if regime in COLLAPSE_REGIMES and self.regime not in COLLAPSE_REGIMES:
            warnings.warn(
                f"Reasoning regime {regime} at step {step}: the {scope} reasoning's MI-Est with its input is "
                f"{mi:.3f} nats, below {mi_threshold:.3f} (diagnostics.mi_threshold_fraction x log B), so it does "
                "not depend on what the policy sees (docs/training.md, Regimes). Look at the run's GIFs; a "
                "KL to the warm start (algorithm.kl_coef > 0; 0.05 kept sokoban_visual's readings, docs/learning.md) "
                "holds the reasoning near the warm start's.",
                stacklevel=2,
            )
        self.regime = regime
        return {
            "mi/regime": float(REGIMES.index(regime)),
            "mi/mi_threshold": mi_threshold,
            "mi/h_threshold": self.h_threshold,
        }

    def echo(self, reward_std: float, metrics: dict[str, float]) -> dict[str, float]:
        """Echo Trap and policy-collapse signals from this step's reward spread, success, entropy and gradient norm;
        warns when either signature appears."""
        self.echo_state, signals = echo_trap_update(
            self.echo_state,
            reward_std,
            metrics.get("policy/entropy", math.nan),
            metrics.get("policy/grad_norm", math.nan),
            window=self.cfg.echo_window,
            spike_factor=self.cfg.echo_spike_factor,
            success=metrics.get("env/success", math.nan),
        )
        out = {f"echo/{name}": float(value) for name, value in signals.items()}
        if out["echo/echo_trap"]:
            warnings.warn(
                "Echo Trap signature: within-group reward std and entropy are falling while the gradient "
                "norm spikes (RAGEN). Consider algorithm=starpo_s (variance filtering, clip-higher).",
                stacklevel=2,
            )
        if out["echo/policy_collapse"]:
            warnings.warn(
                "Policy collapse signature: training success is falling while entropy rises and the gradient "
                "norm spikes: the policy's outputs are degenerating (it fires some iterations after the fall). "
                "Resume from a checkpoint saved before the fall if one is still kept (the kept ones reach back "
                "trainer.keep_checkpoints x trainer.save_every iterations), with a lower trainer.lr or "
                "algorithm.kl_coef > 0.",
                stacklevel=2,
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema, "echo": self.echo_state, "h_threshold": self.h_threshold, "regime": self.regime}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema, self.echo_state = state.get("ema", {}), state.get("echo")
        self.h_threshold = state.get("h_threshold", self.cfg.h_threshold)
        self.regime = state.get("regime")
