"""Cross-field checks of a training config, run before any model loads; each error says the fix."""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
from omegaconf import OmegaConf

from vagen.algos.advantages import ADVANTAGE_ESTIMATORS
from vagen.algos.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS
from vagen.engines import ENGINES
from vagen.env import make_env
from vagen.filtering import EMPTY_POLICIES, FILTER_STRATEGIES, SPREAD_STATS
from vagen.logging.sinks import WANDB_MODES
from vagen.models.lora import require_peft
from vagen.rollout.context import DialogueFormatter
from vagen.trainer.loop import SEED_STRIDE

CRITIC_ESTIMATORS = ("gae", "bilevel_gae")
GROUP_ESTIMATORS = ("grpo", "grpo_turn", "gigpo", "drgrpo", "rloo")


def _choice(value: Any, valid: list[str], key: str) -> None:
    if value not in valid:
        raise ValueError(f"Unknown {key}={value!r}; valid: {valid}.")


POSITIVE_INTEGERS = (
    "trainer.iterations",
    "trainer.workers",
    "trainer.groups",
    "trainer.group_size",
    "trainer.ppo_epochs",
    "trainer.mini_batch_size",
    "trainer.micro_batch_size",
    "trainer.save_every",
    "trainer.keep_checkpoints",
    "trainer.eval_episodes",
    "rollout.max_new_tokens",
    "rollout.max_context_tokens",
)
DEVICES = ("auto", "cpu", "cuda")


def _check_numbers(cfg: Any) -> None:
    """Every numeric option in its range, before anything runs (else: a raw ZeroDivisionError mid-run, or a
    silent no-op run for iterations=0 / lr=0)."""
    for key in POSITIVE_INTEGERS:
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key}={value!r} must be a whole number >= 1.")
    trainer, rollout = cfg.trainer, cfg.rollout
    if not trainer.lr > 0 or not trainer.critic_lr > 0:
        raise ValueError(f"trainer.lr={trainer.lr} and trainer.critic_lr={trainer.critic_lr} must be > 0.")
    if not trainer.adam_eps > 0:
        raise ValueError(f"trainer.adam_eps={trainer.adam_eps} must be > 0 (AdamW divides by sqrt(v) + eps).")
    for key in ("rollout.temperature", "trainer.eval_temperature", "trainer.eval_every"):
        if not OmegaConf.select(cfg, key) >= 0:
            raise ValueError(f"{key}={OmegaConf.select(cfg, key)} must be >= 0 (0 = greedy / no validation).")
    pool = trainer.level_pool
    if not isinstance(pool, int) or isinstance(pool, bool) or not (pool == 0 or trainer.groups <= pool <= SEED_STRIDE):
        raise ValueError(
            f"trainer.level_pool={pool!r} must be 0 (new levels every iteration) or a whole number from "
            f"trainer.groups={trainer.groups} (so one batch never plays a level twice) to {SEED_STRIDE}."
        )
    if not 0 < rollout.top_p <= 1:
        raise ValueError(f"rollout.top_p={rollout.top_p} must be in (0, 1] (1 = no nucleus truncation).")
    _choice(cfg.device, list(DEVICES), "device")
    _choice(cfg.logger.wandb_mode, list(WANDB_MODES), "logger.wandb_mode")
    # The strategy checks its own parameter (with its own fix in the message): ask it now, on a dummy group.
    FILTER_STRATEGIES.get(cfg.filter.strategy)(
        torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.bool), float(cfg.filter.value)
    )


def _dotted_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix[:-1]]
    return [key for name, value in node.items() for key in _dotted_keys(value, f"{prefix}{name}.")]


