"""Benchmark models on environments: every (model, env) cell played on fixed seeds, stored, summarised, plotted.

`evaluate(cfg, config_dir)` is `scripts/evaluate.py` without Hydra (see configs/evaluate.yaml for
every option). Per cell it plays only the episodes not already on disk (resume), in batches of
`episodes_per_batch`, each batch written as soon as it is done; then the first `gif_episodes`
episodes become GIFs and the rows become summary.{md,csv,json} and success.png in `out_dir`.

Episode k of every env is `env.reset(seed=EVAL_SEED_BASE + seed_offset + k // samples_per_seed)`, the seeds of
`vagen.rollout.validation` (disjoint from training seeds), shared with the trainer's validation. Its sampling is
keyed by its identity (k, seed), as training keys it (`vagen.rollout.loop`), never by its place in a batch: an
episode played again after a crash or a damaged record is the episode a clean run plays.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium
from omegaconf import DictConfig, OmegaConf
from PIL import Image

from vagen.engines.api import ApiEngine, check_api_key_env, check_base_url, redact_secrets
from vagen.engines.base import EngineSource, SamplingParams, build_engine
from vagen.env import make_env
from vagen.eval.episodes import from_trajectory
from vagen.eval.models import ModelSpec, export_for_vllm, load_local_policy, resolve_models
from vagen.eval.storage import CellStore, atomic_write_text
from vagen.eval.summary import add_paired_changes, markdown_table, plot_success, summarize_cell, write_summary
from vagen.rollout import DialogueFormatter, RolloutSpec, collect_rollouts
from vagen.rollout.chat import EpisodeResult, Responder, api_responder, play_chat_episodes, policy_responder
from vagen.rollout.context import DEFAULT_SYSTEM_PROMPT
from vagen.rollout.validation import eval_seeds
from vagen.viz.gif import EpisodeRecord, recorded_episode, save_episode_gif

logger = logging.getLogger(__name__)

_RENAMED_OVERRIDES = {"model": "models", "env": "envs"}


def rename_overrides(overrides: Sequence[str]) -> list[str]:
    """Let users write `model=...` and `env=...`: configs/ has groups of those names, which Hydra would
    try to select from, so the evaluation config keeps the lists under `models` and `envs`."""
    renamed = []
    for override in overrides:
        key, equals, value = override.partition("=")
        renamed.append(f"{_RENAMED_OVERRIDES[key]}={value}" if equals and key in _RENAMED_OVERRIDES else override)
    return renamed


@dataclass
class EvalReport:
    """What `evaluate` made: the summary rows and where everything is."""

    rows: list[dict[str, Any]]
    out_dir: Path
    files: dict[str, Path]
    wall_time_s: float

    def table(self) -> str:
        return markdown_table(self.rows)


# ---- agents ---------------------------------------------------------------------------------


@dataclass
class LocalAgent:
    """A token-in/token-out engine (hf, vllm) played with the trainer's own rollout loop, group size 1.

    Episode k is group k, so its sampling stream is keyed by (k, seed) whatever batch it is played in; a run
    of consecutive episodes is one batch (`RolloutSpec.first_group_id` numbers groups from its first)."""

    engine: Any
    formatter: DialogueFormatter
    sampling: SamplingParams
    max_context_tokens: int

    def play(
        self, make: Callable[[], gymnasium.Env], env_name: str, indices: list[int], seeds: list[int]
    ) -> list[EpisodeResult]:
        started, trajectories, start = time.monotonic(), [], 0
        for end in range(1, len(indices) + 1):
            if end < len(indices) and indices[end] == indices[end - 1] + 1:
                continue
            spec = RolloutSpec(
                group_seeds=seeds[start:end],
                group_size=1,
                max_context_tokens=self.max_context_tokens,
                env_name=env_name,
                first_group_id=indices[start],
            )
            trajectories += collect_rollouts(make, self.engine, self.formatter, spec, self.sampling)
            start = end
        share = (time.monotonic() - started) / len(seeds)
        results = [from_trajectory(t, self.formatter.system_prompt) for t in trajectories]
        for result in results:
            result.wall_time_s = share
        return results


@dataclass
class ChatAgent:
    """An agent that answers chat messages with text: an API model or a built-in policy."""

    respond: Responder
    system_prompt: str

    def play(
        self, make: Callable[[], gymnasium.Env], env_name: str, indices: list[int], seeds: list[int]
    ) -> list[EpisodeResult]:
        return play_chat_episodes(make, seeds, self.respond, self.system_prompt, indices)


def sampling_params(cfg: DictConfig, spec: ModelSpec) -> SamplingParams:
    """Evaluation sampling: `temperature` (0 or `greedy=true`: argmax); API requests carry no seed."""
    return SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=0.0 if cfg.greedy else float(cfg.temperature),
        top_p=float(cfg.top_p),
        seed=None if spec.kind == "api" else int(cfg.seed),
    )


def _device(name: str) -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def _engine_kwargs(engine_cfg: DictConfig, drop: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in OmegaConf.to_container(engine_cfg, resolve=True).items() if k not in drop}


def build_agent(spec: ModelSpec, cfg: DictConfig, out_dir: Path) -> LocalAgent | ChatAgent:
    """Load what plays the spec's episodes (models load here, once per model, only when episodes remain)."""
    system_prompt = cfg.system_prompt or DEFAULT_SYSTEM_PROMPT
    if spec.kind == "policy":
        return ChatAgent(policy_responder(spec.label), system_prompt)
    sampling = sampling_params(cfg, spec)
    if spec.kind == "api":
        kwargs = _engine_kwargs(cfg.engine, ("name", "model"))
        engine = ApiEngine.from_source(EngineSource(model_path=spec.identity["api_model"]), **kwargs)
        return ChatAgent(api_responder(engine, sampling), system_prompt)
    name = cfg.engine.name
    kwargs = _engine_kwargs(cfg.engine, ("name", "device"))
    if name == "hf":
        policy = load_local_policy(spec, _device(cfg.engine.device))
        source = EngineSource(model=policy.model, processor=policy.processor, model_path=policy.folder)
        tokenizer, image_processor = policy.tokenizer, policy.image_processor
    else:
        source, tokenizer, image_processor = _disk_source(spec, cfg, out_dir)
    engine = build_engine(name, source, **kwargs)
    formatter = DialogueFormatter(tokenizer, image_processor, system_prompt=system_prompt)
    return LocalAgent(engine, formatter, sampling, int(cfg.max_context_tokens))


