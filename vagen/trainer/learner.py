"""The model side of StarPO: a `Learner` holds the policy (and the critic and reference where the algorithm has them),
their optimizers and the rollout engine, and nothing of the loop. Its public API is what the iteration loop
(`vagen.trainer.starpo.StarPOTrainer`), the Ray workers (`vagen.trainer.workers`) and the experiments use:

    collect(group_seeds, sampling)      rollouts of the training levels
    play_held_out(episodes, greedy)     held-out episodes with the evaluator's sampling, or greedily
    move_probe()                        the first-move probe on the held-out starts
    cross_score(job) / image_probe(job) the model's side of the MI diagnostics
    score(batch)                        old and reference log-probs, old values, advantages
    update(batch, iteration)            one StarPO update, in paper order, timing its own phases (with a supervised
                                        loss on solver demonstrations where `algorithm.sft_coef` > 0)
    gradient(batch, rows)               the policy gradient of `rows` alone (the gradient-noise study)
    sync()                              scheduler step, and the rollout engine samples from the new weights
    save(...) / restore(...)            checkpoints in the single-process format

Every random choice is derived from (run seed, iteration), which the caller passes in: a Learner keeps no count of
iterations. As one of N data-parallel replicas it scores and trains its share of the rows and sums the results with
the others (`vagen.trainer.data_parallel`).
"""

from __future__ import annotations

import copy
import math
import re
import time
import warnings
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from vagen.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    anchor_group_stats,
    masked_mean,
    masked_whiten,
)
from vagen.algos.losses import (
    aggregate_loss,
    aggregation_share,
    explained_variance,
    kl_penalty,
    policy_loss,
    value_loss,
)
from vagen.bootstrap.demos import Demo, demonstrations, sft_batch, visited_demos
from vagen.bootstrap.warmstart import WarmStartRecipe, backward_sft_batch
from vagen.diagnostics.move_preference import move_preferences, probe_summary
from vagen.diagnostics.scoring import ScoringJob, cross_scores, image_probe
from vagen.engines import EngineSource, SamplingParams, build_engine
from vagen.engines.base import derive_seed
from vagen.env import make_env
from vagen.forward import batched_logprobs, critic_forward, policy_forward
from vagen.models.checkpointing import enable_gradient_checkpointing, recomputing
from vagen.models.lora import VISION_MODULES, adapters_disabled, add_lora, lora_kwargs, merged_state_dict
from vagen.models.precision import emulated_bf16_warning
from vagen.models.registry import load_policy, load_processing
from vagen.models.value import ValueModel
from vagen.rollout import (
    DialogueFormatter,
    RolloutSpec,
    TokenBatch,
    Trajectory,
    collect_rollouts,
    reasoning_mask,
)
from vagen.rollout.move_probe import ProbeState, check_probeable, probe_states
from vagen.rollout.validation import eval_seeds, validation_episodes
from vagen.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from vagen.trainer.config import check_prompt_fits, lr_decay_end, lr_decay_start, warn_without_state_key
from vagen.trainer.data_parallel import DataParallel
from vagen.trainer.memory_plan import plan_run

SAMPLING_STREAM, SHUFFLE_STREAM, DEMO_STREAM = 0, 1, 2  # derive_seed(run seed, iteration, stream): one seed per use


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class UpdateStats:
    """Metric tensors collected over all micro-batches of one update, averaged at the end."""

    values: dict[str, list[torch.Tensor]]

    @classmethod
    def empty(cls) -> UpdateStats:
        return cls(defaultdict(list))

    def add(self, prefix: str, metrics: dict[str, torch.Tensor]) -> None:
        for name, value in metrics.items():
            self.values[f"{prefix}/{name}"].append(torch.as_tensor(value, dtype=torch.float).detach().cpu())

    def merge(self, other: UpdateStats) -> None:
        """Add another replica's values: the means are then those one process would have taken over all of them."""
        for name, items in other.values.items():
            self.values[name] += items

    def means(self) -> dict[str, float]:
        return {name: float(torch.stack(items).nanmean()) for name, items in self.values.items()}


def lr_factor(iteration: int, warmup: int, schedule: str, decay_start: int, decay_end: int) -> float:
    """The learning rates' multiplier in 0-based `iteration`: a linear warm-up over the first `warmup` iterations,
    times 1 until `decay_start`, then falling (`linear` or `cosine`; `constant` does not fall) to 0 at `decay_end`."""
    ramp = min(1.0, (iteration + 1) / warmup) if warmup > 0 else 1.0
    if schedule == "constant" or iteration <= decay_start:
        return ramp
    progress = min(1.0, (iteration - decay_start) / (decay_end - decay_start))
    if schedule == "linear":
        return ramp * (1.0 - progress)
    return ramp * 0.5 * (1.0 + math.cos(math.pi * progress))