def check_overrides(config_dir: str, config_name: str, overrides: list[str]) -> None:
    """Compose the command line's overrides once, turning Hydra's error for a misspelt option (which advises
    `+key=...`, adding a key nothing reads) into a ValueError that names the closest real option."""
    import difflib

    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    plain = [o for o in overrides if not o.startswith(("hydra.", "+", "~", "-")) and "=" in o]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        try:
            compose(config_name, overrides=plain)
        except HydraException as error:
            match = re.search(r"Could not override '([^']+)'", str(error))
            if match is None:  # e.g. model=<no such config>: Hydra's message already lists the valid ones
                raise ValueError(str(error).split("\nConfig search path")[0]) from None
            key = match.group(1)
            known = _dotted_keys(OmegaConf.to_container(compose(config_name), resolve=False))
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise ValueError(
                f"Unknown option {key!r}.{hint} Every option is documented in configs/ (train.yaml and its groups)."
            ) from None


def check_model_reads_env(cfg: Any) -> None:
    """Raise when the env shows images to a text-only model (cfg.env, cfg.model as in configs/)."""
    observation = cfg.env.kwargs.get("observation", "text")
    if observation != "text" and cfg.model.modality == "text":
        raise ValueError(
            f"env={cfg.env.name} shows images (observation={observation}) but model={cfg.model.name} reads text "
            f"only: use the text variant of the env (e.g. env={cfg.env.name.replace('_visual', '_text')}) or a "
            "vision-language model (model=tiny_vl, model=qwen2_5_vl_3b)."
        )


def check_workers(cfg: Any) -> None:
    """`trainer.workers > 1` needs Ray and at least one whole group per worker."""
    workers, groups = cfg.trainer.workers, cfg.trainer.groups
    if workers == 1:
        return
    if groups < workers:
        raise ValueError(
            f"trainer.workers={workers} exceeds trainer.groups={groups}: groups are never split, so each worker needs "
            f"one; raise trainer.groups to at least {workers} or lower trainer.workers."
        )
    cpus = OmegaConf.select(cfg, "ray.cpus_per_worker")
    if cpus is not None and (not isinstance(cpus, int) or cpus < 1):
        raise ValueError(f"ray.cpus_per_worker={cpus!r} must be a whole number >= 1, or null.")
    try:
        import ray  # noqa: F401
    except ImportError as error:
        message = f"trainer.workers={workers} runs on Ray, which is not installed: pip install -e .[ray]."
        raise ValueError(message) from error


