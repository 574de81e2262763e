"""One StarPO iteration (RAGEN), driven by the loop whoever holds the model: `StarPOTrainer` holds a
`vagen.trainer.learner.Learner` (this process) or, with `trainer.workers > 1`, a `vagen.trainer.workers.RayLearners`
group with the same API.

rollout → diagnostics hook (unfiltered batch) → group filter (whole groups) → the learner's update on the kept
groups (old/ref log-probs → advantages → mini-batch PPO epochs) → Echo Trap monitor → scheduler step and engine
sync. The loop owns what must be identical for any number of workers: the iteration count, the level sampler, the
filter, the reroll rule, the diagnostics state and the metrics. Every per-iteration random choice (sampling seed,
shuffling) is derived from (seed, iteration), so a resumed run replays exactly what an uninterrupted one would have
done.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from vagen.engines import SamplingParams
from vagen.engines.base import derive_seed
from vagen.env import make_env
from vagen.env.policies import solver_distance
from vagen.filtering import apply_empty_policy, select_groups
from vagen.rollout import Trajectory, trajectories_to_batch
from vagen.rollout.validation import (
    actions_per_turn,
    episode_metrics,
    reading_metrics,
    success_by_level,
    validation_metrics,
)
from vagen.trainer.config import validate_config
from vagen.trainer.learner import SAMPLING_STREAM, Learner
from vagen.trainer.levels import SEED_STRIDE, FrontierSampler, FrontierSettings, LevelSampler, PLRSettings
from vagen.trainer.monitor import DiagnosticsMonitor


def rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """env/ and rollout/ metrics of a batch of trajectories (before filtering)."""
    turns = [turn for t in trajectories for turn in t.turns]
    count = max(len(turns), 1)
    return {
        **{f"env/{name}": value for name, value in episode_metrics(trajectories).items()},
        "env/action_valid": sum(bool(turn.info.get("action_is_valid")) for turn in turns) / count,
        "env/action_effective": sum(bool(turn.info.get("action_is_effective")) for turn in turns) / count,
        "env/actions_per_turn": actions_per_turn(trajectories),
        "rollout/response_tokens": sum(len(turn.response_ids) for turn in turns) / count,
        "rollout/length_cut": sum(turn.finish_reason == "length" for turn in turns) / count,
        "rollout/context_budget_ends": sum(t.end_reason == "context_budget" for t in trajectories) / len(trajectories),
        **reasoning_scores(turns),
    }


def reasoning_scores(turns) -> dict[str, float]:
    """env/grounding_score and env/prediction_score: mean grade of the turns that were graded (the
    grounding/worldmodeling formats on a game with `state_objects`); env/reasoning_match: the share of turns whose
    <think> equals the demonstration's (when `reasoning_coef` > 0). Each absent when no turn was judged."""
    metrics = {}
    for key in ("grounding_score", "prediction_score", "reasoning_match"):
        scores = [turn.info[key] for turn in turns if turn.info.get(key) is not None]
        if scores:
            metrics[f"env/{key}"] = sum(scores) / len(scores)
    return metrics


def group_returns(trajectories: list[Trajectory], groups: int, group_size: int) -> torch.Tensor:
    """Total rewards as [G, N], row g = the rollouts of group g in rollout order."""
    rewards = torch.zeros(groups, group_size)
    filled = [0] * groups
    for trajectory in trajectories:
        g = trajectory.group_id
        rewards[g, filled[g]] = trajectory.total_reward
        filled[g] += 1
    return rewards


def level_sampler(cfg: DictConfig) -> LevelSampler | FrontierSampler:
    """`trainer.level_sampler`'s sampler; the frontier one measures each candidate level's solver distance on an env
    of its own."""
    trainer, first_seed = cfg.trainer, cfg.seed * SEED_STRIDE
    if trainer.level_sampler != "frontier":
        plr = PLRSettings(**OmegaConf.to_container(trainer.plr, resolve=True))
        return LevelSampler(trainer.level_sampler, cfg.seed, first_seed, trainer.level_pool, plr)
    env = make_env(cfg.env.id, **OmegaConf.to_container(cfg.env.kwargs, resolve=True))
    settings = FrontierSettings(**OmegaConf.to_container(trainer.frontier, resolve=True))
    return FrontierSampler(cfg.seed, first_seed, settings, functools.partial(solver_distance, env))