class NonFiniteTraining(ValueError):
    """A loss or gradient became inf or NaN; raised before the optimizer step that would write it into the weights."""


def old_logprobs_from_rollout(cfg: DictConfig) -> bool:
    """Whether `trainer.old_logprobs` takes the PPO ratio's old log-probs from the engine. `auto` does where the
    engine samples exactly the function the update scores (the shared hf module, no bf16 autocast, no top-p
    truncation): there the two differ by float rounding only (about 1e-7 nats per token, `rollout/logprob_gap_mean`).
    """
    choice = cfg.trainer.old_logprobs
    if choice != "auto":
        return choice == "rollout"
    return cfg.rollout.engine == "hf" and not cfg.trainer.bf16 and cfg.rollout.top_p >= 1.0


class Learner:
    """The policy, optional critic and reference, their optimizers and the rollout engine of `cfg`.

    data_parallel: this replica's rank among the Ray workers of `trainer.workers > 1` (`vagen.trainer.workers`),
    which split the update's rows and sum its gradients; the default is the single process.
    """

    def __init__(self, cfg: DictConfig, data_parallel: DataParallel | None = None) -> None:
        self.cfg = cfg
        self.data_parallel = data_parallel or DataParallel()
        model_cfg = cfg.model
        tokenizer, image_processor = load_processing(
            model_cfg.source, model_cfg.modality, path=model_cfg.path, size=model_cfg.size
        )
        self.prompt_tokens = check_prompt_fits(cfg, tokenizer, image_processor)
        warn_without_state_key(cfg)
        seed_everything(cfg.seed)
        device = "cuda" if cfg.device == "auto" and torch.cuda.is_available() else cfg.device
        device = "cpu" if device == "auto" else device
        emulated = cfg.trainer.bf16 and emulated_bf16_warning("trainer.bf16", device)
        if emulated:
            warnings.warn(emulated, stacklevel=2)
        # Before minutes of loading end in an out-of-memory error: refuse a run that cannot fit, or lower its
        # micro-batch size where that alone makes it fit.
        self.memory_plan = plan_run(cfg, self.prompt_tokens, device) if cfg.trainer.memory_check else None
        self.micro_batch_size = int(cfg.trainer.micro_batch_size)  # a runtime value: the user's config is never written
        if self.memory_plan is not None and self.memory_plan.micro_batch_size < cfg.trainer.micro_batch_size:
            warnings.warn(
                f"trainer.micro_batch_size={cfg.trainer.micro_batch_size} does not fit in memory; using "
                f"{self.memory_plan.micro_batch_size}, the largest that does by the memory plan "
                f"({self.memory_plan.describe()}): the same gradient, accumulated over more passes.",
                stacklevel=2,
            )
            self.micro_batch_size = self.memory_plan.micro_batch_size
        self.policy = load_policy(
            model_cfg.name,
            model_cfg.source,
            model_cfg.modality,
            path=model_cfg.path,
            size=model_cfg.size,
            dtype=model_cfg.dtype,
            device=device,
        )
        self.model = self.policy.model
        self.tokenizer = self.policy.tokenizer
        self.vision_parameters = [p for name, p in self.model.named_parameters() if is_vision_weight(name)]
        if cfg.trainer.freeze_vision:
            for parameter in self.vision_parameters:
                parameter.requires_grad_(False)
        if cfg.trainer.lora.enabled:
            add_lora(self.model, **lora_kwargs(cfg.trainer.lora), exclude_vision=cfg.trainer.freeze_vision)
        self.formatter = DialogueFormatter(self.policy.tokenizer, self.policy.image_processor)
        self.engine = build_engine(
            cfg.rollout.engine,
            EngineSource(model=self.model, processor=self.policy.processor, model_path=self.policy.folder),
            **cfg.rollout.engine_kwargs,
        )
        self.critic = ValueModel(self.model).to(device) if cfg.algorithm.critic else None
        if cfg.trainer.gradient_checkpointing:
            for module in self.modules.values():
                enable_gradient_checkpointing(module)
        # The KL reference is the initial policy. Under LoRA the base weights never train, so it is the policy itself
        # with its adapters switched off (`reference_scope`): no second copy of the weights.
        self.reference = None
        if cfg.algorithm.kl_coef > 0:
            if cfg.trainer.lora.enabled:
                self.reference = self.model
            else:
                self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizers, self.schedulers = self._optimizers()
        self.probe_states: list[ProbeState] | None = None  # the first-move probe's held-out starts, built once
        self.old_logprobs_from_rollout = old_logprobs_from_rollout(cfg)
        self.demos = self._demonstrations()

    # ---- construction --------------------------------------------------------------------
    def _optimizers(self) -> tuple[dict, dict]:
        trainer = self.cfg.trainer
        factor = partial(
            lr_factor,
            warmup=trainer.warmup_iterations,
            schedule=trainer.lr_schedule,
            decay_start=lr_decay_start(trainer),
            decay_end=lr_decay_end(trainer),
        )
        optimizers = {
            "policy": torch.optim.AdamW(
                self.trainable_parameters(),
                lr=trainer.lr,
                eps=trainer.adam_eps,
                weight_decay=trainer.weight_decay,
            )
        }
        if self.critic is not None:
            optimizers["critic"] = torch.optim.AdamW(
                self.critic.parameters(), lr=trainer.critic_lr, weight_decay=trainer.weight_decay
            )
        schedulers = {name: torch.optim.lr_scheduler.LambdaLR(opt, factor) for name, opt in optimizers.items()}
        return optimizers, schedulers

    def _demonstrations(self) -> list[Demo]:
        """The solver demonstrations that `algorithm.sft_coef` trains on (none when it is 0): the game's noisy solver,
        noise as the warm starts' recipe, on levels 0..`sft_episodes`-1, the same on every replica and every resume."""
        algo = self.cfg.algorithm
        if algo.sft_coef == 0 or algo.sft_source == "visited":  # visited: each update labels its own rollouts
            return []
        noise = WarmStartRecipe.noise_eps
        demos = demonstrations(
            self._make_env, self.formatter, range(algo.sft_episodes), noise, self.cfg.seed, self.cfg.env.name
        )
        if not demos:  # every level's play was noise from its first turn on, or unsolvable
            raise ValueError(
                f"algorithm.sft_coef={algo.sft_coef}: the solver's play of levels 0..{algo.sft_episodes - 1} left no "
                "demonstration to train on; raise algorithm.sft_episodes."
            )
        return demos

    def reference_scope(self) -> Any:
        """Where `self.reference` computes the reference policy: adapters off when it is the LoRA policy itself."""
        return adapters_disabled(self.model) if self.reference is self.model else nullcontext()

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def modules(self) -> dict[str, torch.nn.Module]:
        modules = {"policy": self.model}
        if self.critic is not None:
            modules["critic"] = self.critic
        return modules

    def learning_rate(self) -> float:
        return self.optimizers["policy"].param_groups[0]["lr"]

    # ---- playing ---------------------------------------------------------------------------
    def collect(self, group_seeds: list[int], sampling: SamplingParams, first_group_id: int = 0) -> list[Trajectory]:
        """`group_size` rollouts of each group seed; group ids count from `first_group_id` (a worker's share)."""
        trainer, env_cfg = self.cfg.trainer, self.cfg.env
        spec = RolloutSpec(
            group_seeds=group_seeds,
            group_size=trainer.group_size,
            max_context_tokens=self.cfg.rollout.max_context_tokens,
            env_name=env_cfg.name,
            first_group_id=first_group_id,
        )
        return collect_rollouts(self._make_env, self.engine, self.formatter, spec, sampling)

    def play_held_out(self, episodes: range, greedy: bool = False) -> list[Trajectory]:
        """Play held-out episodes `episodes` (all of them, or a worker's share) with the evaluator's sampling
        (`trainer.eval_temperature`, `trainer.eval_samples` per level), or greedy: once per level, greedily; at most
        an iteration's rollout batch (`trainer.groups` × `trainer.group_size` episodes) at once, as the memory plan
        counts the engine's kept dialogues."""
        trainer, env_cfg = self.cfg.trainer, self.cfg.env
        return validation_episodes(
            self._make_env,
            self.engine,
            self.formatter,
            episodes=episodes,
            temperature=0.0 if greedy else trainer.eval_temperature,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            max_context_tokens=self.cfg.rollout.max_context_tokens,
            env_name=env_cfg.name,
            samples=1 if greedy else trainer.eval_samples,
            batch_episodes=trainer.groups * trainer.group_size,
        )

    def _make_env(self) -> Any:
        return make_env(self.cfg.env.id, **self.cfg.env.kwargs)

    # ---- probes (read the model, never change it) ---------------------------------------------
    def move_probe(self) -> dict[str, float]:
        """`val/move_*`: the first-move probe on the held-out starts of the validation seeds (`trainer.eval_move_probe`;
        nothing for a game without a solver or demonstration reasoning)."""
        if not self.cfg.trainer.eval_move_probe:
            return {}
        if self.probe_states is None:
            try:
                check_probeable(self._make_env())
            except ValueError:
                self.probe_states = []
            else:
                seeds = eval_seeds(self.cfg.trainer.eval_episodes)
                self.probe_states = probe_states(self._make_env, self.formatter, seeds)
        if not self.probe_states:
            return {}
        preferences = move_preferences(self.model, self.policy.processor, self.probe_states)
        summary = probe_summary(preferences, np.array([state.optimal for state in self.probe_states]))
        return {f"val/move_{name}": value for name, value in summary.items()}

    def cross_score(self, job: ScoringJob, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The MI diagnostics' cross-scoring matrix of `job` and its reasoning lengths (`cross_scores`)."""
        return cross_scores(self.model, self.policy.processor, job, micro_batch=micro_batch)

    def image_probe(self, job: ScoringJob, micro_batch: int, scores: torch.Tensor) -> Any:
        """The image-dependence probe of `job` (`vagen.diagnostics.scoring.image_probe`), reusing its `scores`."""
        return image_probe(self.model, self.policy.processor, job, micro_batch=micro_batch, scores=scores)

    # ---- the update, in paper order ----------------------------------------------------------
    def update(self, batch: TokenBatch, iteration: int, visited: list[Trajectory] | None = None) -> UpdateStats:
        """One StarPO update on `batch` (the kept groups' dialogues, `trajectories_to_batch`); its statistics, to be
        averaged (`means()`) or merged with the other replicas'. The mini-batches' order comes from (run seed,
        `iteration`). With `algorithm.sft_source=visited` the demonstration loss imitates the solver at the states of
        `visited` (the iteration's rollouts, `visited_demos`) instead of the demonstrations played at the start.

        1. old log-probs of the sampled tokens, reference log-probs and old values (`score`);
        2. advantages and value targets (`algorithm.advantage`'s estimator);
        3. `ppo_epochs` passes over the batch, one optimizer step per mini-batch, its gradient accumulated over
           micro-batches (`backward`: the clipped policy loss, entropy, KL and value terms);
        4. per step, the replicas' gradients summed, clipped, checked finite, and applied (`step`).
        Times `perf/logprobs_s` (1–2) and `perf/train_s` (3–4); logs `policy/update_norm`, the relative weight change.
        """
        trainer = self.cfg.trainer
        stats = UpdateStats.empty()
        release = getattr(self.engine, "release_memory", None)  # a colocated vLLM frees its GPU memory meanwhile
        if release is not None:
            release()
        # A snapshot on the weights' own device: a host copy of a 3B model and the norm over it in host float32 took
        # 14 s of a 20 s update on an H100 (benchmarks/bench_gpu.py); the memory plan counts it ("snapshot").
        before = [p.detach().clone() for p in self.trainable_parameters()]
        shuffle = torch.Generator().manual_seed(derive_seed(self.cfg.seed, iteration, SHUFFLE_STREAM))
        demo_draws = torch.Generator().manual_seed(derive_seed(self.cfg.seed, iteration, DEMO_STREAM))
        first_order = torch.randperm(len(batch), generator=shuffle)
        demos = self.demos
        if visited is not None:
            demos = visited_demos(self._make_env, self.formatter, visited)
            stats.add("sft", {"labelled_states": float(len(demos))})
        # The first mini-batch is trained on before any weight changes: its old log-probs are exactly the new ones of
        # its own forward (detached), so their separate no-grad pass is skipped (`trainer.reuse_first_forward`).
        # Data-parallel replicas score every row up front instead: a replica only sees the forwards of its own rows.
        # With `trainer.old_logprobs` at rollout, the other rows take the engine's own log-probs (no pass at all), and
        # only the rows scored exactly (the fresh ones) measure the rollout/training gap.
        fresh = torch.zeros(len(batch), dtype=torch.bool)
        if trainer.reuse_first_forward and self.data_parallel.world == 1:
            fresh[first_order[: trainer.mini_batch_size]] = True
        from_rollout = self.old_logprobs_from_rollout
        exact = fresh.clone() if from_rollout else torch.ones(len(batch), dtype=torch.bool)

        start = time.perf_counter()
        batch = self.score(batch, fresh, from_rollout)  # 1-2
        self._synchronize()
        stats.add("perf", {"logprobs_s": time.perf_counter() - start})
        mask = batch.response_mask
        stats.add("rollout", {"advantage_abs_mean": (batch.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)})
        if self.cfg.algorithm.advantage == "gigpo":
            stats.add("rollout", anchor_group_stats(batch.turn_states, batch.turn_ids, mask))
        if self.cfg.algorithm.advantage_tokens == "answer":  # the share of sampled tokens `score` gave no advantage
            stats.add("rollout", {"reasoning_token_share": self.reasoning(batch).sum() / mask.sum().clamp(min=1)})
        if batch.old_values is not None:
            # Once per update, over the whole batch, from the values the advantages were built with.
            stats.add("critic", {"explained_variance": explained_variance(batch.old_values, batch.value_targets, mask)})

        start = time.perf_counter()
        # The policy and critic stay in eval mode while they learn: with dropout on, the new log-probs would
        # come from a different function than the old ones and the first step's ratio would not be 1.
        for module in self.modules.values():
            module.eval()
        with recomputing(*self.modules.values()):  # a no-op unless trainer.gradient_checkpointing
            for epoch in range(trainer.ppo_epochs):  # 3
                order = first_order if epoch == 0 else torch.randperm(len(batch), generator=shuffle)
                for mini in _chunks(order, trainer.mini_batch_size):
                    self._zero_grad()
                    for micro in batch.micro_batches(self.data_parallel.share(mini), self.micro_batch_size):
                        logprobs = self.backward(batch.select(micro), batch.response_mask[mini], stats, fresh[micro])
                        if bool(fresh[micro].any()):  # keep them: later epochs and the gap metric read old log-probs
                            rows = micro[fresh[micro]]
                            own = logprobs[fresh[micro].to(logprobs.device)].float().cpu()
                            batch.old_logprobs[rows, : logprobs.shape[1]] = own
                    fresh[:] = False
                    if demos:
                        self.backward_demos(demos, stats, demo_draws)
                    self.step(stats, iteration)  # 4
        self._synchronize()
        stats.add("perf", {"train_s": time.perf_counter() - start})
        # Engines report the log-probs of the distribution they sampled from, the trainer scores softmax(logits/T):
        # any gap is rollout/training mismatch (precision, kernels, inputs, and top-p / top-k truncation if on).
        if exact.any():
            measured = mask[exact]
            gap = (batch.rollout_logprobs - batch.old_logprobs).abs()[exact] * measured
            gap_mean = gap.sum() / measured.sum().clamp(min=1)
            stats.add("rollout", {"logprob_gap_mean": gap_mean, "logprob_gap_max": gap.max()})
        stats.add("policy", {"update_norm": relative_change(before, self.trainable_parameters())})
        return stats

    def score(self, batch: TokenBatch, fresh: torch.Tensor | None = None, from_rollout: bool = False) -> TokenBatch:
        """The batch with its old log-probs, reference log-probs, old values, advantages and value targets.

        fresh: [B] bool, rows whose old log-probs the first mini-batch's own forward will provide (they are left 0
        here and filled in by `update`), which saves their separate no-grad forward pass.
        from_rollout: the old log-probs are the engine's (`batch.rollout_logprobs`), not a no-grad pass of the policy.
        """
        algo = self.cfg.algorithm
        processor = self.policy.processor
        temperature = self.cfg.rollout.temperature
        # Same function, precision (autocast) and mode (no dropout) as the update's forward passes, so the
        # PPO ratio of the first on-policy step is exactly 1.
        # Data-parallel replicas score their share of the rows and sum (zeros elsewhere): every replica then
        # holds the whole batch's tensors, and the advantages are computed identically everywhere.
        parallel = self.data_parallel
        mine = parallel.share(torch.arange(len(batch)))

        def logprobs_of(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
            """[B, T] log-probs of the sampled tokens under `model` on `rows`, zeros elsewhere, summed over replicas."""
            out = torch.zeros(batch.input_ids.shape)
            if len(rows):
                scored = batched_logprobs(model, batch.select(rows), processor, self.micro_batch_size, temperature)
                out[rows, : scored.shape[1]] = scored
            return parallel.sum_(out)

        with self._autocast():
            if from_rollout:
                old_logprobs = batch.rollout_logprobs.clone()
            else:
                old_logprobs = logprobs_of(self.model, mine if fresh is None else mine[~fresh[mine]])
            ref_logprobs = None
            if self.reference is not None:
                with self.reference_scope():
                    ref_logprobs = logprobs_of(self.reference, mine)

        def critic_values() -> torch.Tensor:
            """[B, T] V(s_t) on the sampled tokens, zeros elsewhere, summed over replicas."""
            values = torch.zeros(batch.input_ids.shape)
            with self._autocast(), torch.no_grad():
                for rows in batch.micro_batches(mine, self.micro_batch_size):
                    scored = critic_forward(self.critic, batch.select(rows), processor).float().cpu()
                    values[rows, : scored.shape[1]] = scored
            return parallel.sum_(values)

        old_values = critic_values() if self.critic is not None else None
        inputs = AdvantageInputs(
            token_rewards=batch.token_rewards,
            response_mask=batch.response_mask,
            values=old_values,
            group_index=batch.group_index,
            turn_ids=batch.turn_ids,
            turn_states=batch.turn_states,
        )
        params = AdvantageParams(
            gamma=algo.gamma,
            lam=algo.lam,
            gamma_turn=algo.gamma_turn,
            lam_turn=algo.lam_turn,
            step_weight=algo.step_weight,
            normalize_std=algo.normalize_std,
        )
        estimator = ADVANTAGE_ESTIMATORS.get(algo.advantage)
        if self.critic is not None and self._every_replica(self.critic.untrained()):
            # A critic that has never learned says V = 0 everywhere, where Sokoban's returns run from below 0 to 10:
            # start it at this batch's mean return (the returns at V = 0), so that its first steps fit how returns
            # differ between states rather than their mean, which Adam at critic_lr takes hundreds of steps to reach.
            self.critic.start_at(float(masked_mean(estimator(inputs, params)[1], batch.response_mask)))
            old_values = critic_values()
            inputs = replace(inputs, values=old_values)
        advantages, returns = estimator(inputs, params)
        if algo.whiten_advantages:
            advantages = masked_whiten(advantages, batch.response_mask)
        if algo.advantage_min is not None:
            # Self-imitation (advantage_min=0): a small policy loses far more log-prob on pushed-down texts than it
            # gains on pushed-up ones; with negatives dropped the update is a weighted SFT on its better-than-baseline
            # rollouts (for a group-relative estimator, those above their group's mean).
            advantages = advantages.clamp(min=algo.advantage_min)
        if algo.advantage_tokens == "answer":
            # The reward judges the answer: the reasoning learns only as the answer's context (and is held by the KL).
            advantages = advantages.masked_fill(self.reasoning(batch), 0.0)
        value_targets = returns if old_values is not None else None
        return replace(
            batch,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
            old_values=old_values,
            advantages=advantages,
            value_targets=value_targets,
        )

    def reasoning(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T] bool: each turn's sampled tokens through its `</think>` (`algorithm.advantage_tokens=answer`)."""
        return reasoning_mask(batch.input_ids, batch.turn_ids, self.tokenizer.decode)

    def _every_replica(self, flag: bool) -> bool:
        """Whether `flag` holds on every data-parallel replica: a choice that changes which collectives run must be
        the same everywhere (replicas agree unless their weights diverged, which the non-finite check then reports)."""
        return int(self.data_parallel.sum_(torch.tensor([float(flag)])).item()) == self.data_parallel.world

    def backward(
        self, mb: TokenBatch, whole_mask: torch.Tensor, stats: UpdateStats, fresh: torch.Tensor
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch: the clipped policy loss, entropy bonus, KL to the reference and
        the critic's value loss, each weighted by the micro-batch's share of the mini-batch (`aggregation_share`, mask
        of the whole mini-batch `whole_mask`), so the accumulated gradient equals the whole mini-batch's. Rows marked
        `fresh` take their old log-probs from this very forward (detached). Returns the log-probs [b, t], detached."""
        algo = self.cfg.algorithm
        device = next(self.model.parameters()).device
        mask = mb.response_mask.to(device)
        norm_length = self.cfg.rollout.max_new_tokens * self.cfg.env.kwargs.get("max_turns", 1)
        with self._autocast():
            logprobs, entropy = policy_forward(
                self.model, mb, self.policy.processor, with_entropy=True, temperature=self.cfg.rollout.temperature
            )
        old_logprobs = torch.where(fresh.to(device)[:, None], logprobs.detach(), mb.old_logprobs.to(device))
        pg_loss, pg_metrics = policy_loss(
            logprobs,
            old_logprobs,
            mb.advantages.to(device),
            mask,
            clip_low=algo.clip_low,
            clip_high=algo.clip_high,
            dual_clip_c=algo.dual_clip_c,
            agg_mode=algo.loss_agg,
            norm_length=norm_length,
        )
        entropy_mean = aggregate_loss(entropy, mask, "token-mean")
        loss = pg_loss - algo.entropy_coef * aggregate_loss(entropy, mask, algo.loss_agg, norm_length=norm_length)
        if mb.ref_logprobs is not None:
            # Aggregated like the policy loss, so one share weights every term of the loss exactly.
            kl_mat = kl_penalty(logprobs, mb.ref_logprobs.to(device), algo.kl_kind)
            loss = loss + algo.kl_coef * aggregate_loss(kl_mat, mask, algo.loss_agg, norm_length=norm_length)
            stats.add("loss", {"kl": aggregate_loss(kl_mat.detach(), mask, "token-mean")})
        (loss * aggregation_share(mb.response_mask, whole_mask, algo.loss_agg)).backward()
        stats.add("loss", {"policy": pg_loss, "total": loss})
        stats.add("policy", {**pg_metrics, "entropy": entropy_mean})
        if self.critic is not None:
            with self._autocast():
                values = critic_forward(self.critic, mb, self.policy.processor)
            v_loss, v_metrics = value_loss(
                values,
                mb.old_values.to(device),
                mb.value_targets.to(device),
                mask,
                clip=algo.value_clip,
                agg_mode="token-mean",
            )
            (v_loss * aggregation_share(mb.response_mask, whole_mask, "token-mean")).backward()
            stats.add("loss", {"value": v_loss})
            v_metrics.pop("explained_variance")  # logged once per update, over the whole batch
            stats.add("critic", v_metrics)
        return logprobs.detach()

    def backward_demos(self, demos: list[Demo], stats: UpdateStats, draws: torch.Generator) -> None:
        """Forward and backward of `algorithm.sft_coef` times the mean log-loss of `sft_batch_size` of `demos`
        drawn by `draws` (this replica's rows of them; with `algorithm.sft_tokens=think` only each turn's tokens
        through `</think>`), onto the mini-batch's policy gradient; logs `loss/sft`."""
        algo = self.cfg.algorithm
        picks = torch.randperm(len(demos), generator=draws)[: algo.sft_batch_size].tolist()
        batch = sft_batch([demos[i] for i in picks], self.tokenizer.pad_token_id)
        if algo.sft_tokens == "think":  # the reading imitated; the moves after </think> left to the policy gradient
            batch = replace(batch, response_mask=batch.response_mask * self.reasoning(batch))
        rows = self.data_parallel.share(torch.arange(len(batch)))
        loss = backward_sft_batch(
            self.model, batch, self.policy.processor, self.micro_batch_size, self.cfg.trainer.bf16, algo.sft_coef, rows
        )
        stats.add("loss", {"sft": self.data_parallel.sum_(torch.tensor([loss]))[0]})

    def step(self, stats: UpdateStats, iteration: int) -> None:
        """Sum the replicas' gradients, clip them, and step every optimizer; a non-finite loss or gradient norm stops
        the run first (`NonFiniteTraining`, naming `iteration` + 1), before any weight changes."""
        max_norm = self.cfg.trainer.max_grad_norm
        norms = {}
        for name, optimizer in self.optimizers.items():
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self.data_parallel.sum_gradients(params)  # each replica's shares add up to the whole mini-batch
            if name == "policy" and any(p.grad is not None for p in self.vision_parameters):
                # Is the vision tower learning under RL? Its share of the (pre-clipping) gradient says.
                vision_grads = [p.grad for p in self.vision_parameters if p.grad is not None]
                stats.add("policy", {"grad_norm_vision": torch.nn.utils.get_total_norm(vision_grads)})
            norms[name] = torch.nn.utils.clip_grad_norm_(params, max_norm)  # the norm before clipping
            stats.add("policy" if name == "policy" else "critic", {"grad_norm": norms[name]})
        self._check_finite(stats, norms, iteration)
        for optimizer in self.optimizers.values():
            optimizer.step()

    def _check_finite(self, stats: UpdateStats, norms: dict[str, torch.Tensor], iteration: int) -> None:
        """Raise `NonFiniteTraining` when this update's losses (so far, on this replica) or its summed gradient norms
        are inf or NaN: an AdamW step would write them into every weight, and the next checkpoint would keep them.
        Replicas decide together on the sum of their flags, so all raise or none does (no replica is left waiting in
        the next collective)."""
        losses = [value for key in ("loss/total", "loss/value") for value in stats.values.get(key, [])]
        flags = [float(not bool(torch.stack(losses).isfinite().all())) if losses else 0.0]
        flags += [float(not bool(torch.isfinite(norm))) for norm in norms.values()]
        bad = self.data_parallel.sum_(torch.tensor(flags))
        if not bool(bad.any()):
            return
        found = [f"{name} gradient norm {float(norm)}" for name, norm in norms.items() if not torch.isfinite(norm)]
        if bad[0]:
            found.insert(0, "a loss of inf or NaN")
        last = latest_checkpoint(Path(self.cfg.run_dir))
        kept = f"the last complete checkpoint {last} is intact" if last else "no checkpoint had been written yet"
        raise NonFiniteTraining(
            f"Training became non-finite at iteration {iteration + 1}: {', '.join(found)}. The update was not "
            f"applied and nothing was written from it; {kept}. Lower trainer.lr, check env={self.cfg.env.name}'s "
            "rewards for inf/NaN, then rerun to resume from that checkpoint."
        )

    def gradient(self, batch: TokenBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """The policy gradient an update on `rows` alone would step along (before clipping), one tensor per trainable
        parameter, from a batch with its training tensors (`score`). The weights do not change."""
        self.model.eval()  # as in the update: the same function as the old log-probs
        self._zero_grad()
        no_fresh = torch.zeros(len(batch), dtype=torch.bool)
        for micro in batch.micro_batches(self.data_parallel.share(rows), self.micro_batch_size):
            self.backward(batch.select(micro), batch.response_mask[rows], UpdateStats.empty(), no_fresh[micro])
        gradient = [
            p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in self.trainable_parameters()
        ]
        self._zero_grad()
        return gradient

    def _zero_grad(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    def _autocast(self) -> Any:
        device_type = next(self.model.parameters()).device.type
        return torch.autocast(device_type, dtype=torch.bfloat16, enabled=bool(self.cfg.trainer.bf16))

    def _synchronize(self) -> None:
        if next(self.model.parameters()).is_cuda:
            torch.cuda.synchronize()

    # ---- after the update ----------------------------------------------------------------------
    def sync(self) -> None:
        """Step the LR schedulers and make the rollout engine sample from the policy's current weights."""
        for scheduler in self.schedulers.values():
            scheduler.step()
        self.sync_engine()

    def sync_engine(self) -> None:
        """Make the rollout engine sample from the policy's current weights (a no-op for the shared hf engine)."""
        if self.cfg.trainer.lora.enabled and self.cfg.rollout.engine != "hf":
            # An engine with its own copy of the base model knows no peft names: send W + scale·B·A instead.
            self.engine.update_weights(merged_state_dict(self.model))
        else:
            self.engine.update_weights(self.model.state_dict())

    def close(self) -> None:
        """Release the rollout engine's resources (vLLM's memory and worker processes)."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    # ---- checkpoints ----------------------------------------------------------------------
    def save(
        self, run_dir: Path, iteration: int, state: dict[str, Any], keep_last: int, fingerprint: dict[str, Any]
    ) -> Path:
        """A complete checkpoint of `iteration` in `run_dir/checkpoints` (`vagen.trainer.checkpoint`): the weights,
        optimizers and schedulers, with the loop's `state` beside them."""
        return save_checkpoint(
            Path(run_dir),
            iteration,
            modules=self.modules,
            optimizers=self.optimizers,
            schedulers=self.schedulers,
            state=state,
            keep_last=keep_last,
            fingerprint=fingerprint,
        )

    def restore(self, path: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
        """Load a checkpoint (weights, optimizers, RNG); returns the loop state saved with it."""
        state = load_checkpoint(
            Path(path),
            modules=self.modules,
            optimizers=self.optimizers,
            schedulers=self.schedulers,
            fingerprint=fingerprint,
        )
        # An engine with its own copy of the weights (vLLM) still holds the initial ones: sync it before the first
        # rollout, or the first resumed iteration would sample from the untrained policy.
        self.sync_engine()
        return state


def is_vision_weight(name: str) -> bool:
    """Whether the parameter `name` (of `named_parameters()`) is the vision tower's (`trainer.freeze_vision`): inside
    the modules that LoRA leaves out under it (`VISION_MODULES`)."""
    return re.fullmatch(VISION_MODULES, name) is not None


def relative_change(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """‖θ_after − θ_before‖ / ‖θ_before‖ over all given tensors: how far one update moved the weights. Summed in
    float32 on the tensors' device, one host sync at the end."""
    if not before:
        return 0.0
    moved = torch.stack([(a.detach().float() - b.float()).pow(2).sum() for a, b in zip(after, before, strict=True)])
    size = torch.stack([b.float().pow(2).sum() for b in before])
    return float((moved.sum() / size.sum().clamp(min=1e-30)).sqrt())


def _chunks(indices: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]