def validate_config(cfg: Any) -> None:
    """Raise `ValueError` for an incompatible combination of options, naming the option to change."""
    algo, trainer, rollout, filt = cfg.algorithm, cfg.trainer, cfg.rollout, cfg.filter
    _choice(algo.advantage, ADVANTAGE_ESTIMATORS.names(), "algorithm.advantage")
    _choice(algo.loss_agg, LOSS_AGGREGATIONS.names(), "algorithm.loss_agg")
    _choice(algo.kl_kind, KL_ESTIMATORS.names(), "algorithm.kl_kind")
    _choice(filt.strategy, FILTER_STRATEGIES.names(), "filter.strategy")
    _choice(filt.stat, SPREAD_STATS.names(), "filter.stat")
    _choice(filt.empty_policy, list(EMPTY_POLICIES), "filter.empty_policy")
    if rollout.engine == "api":
        raise ValueError(
            "rollout.engine=api cannot train: a chat server answers text, not the sampled token ids and log-probs "
            "training needs. Use rollout=hf or rollout=vllm; to benchmark a served model, run "
            "scripts/evaluate.py engine=api engine.model=<name>."
        )
    _choice(rollout.engine, ENGINES.names(), "rollout.engine")
    _check_numbers(cfg)
    if algo.advantage in CRITIC_ESTIMATORS and not algo.critic:
        raise ValueError(
            f"algorithm.advantage={algo.advantage} needs a value model: set algorithm.critic=true "
            "(or use algorithm=ppo / starpo_s), or pick a critic-free estimator such as grpo."
        )
    if algo.advantage in GROUP_ESTIMATORS and trainer.group_size < 2:
        raise ValueError(
            f"algorithm.advantage={algo.advantage} compares rollouts within a group, so "
            f"trainer.group_size={trainer.group_size} must be >= 2."
        )
    if filt.strategy != "none" and trainer.group_size < 2:
        raise ValueError(
            f"filter.strategy={filt.strategy} ranks groups by reward spread, which needs "
            "trainer.group_size >= 2 (or use filter=none)."
        )
    if not 0 < algo.clip_low < 1 or algo.clip_high <= 0:
        raise ValueError("algorithm.clip_low must be in (0, 1) and algorithm.clip_high > 0.")
    if algo.advantage_min is not None and (isinstance(algo.advantage_min, bool) or algo.advantage_min > 0):
        raise ValueError(
            f"algorithm.advantage_min={algo.advantage_min!r} must be a number <= 0 (0 = self-imitation) or null; "
            "a positive floor would push up every sampled text, the worst ones included."
        )
    if trainer.micro_batch_size > trainer.mini_batch_size:
        raise ValueError(
            f"trainer.micro_batch_size={trainer.micro_batch_size} exceeds trainer.mini_batch_size="
            f"{trainer.mini_batch_size}; make it at most the mini-batch (micro-batches accumulate into one)."
        )
    if rollout.max_new_tokens >= rollout.max_context_tokens:
        raise ValueError("rollout.max_new_tokens must be smaller than rollout.max_context_tokens.")
    check_model_reads_env(cfg)
    for key in ("trainer.gradient_checkpointing", "trainer.memory_check", "trainer.bf16", "trainer.eval_move_probe"):
        if not isinstance(OmegaConf.select(cfg, key), bool):
            raise ValueError(f"{key}={OmegaConf.select(cfg, key)!r} must be true or false.")
    if trainer.lora.enabled and trainer.lora.dropout > 0:
        raise ValueError(
            f"trainer.lora.dropout={trainer.lora.dropout} would have no effect: RL updates run without dropout, so "
            "that the old and new log-probs come from the same function and the first PPO ratio is exactly 1. "
            "Set trainer.lora.dropout=0."
        )
    check_workers(cfg)
    on_gpu = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if rollout.engine == "vllm" and rollout.engine_kwargs.get("enable_sleep_mode") and not on_gpu:
        raise ValueError(
            "rollout.engine_kwargs.enable_sleep_mode=true frees GPU memory during the update, and vLLM has sleep mode "
            "on CUDA/ROCm only; set it to false on CPU."
        )
    if trainer.lora.enabled:
        require_peft("trainer.lora.enabled")


def warn_without_state_key(cfg: Any) -> bool:
    """Warn (once, here) when `algorithm.advantage=gigpo` meets a game without `state_key()`: every turn then lacks an
    anchor state and GiGPO is its episode level alone, i.e. GRPO. Returns whether it warned."""
    if cfg.algorithm.advantage != "gigpo":
        return False
    env = make_env(cfg.env.id, **cfg.env.kwargs)
    env.reset(seed=cfg.seed)
    if env.unwrapped.state_key() is not None:
        return False
    warnings.warn(
        f"env={cfg.env.name} has no state_key(), so algorithm.advantage=gigpo finds no anchor states and falls back "
        "to its episode-level advantage (GRPO's). Implement LanguageEnv.state_key for the game to get step credit.",
        stacklevel=2,
    )
    return True


def check_prompt_fits(cfg: Any, tokenizer: Any, image_processor: Any | None) -> int:
    """Length of the first prompt of the env; raises if it and one response overflow the context budget."""
    env = make_env(cfg.env.id, **cfg.env.kwargs)
    observation, _ = env.reset(seed=cfg.seed)
    prompt = DialogueFormatter(tokenizer, image_processor).first_prompt(observation)
    needed = len(prompt) + cfg.rollout.max_new_tokens
    if needed > cfg.rollout.max_context_tokens:
        raise ValueError(
            f"The first prompt of env={cfg.env.name} is {len(prompt)} tokens; with rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens} it needs {needed} > rollout.max_context_tokens="
            f"{cfg.rollout.max_context_tokens}. Raise rollout.max_context_tokens to at least {needed}."
        )
    return len(prompt)