def run_fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed by `cfg` (not the worker count: any N resumes)."""
    return {
        "model": cfg.model.name,
        "algorithm": cfg.algorithm.name,
        "critic": bool(cfg.algorithm.critic),
        "lora": bool(cfg.trainer.lora.enabled),
        "env": cfg.env.name,
        "env_kwargs": OmegaConf.to_container(cfg.env.kwargs, resolve=True),  # the task itself
        "seed": int(cfg.seed),  # the RNG and level cursor restored belong to it
    }


def build_learner(cfg: DictConfig) -> Any:
    """This process's `Learner`, or with `trainer.workers > 1` a Ray group of that many (the same API)."""
    if cfg.trainer.workers == 1:
        return Learner(cfg)
    from vagen.trainer.workers import RayLearners  # Ray is imported only by runs that use it

    return RayLearners(cfg)


class StarPOTrainer:
    """The iteration loop and its state; the model side is `self.learner` (a `Learner`, or Ray replicas of one)."""

    def __init__(self, cfg: DictConfig, learner: Any = None) -> None:
        validate_config(cfg)  # before any model loads
        self.cfg = cfg
        self.iteration = 0
        self.levels = level_sampler(cfg)
        self.monitor = DiagnosticsMonitor(cfg.diagnostics, cfg.seed)
        self.last_trajectories: list[Trajectory] = []
        self.initial_val: dict[str, float] = {}  # val/ metrics before training (for the held-out line)
        self.val_outcomes: dict[int, float] = {}  # the last validation's success per held-out seed
        self.initial_outcomes: dict[int, float] = {}  # the same before training (the held-out line pairs them)
        self.val_history: dict[int, dict[int, float]] = {}  # every validation's val_outcomes, by iteration
        self.greedy_history: dict[int, dict[int, float]] = {}  # the same, played greedily (trainer.eval_greedy)
        self.learner = learner if learner is not None else build_learner(cfg)

    # ---- one iteration -------------------------------------------------------------------
    def sampling(self) -> SamplingParams:
        rollout = self.cfg.rollout
        return SamplingParams(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            seed=derive_seed(self.cfg.seed, self.iteration, SAMPLING_STREAM),
        )

    @property
    def seed_cursor(self) -> int:
        """The next new training level."""
        return self.levels.cursor

    def rollout(self) -> list[Trajectory]:
        """P groups × N rollouts of the P levels the level sampler picks (`trainer.level_sampler`), then the sampler
        learns each level's reward spread (population std of its group's returns) and success rate."""
        trainer = self.cfg.trainer
        seeds = self.levels.next_seeds(trainer.groups, self.iteration)
        trajectories = self.learner.collect(seeds, self.sampling())
        spread = group_returns(trajectories, trainer.groups, trainer.group_size).std(dim=1, unbiased=False)
        solved = [0.0] * trainer.groups
        for trajectory in trajectories:
            solved[trajectory.group_id] += trajectory.success / trainer.group_size
        self.levels.update(seeds, spread.tolist(), self.iteration, successes=solved)
        return trajectories

    def filter_hook(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """Keep or drop whole groups by reward spread, before any group statistic is computed."""
        trainer, filt = self.cfg.trainer, self.cfg.filter
        rewards = group_returns(trajectories, trainer.groups, trainer.group_size)
        selected, metrics = select_groups(rewards, strategy=filt.strategy, value=filt.value, stat=filt.stat)
        kept = apply_empty_policy(selected, trainer.groups, filt.empty_policy)
        out = {f"filter/{name}": float(value) for name, value in metrics.items()}
        # keep_all overrides an empty selection: report what actually enters the update.
        out["filter/empty_policy_applied"] = float(len(kept) != len(selected))
        out["filter/kept_count"], out["filter/kept_ratio"] = float(len(kept)), len(kept) / trainer.groups
        keep = set(kept.tolist())
        return [t for t in trajectories if t.group_id in keep], out

    def sample_batch(self) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
        """Rollout → group filter → reroll while nothing is kept (filter.empty_policy=reroll).

        Returns the rollout trained from (the last one), its kept trajectories, and metrics that all describe
        that rollout (env/, rollout/, filter/); `perf/rollout_s` counts the time of every attempt.
        """
        filt, rerolls, rollout_s = self.cfg.filter, 0, 0.0
        while True:
            start = time.perf_counter()
            trajectories = self.rollout()
            rollout_s += time.perf_counter() - start
            kept, filter_metrics = self.filter_hook(trajectories)
            if kept or filt.empty_policy != "reroll" or rerolls >= filt.max_rerolls:
                break
            rerolls += 1
        metrics = {**rollout_metrics(trajectories), **filter_metrics, "filter/rerolls": float(rerolls)}
        metrics.update(self.levels.metrics())
        metrics["filter/skipped_update"], metrics["perf/rollout_s"] = float(not kept), rollout_s
        return trajectories, kept, metrics

    def train_iteration(self, around: Callable[[str], AbstractContextManager] | None = None) -> dict[str, float]:
        """One StarPO iteration; returns its metrics (namespace/name → float).

        around: a hook for measurements (`benchmarks/bench_iteration.py` counts FLOPs with it): each phase, "rollout"
        (with its filter and rerolls), "diagnostics", "update" and "sync", runs inside the context `around(phase)`.
        """
        phase = around or (lambda name: nullcontext())
        start = time.perf_counter()
        with phase("rollout"):
            trajectories, kept, metrics = self.sample_batch()
        self.last_trajectories = trajectories
        with phase("diagnostics"):
            metrics.update(self.monitor.mi(self.learner, trajectories, self.iteration))
        trainer = self.cfg.trainer
        group_std = group_returns(trajectories, trainer.groups, trainer.group_size).std(dim=1, unbiased=False)
        update_start = time.perf_counter()
        metrics["optim/lr"] = self.learner.learning_rate()
        with phase("update"):
            if kept:
                batch = trajectories_to_batch(kept, pad_token_id=self.learner.tokenizer.pad_token_id or 0)
                visited = trajectories if self.cfg.algorithm.sft_source == "visited" else None
                metrics.update(self.learner.update(batch, self.iteration, visited).means())
        metrics.update(self.monitor.echo(float(group_std.mean()), metrics))
        with phase("sync"):
            self.learner.sync()
        self.iteration += 1
        metrics["perf/update_s"] = time.perf_counter() - update_start
        metrics["perf/iteration_s"] = time.perf_counter() - start
        return metrics

    def validate(self) -> dict[str, float]:
        """`val/` metrics: the current policy on `trainer.eval_episodes` fixed held-out seeds (deterministic),
        `trainer.eval_samples` times each, with the first-move probe. Each seed's success rate stays in
        `val_outcomes` (the held-out line pairs them by level) and in `val_history` under this iteration (the
        checkpoints carry it: `research/compare_runs.py` pairs two runs' validations by level). With
        `trainer.eval_greedy` each level is also played once greedily: `val/greedy_success`, and its outcomes in
        `greedy_history`."""
        levels = range(self.cfg.trainer.eval_episodes)
        episodes = self.learner.play_held_out(levels)
        self.val_outcomes = success_by_level(episodes)
        self.val_history[self.iteration] = self.val_outcomes
        reading = reading_metrics(lambda: make_env(self.cfg.env.id, **self.cfg.env.kwargs), episodes)
        metrics = validation_metrics(episodes) | reading | self.learner.move_probe()
        if self.cfg.trainer.eval_greedy:
            greedy = self.val_outcomes  # a validation at eval_temperature 0 already played every level greedily
            if self.cfg.trainer.eval_temperature != 0:
                greedy = success_by_level(self.learner.play_held_out(levels, greedy=True))
            self.greedy_history[self.iteration] = greedy
            metrics["val/greedy_success"] = sum(greedy.values()) / len(greedy)
        return metrics

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, keep_last: int) -> Path:
        """A complete checkpoint of this iteration: the learner's weights and optimizers with the loop's state."""
        return self.learner.save(self.run_dir, self.iteration, self.state(), keep_last, self.fingerprint())

    def restore(self, path: Path) -> dict[str, Any]:
        """Load a checkpoint written by any worker count (weights, optimizers, RNG, loop and diagnostic state)."""
        state = self.learner.restore(Path(path), self.fingerprint())
        self.load_state(state)
        return state

    def close(self) -> None:
        """Release the engines (and the Ray workers)."""
        self.learner.close()

    def state(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "seed_cursor": self.levels.cursor,
            "levels": self.levels.state_dict(),
            "diagnostics": self.monitor.state_dict(),
            "initial_val": self.initial_val,
            "initial_outcomes": self.initial_outcomes,
            "val_outcomes": self.val_outcomes,
            "val_history": self.val_history,
            "greedy_history": self.greedy_history,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.iteration = int(state["iteration"])
        self.levels.load_state_dict(state.get("levels", {"cursor": state["seed_cursor"]}))
        self.initial_val = dict(state.get("initial_val", {}))
        self.initial_outcomes = dict(state.get("initial_outcomes", {}))  # absent in checkpoints before 2026-11-27
        self.val_outcomes = dict(state.get("val_outcomes", {}))
        self.val_history = {int(k): dict(v) for k, v in state.get("val_history", {}).items()}  # since 2026-11-30
        self.greedy_history = {int(k): dict(v) for k, v in state.get("greedy_history", {}).items()}  # since 2026-12-04
        self.monitor.load_state_dict(state.get("diagnostics", {}))

    def fingerprint(self) -> dict[str, Any]:
        return run_fingerprint(self.cfg)

    def config_dict(self) -> dict[str, Any]:
        return OmegaConf.to_container(self.cfg, resolve=True)

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)
