"""A training run: resume, iterate, log, checkpoint, draw GIFs; Ctrl-C keeps the last checkpoint."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vagen.env import make_env
from vagen.logging import MetricsLogger, ProgressBar
from vagen.rollout import Trajectory
from vagen.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from vagen.trainer.starpo import StarPOTrainer
from vagen.viz.gif import replay_episode, save_episode_gif


def resume_point(cfg: DictConfig) -> Path | None:
    """The checkpoint to continue from: `trainer.resume` = auto | never | a checkpoint folder."""
    resume = str(cfg.trainer.resume)
    if resume == "never":
        return None
    if resume == "auto":
        return latest_checkpoint(Path(cfg.run_dir))
    path = Path(resume)
    if not path.is_dir():
        raise ValueError(f"trainer.resume={resume!r} is not a checkpoint folder; use auto, never or a folder path.")
    return path


def restore_checkpoint(trainer: StarPOTrainer, path: Path) -> StarPOTrainer:
    """Load a checkpoint into a freshly built trainer (weights, optimizers, RNG, loop and diagnostic state)."""
    state = load_checkpoint(
        path,
        modules=trainer.modules,
        optimizers=trainer.optimizers,
        schedulers=trainer.schedulers,
        fingerprint=trainer.fingerprint(),
    )
    trainer.load_state(state)
    return trainer


def trained(cfg: DictConfig) -> StarPOTrainer:
    """The trainer of `cfg` restored from the last complete checkpoint in its run folder."""
    path = latest_checkpoint(Path(cfg.run_dir))
    if path is None:
        raise ValueError(f"No complete checkpoint in {cfg.run_dir}; train first (scripts/train.py).")
    return restore_checkpoint(StarPOTrainer(cfg), path)


def save_sample_gifs(trajectories: list[Trajectory], cfg: DictConfig, folder: Path) -> list[Path]:
    """Replay sampled episodes (envs are deterministic per seed and responses) and write their GIFs."""
    paths = []
    for index, trajectory in enumerate(trajectories):
        env = make_env(cfg.env.id, **cfg.env.kwargs)
        record = replay_episode(env, [turn.response_text for turn in trajectory.turns], trajectory.seed)
        paths.append(save_episode_gif(record, folder / f"episode{index}_seed{trajectory.seed}.gif"))
    return paths


def train(cfg: DictConfig) -> Path:
    """Run `cfg.trainer.iterations` iterations in `cfg.run_dir` (continuing a checkpoint if asked)."""
    trainer = StarPOTrainer(cfg)
    run_dir = trainer.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = resume_point(cfg)
    if checkpoint is not None:
        restore_checkpoint(trainer, checkpoint)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    total, every = cfg.trainer.iterations, cfg.trainer
    logger = MetricsLogger(
        run_dir,
        wandb_mode=cfg.logger.wandb_mode,
        project=cfg.logger.project,
        run_name=cfg.logger.run_name or run_dir.name,
        config=trainer.config_dict(),
        resume=checkpoint is not None,
    )
    # Metrics logged after the checkpoint we resume from belong to iterations that will be redone.
    logger.truncate_after(trainer.iteration)
    progress = ProgressBar(total, initial=trainer.iteration, disable=not cfg.logger.progress)
    if checkpoint is not None:
        progress.write(f"Resumed from {checkpoint} at iteration {trainer.iteration}.")
    try:
        while trainer.iteration < total:
            metrics = trainer.train_iteration()
            logger.log(metrics, step=trainer.iteration)
            progress.update(metrics)
            if trainer.iteration % every.save_every == 0 or trainer.iteration == total:
                save_checkpoint(
                    run_dir,
                    trainer.iteration,
                    modules=trainer.modules,
                    optimizers=trainer.optimizers,
                    schedulers=trainer.schedulers,
                    state=trainer.state(),
                    keep_last=every.keep_checkpoints,
                    fingerprint=trainer.fingerprint(),
                )
            if every.viz_every and (trainer.iteration % every.viz_every == 0 or trainer.iteration == total):
                sample = trainer.last_trajectories[: every.viz_episodes]
                save_sample_gifs(sample, cfg, run_dir / "gifs" / f"iter_{trainer.iteration:06d}")
    except KeyboardInterrupt:
        last = latest_checkpoint(run_dir)
        progress.write(f"Interrupted. Last complete checkpoint: {last or 'none'}; rerun the command to resume.")
        raise
    finally:
        progress.close()
        logger.close()
    return run_dir