def _disk_source(spec: ModelSpec, cfg: DictConfig, out_dir: Path) -> tuple[EngineSource, Any, Any]:
    """For engines that load weights from a folder (vLLM): the model's folder, a checkpoint exported to one."""
    from vagen.models.registry import load_processing, model_folder

    config = spec.model_config
    assert config is not None, "local specs carry a model config"
    folder = model_folder(config["source"], config.get("path"), config.get("size"))
    if spec.checkpoint is not None:
        policy = load_local_policy(spec, "cpu")
        folder = export_for_vllm(spec, policy, out_dir / "_weights" / spec.label)
        del policy
    tokenizer, image_processor = load_processing("pretrained", config["modality"], path=str(folder))
    processor = image_processor if image_processor is not None else tokenizer
    return EngineSource(processor=processor, model_path=str(folder)), tokenizer, image_processor


# ---- one cell -------------------------------------------------------------------------------


def load_env_config(name: str, config_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """configs/env/<name>.yaml as a dict, with `env_overrides` merged into its kwargs."""
    path = Path(config_dir) / "env" / f"{name}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in (Path(config_dir) / "env").glob("*.yaml"))
        raise ValueError(f"env={name!r} is not an env config; use one of {names}.")
    env_cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    env_cfg["kwargs"] = {**env_cfg.get("kwargs", {}), **overrides}
    return env_cfg


def incompatibility(spec: ModelSpec, env_cfg: dict[str, Any]) -> str:
    """Why the model cannot play the env ("" when it can): a text-only model on image observations."""
    if spec.modality == "text" and "image" in str(env_cfg["kwargs"].get("observation", "text")):
        return "skipped: text-only model, image observations"
    return ""


def cell_settings(spec: ModelSpec, env_cfg: dict[str, Any], cfg: DictConfig) -> dict[str, Any]:
    """Everything that changes an episode's outcome, except the number of episodes (which may grow)."""
    settings = {
        "model": spec.identity,
        "env": env_cfg,
        "seed_offset": int(cfg.seed_offset),
        "system_prompt": cfg.system_prompt or DEFAULT_SYSTEM_PROMPT,
        "sampling": {
            "temperature": 0.0 if cfg.greedy else float(cfg.temperature),
            "top_p": float(cfg.top_p),
            "max_new_tokens": int(cfg.max_new_tokens),
        },
    }
    if int(cfg.samples_per_seed) > 1:  # which seed episode k plays (absent at 1, so older results still resume)
        settings["samples_per_seed"] = int(cfg.samples_per_seed)
    if spec.kind == "local":
        settings["engine"] = cfg.engine.name
        settings["max_context_tokens"] = int(cfg.max_context_tokens)
        settings["sampling"]["seed"] = int(cfg.seed)
    return settings


def _play_batch(
    agent: LocalAgent | ChatAgent, env_cfg: dict[str, Any], batch: list[tuple[int, int]]
) -> list[EpisodeResult]:
    """Play a batch of (index, seed); an unexpected failure is recorded on each of its episodes, the run goes on."""
    make = lambda: make_env(env_cfg["id"], **env_cfg["kwargs"])
    seeds = [seed for _, seed in batch]
    try:
        return agent.play(make, env_cfg["name"], [index for index, _ in batch], seeds)
    except Exception as error:  # recorded, and retried by the next run (retry_failed)
        logger.exception("A batch of %s failed; its episodes are recorded as failed.", env_cfg["name"])
        message = f"{type(error).__name__}: {error}"
        return [EpisodeResult(seed, None, end_reason="error", error=message) for seed in seeds]


def recorded_gif_episode(store: CellStore, record: dict[str, Any]) -> EpisodeRecord | None:
    """The GIF episode of a stored record, drawn from its recorded observations and images; None for a record
    without the state it ended in (it ended on an error, or was written before final states were kept)."""
    final = record.get("final_observation")
    if final is None:
        return None
    episodes = store.episode_path(record["index"], record["seed"]).parent
    users = [m for m in record["messages"] if m["role"] == "user"] + [final]
    observations = [(m["content"], [Image.open(episodes / p).convert("RGB") for p in m["images"]]) for m in users]
    responses = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    return recorded_episode(
        record["seed"], observations, responses, record["actions"], record["rewards"], record["success"]
    )


def result_gif_episode(result: EpisodeResult) -> EpisodeRecord:
    """The GIF episode of an `EpisodeResult` that was just played, drawn from its turns and final state."""
    if result.final_observation is None:
        raise ValueError(f"episode {result.seed} ended on an error ({result.error}); it has no final state to draw.")
    observations = [(t.observation, t.images) for t in result.turns] + [(result.final_observation, result.final_images)]
    return recorded_episode(
        result.seed,
        observations,
        [t.response for t in result.turns],
        [t.info.get("actions", []) for t in result.turns],
        [t.reward for t in result.turns],
        result.success,
    )


def write_gifs(store: CellStore, records: list[dict[str, Any]], cfg: DictConfig) -> None:
    """GIFs of the first `gif_episodes` episodes, drawn from their records (no env is stepped again); existing
    GIFs are kept."""
    for record in records[: int(cfg.gif_episodes)]:
        path = store.gif_path(record["index"], record["seed"])
        if path.exists() or not record["turns"]:
            continue
        episode = recorded_gif_episode(store, record)
        if episode is None:
            logger.warning("%s has no recorded final state; no GIF for it.", path.name)
            continue
        temp = path.with_name(f".tmp-{path.name}")
        save_episode_gif(episode, temp, seconds_per_frame=float(cfg.gif_seconds_per_frame))
        temp.replace(path)


def run_cell(
    spec: ModelSpec, env_cfg: dict[str, Any], cfg: DictConfig, out_dir: Path, get_agent: Callable[[], Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Play the cell's missing episodes, make its GIFs, and return its summary row and episode records."""
    store = CellStore(out_dir / spec.label / env_cfg["name"], spec.label, env_cfg["name"])
    note = incompatibility(spec, env_cfg)
    if note:
        logger.warning("%s on %s %s", spec.label, env_cfg["name"], note)
        return summarize_cell(spec.label, env_cfg["name"], [], note=note), []
    store.check_settings(cell_settings(spec, env_cfg, cfg))
    seeds = episode_seeds(cfg)
    pending = [(k, s) for k, s in enumerate(seeds) if not store.is_finished(k, s, bool(cfg.retry_failed))]
    if pending:
        logger.info("%s on %s: %d of %d episodes to play", spec.label, env_cfg["name"], len(pending), len(seeds))
        agent = get_agent()
        size = int(cfg.episodes_per_batch)
        for start in range(0, len(pending), size):
            batch = pending[start : start + size]
            results = _play_batch(agent, env_cfg, batch)
            for (index, _), result in zip(batch, results, strict=True):
                store.write(result, index)
    records = [store.load(k, s) for k, s in enumerate(seeds)]
    assert all(r is not None for r in records), "every episode was just written or already on disk"
    write_gifs(store, records, cfg)
    return summarize_cell(spec.label, env_cfg["name"], records), records


# ---- the whole benchmark --------------------------------------------------------------------


class _LazyAgent:
    """Builds the agent on first use: a re-run whose episodes are all on disk loads no model."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build, self._agent = build, None

    def get(self) -> Any:
        if self._agent is None:
            self._agent = self._build()
        return self._agent


def episode_seeds(cfg: DictConfig) -> list[int]:
    """The env seed of each episode: the evaluation seeds in order, each `samples_per_seed` times in a row."""
    samples = int(cfg.samples_per_seed)
    if samples < 1 or int(cfg.episodes) % samples:
        raise ValueError(
            f"samples_per_seed={samples} must be >= 1 and divide episodes={cfg.episodes} (episodes = seeds x samples"
            f"), e.g. episodes={max(samples, 1) * 128} samples_per_seed={samples} for 128 seeds."
        )
    return [seed for seed in eval_seeds(int(cfg.episodes) // samples, int(cfg.seed_offset)) for _ in range(samples)]


EVAL_MODES = ("play", "failures", "move_probe")


def check_mode(cfg: DictConfig) -> str:
    """`cfg.mode`, refused with the choices unless it is one of `EVAL_MODES`."""
    mode = cfg.get("mode", "play")
    if mode not in EVAL_MODES:
        raise ValueError(f"mode={mode!r} is not one of {', '.join(EVAL_MODES)}.")
    return str(mode)


def resolve_cells(cfg: DictConfig, config_dir: Path) -> tuple[list[ModelSpec], list[dict[str, Any]]]:
    """The rows (`model=`, with `model_overrides`) and columns (`env=`, with `env_overrides`) of `cfg`, resolved
    before any weights load; an unknown name raises ValueError naming the choices."""
    envs = [cfg.envs] if isinstance(cfg.envs, str) else list(cfg.envs)
    env_overrides = OmegaConf.to_container(cfg.env_overrides, resolve=True)
    env_cfgs = [load_env_config(str(name), config_dir, env_overrides) for name in envs]
    model_overrides = OmegaConf.to_container(cfg.model_overrides, resolve=True)
    return resolve_models(cfg.models, cfg.engine, config_dir, model_overrides), env_cfgs


def _check_config(cfg: DictConfig) -> None:
    check_mode(cfg)
    if int(cfg.episodes_per_batch) < 1 or int(cfg.gif_episodes) < 0:
        raise ValueError("episodes_per_batch must be >= 1 and gif_episodes >= 0.")
    if not cfg.envs:
        raise ValueError("env= names no environment; e.g. env=[sokoban_visual,frozenlake_visual].")
    if cfg.engine.name == "api":  # before config.yaml is written: a key given in the wrong place must not reach it
        check_api_key_env(cfg.engine.get("api_key_env"))
        check_base_url(cfg.engine.get("base_url"))


def evaluate(cfg: DictConfig, config_dir: Path) -> EvalReport:
    """Run the benchmark described by `cfg` (configs/evaluate.yaml); `config_dir` holds env/ and model/."""
    started = time.monotonic()
    _check_config(cfg)
    specs, env_cfgs = resolve_cells(cfg, config_dir)
    episode_seeds(cfg)  # validates episodes, seed_offset and samples_per_seed before anything loads
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config_text = OmegaConf.to_yaml(cfg, resolve=True)  # what ran: key variables by name, URLs without userinfo
    atomic_write_text(out_dir / "config.yaml", redact_secrets(config_text, cfg.engine.get("api_key_env")))
    rows, records = [], []
    for spec in specs:
        agent = _LazyAgent(lambda spec=spec: build_agent(spec, cfg, out_dir))
        for env_cfg in env_cfgs:
            row, cell_records = run_cell(spec, env_cfg, cfg, out_dir, agent.get)
            rows.append(row)
            records.append(cell_records)
        del agent  # free the model before the next one loads
        gc.collect()
    add_paired_changes(rows, records)
    files = write_summary(rows, out_dir, title=f"Evaluation {out_dir.name}: {cfg.episodes} episodes per env")
    if cfg.plot:
        title = f"Success over {cfg.episodes} episodes (95% Wilson CI)"
        files["png"] = plot_success(rows, out_dir / "success.png", title=title)
    return EvalReport(rows, out_dir, files, time.monotonic() - started)
