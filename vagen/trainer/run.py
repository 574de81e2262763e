"""A training run: resume, iterate, log, checkpoint, draw GIFs; Ctrl-C keeps the last checkpoint.

A run folder holds one run's history. Only `trainer.resume=auto` (or naming the folder's own latest checkpoint)
continues a folder that already holds checkpoints or metrics; a fresh run there is refused before any model loads.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vagen.logging import MetricsLogger, ProgressBar, read_metrics
from vagen.logging.sinks import METRICS_FILENAME
from vagen.rollout import Trajectory
from vagen.rollout.validation import change_text, paired_change
from vagen.trainer.checkpoint import is_disk_full, latest_checkpoint, verify_checkpoint
from vagen.trainer.lock import run_dir_lock
from vagen.trainer.starpo import StarPOTrainer, run_fingerprint
from vagen.viz.gif import recorded_episode, save_episode_gif


def resume_point(cfg: DictConfig) -> Path | None:
    """The checkpoint to continue from: `trainer.resume` = auto | never | a checkpoint folder."""
    resume = str(cfg.trainer.resume)
    if resume == "never":
        return None
    if resume == "auto":
        return latest_checkpoint(Path(cfg.run_dir))
    path = Path(resume)
    if not path.is_dir():
        raise ValueError(f"trainer.resume={resume!r} is not a folder; use auto, never, a run folder or a checkpoint.")
    if (path / "checkpoints").is_dir():  # a run folder: continue its latest complete checkpoint
        latest = latest_checkpoint(path)
        if latest is None:
            raise ValueError(f"trainer.resume={resume!r} is a run folder without a complete checkpoint.")
        return latest
    return path


def check_history(cfg: DictConfig, checkpoint: Path | None) -> None:
    """Refuse to start a second history in a used run folder: its checkpoints would outrank the new run's (the
    keep-N rotation deletes the new ones, a plain rerun resumes the old run) and the metrics would mix."""
    run_dir, resume = Path(cfg.run_dir), str(cfg.trainer.resume)
    if resume == "auto":
        return
    latest = latest_checkpoint(run_dir)
    metrics = run_dir / METRICS_FILENAME
    if latest is not None:
        if checkpoint is not None and checkpoint.resolve() == latest.resolve():
            return  # the folder's own latest checkpoint: the same as auto
        held = f"checkpoints up to {latest.name}"
    elif metrics.is_file() and metrics.stat().st_size > 0:
        held = f"the {METRICS_FILENAME} of a run that saved no checkpoint"
    else:
        return
    raise ValueError(
        f"run_dir={run_dir} already holds a run ({held}); trainer.resume={resume} would start another history in "
        "it, mixing the two runs' metrics and checkpoints. Fix: trainer.resume=auto to continue that run, or a "
        "new run_dir=... for a fresh one."
    )


def trained(cfg: DictConfig) -> StarPOTrainer:
    """The trainer of `cfg` restored from the last complete checkpoint in its run folder, in this process (whatever
    `trainer.workers` the run used: any worker count's checkpoint loads into one)."""
    path = latest_checkpoint(Path(cfg.run_dir))
    if path is None:
        raise ValueError(f"No complete checkpoint in {cfg.run_dir}; train first (scripts/train.py).")
    trainer = StarPOTrainer(OmegaConf.merge(cfg, {"trainer": {"workers": 1}}))
    trainer.restore(path)  # weights, optimizers, RNG, loop and diagnostic state
    return trainer


def save_sample_gifs(trajectories: list[Trajectory], folder: Path) -> list[Path]:
    """GIFs of sampled episodes, drawn from what their trajectories recorded (no env is stepped again)."""
    paths = []
    for index, t in enumerate(trajectories):
        states = [(turn.observation, turn.images) for turn in t.turns] + [(t.final_observation, t.final_images)]
        responses = [turn.response_text for turn in t.turns]
        actions = [turn.info.get("actions", []) for turn in t.turns]
        record = recorded_episode(t.seed, states, responses, actions, [turn.reward for turn in t.turns], t.success)
        paths.append(save_episode_gif(record, folder / f"episode{index}_seed{t.seed}.gif"))
    return paths


def save_segment_config(cfg: DictConfig, run_dir: Path, iteration: int) -> Path:
    """Write `run_dir/config.yaml`; a different config already there (an earlier segment of a resumed run) is kept
    as `config.until_iter_NNNNNN.yaml` (`-1`, `-2`, ... after it when several segments resumed at one iteration)."""
    path = run_dir / "config.yaml"
    text = OmegaConf.to_yaml(cfg, resolve=True)
    if path.exists() and path.read_text() != text:
        segment, number = run_dir / f"config.until_iter_{iteration:06d}.yaml", 0
        while segment.exists():
            number += 1
            segment = run_dir / f"config.until_iter_{iteration:06d}-{number}.yaml"
        os.replace(path, segment)
    path.write_text(text)
    return path


def _pairable(before: dict[int, float] | None, after: dict[int, float] | None) -> bool:
    """Whether two validations' outcomes by level share the 2 levels a paired change needs."""
    return bool(before and after and len(before.keys() & after.keys()) >= 2)


def _probe_text(val: dict[str, float]) -> str:
    return f"mass on optimal first moves {val['val/move_optimal_mass']:.3f}"


def held_out_line(
    first: dict[str, float],
    last: dict[str, float],
    trained_episodes: int,
    first_outcomes: dict[int, float] | None = None,
    last_outcomes: dict[int, float] | None = None,
    greedy: tuple[dict[int, float], dict[int, float]] | None = None,
) -> str:
    """`held-out success 34.8% -> 42.2% after 2,496 training episodes: +7.4 pts [+3.1, +11.7] paired over 256
    held-out levels; mass on optimal first moves 0.550 -> 0.601`, from two `val/` metric dicts. The change and its
    95% interval pair each held-out level's outcome before and after (where both validations played at least 2 of
    the same levels; each level's outcome is its success rate over `trainer.eval_samples` episodes); the probe's
    part is there where both have it. greedy: each level's greedy outcome before and after (`trainer.eval_greedy`),
    paired alike: `; greedy 40.6% -> 41.0%: +0.4 pts [-3.0, +3.8]`."""
    line = (
        f"held-out success {first['val/success']:.1%} -> {last['val/success']:.1%} "
        f"after {trained_episodes:,} training episodes"
    )
    if _pairable(first_outcomes, last_outcomes):
        mean, low, high, levels = paired_change(first_outcomes, last_outcomes)
        line += f": {change_text(mean, low, high)} paired over {levels} held-out levels"
        samples = round(last["val/episodes"] / len(last_outcomes))
        line += f" x {samples} samples" if samples > 1 else ""
    else:
        line += f" ({last['val/episodes']:.0f} held-out episodes)"
    if "val/move_optimal_mass" in first and "val/move_optimal_mass" in last:
        line += f"; {_probe_text(first)} -> {last['val/move_optimal_mass']:.3f}"
    if greedy and _pairable(*greedy):
        mean, low, high, _ = paired_change(*greedy)
        rates = [sum(outcomes.values()) / len(outcomes) for outcomes in greedy]
        line += f"; greedy {rates[0]:.1%} -> {rates[1]:.1%}: {change_text(mean, low, high)}"
    return line


def _validation_line(iteration: int, val: dict[str, float]) -> str:
    line = (
        f"iteration {iteration}: held-out success {val['val/success']:.1%} "
        f"[{val['val/success_ci_low']:.1%}, {val['val/success_ci_high']:.1%}], "
        f"format-ok {val['val/format_ok']:.1%}, turns {val['val/turns']:.2f} ({val['val/episodes']:.0f} episodes)"
    )
    if "val/greedy_success" in val:
        line += f", greedy {val['val/greedy_success']:.1%}"
    if "val/reading_exact" in val:  # the reading of the board, against the demonstration's (it can drift under RL)
        line += f", readings exact {val['val/reading_exact']:.1%}"
        line += f" (facts {val['val/reading_facts']:.1%})" if "val/reading_facts" in val else ""
    return f"{line}, {_probe_text(val)}" if "val/move_optimal_mass" in val else line


def _logged_validation(run_dir: Path, iteration: int) -> dict[str, float] | None:
    """The `val/` metrics logged at `iteration`, if it validated (its per-level outcomes are in its checkpoint)."""
    logged = [r for r in read_metrics(run_dir) if r.get("step") == iteration and "val/success" in r]
    return logged[-1] if logged else None


def _timed_validation(trainer: StarPOTrainer) -> dict[str, float]:
    start = time.perf_counter()
    val = trainer.validate()
    val["perf/val_s"] = time.perf_counter() - start
    return val


def _make_run_dir(run_dir: Path) -> bool:
    """Create `run_dir` (and its parents); return whether it was created."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run_dir={run_dir} is a file, not a folder. Fix: choose another run_dir=... (or move it).")
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"Cannot create run_dir={run_dir} ({error.strerror}). Fix: choose a run_dir=... in a folder you can "
            "write to."
        ) from error
    return created


def train(cfg: DictConfig) -> Path:
    """Run `cfg.trainer.iterations` iterations in `cfg.run_dir` (continuing a checkpoint if asked)."""
    run_dir = Path(cfg.run_dir)
    created = _make_run_dir(run_dir)
    try:
        with run_dir_lock(run_dir):  # before any model loads: a second run into this folder fails at once
            checkpoint = resume_point(cfg)  # reads the checkpoint markers: a damaged folder fails here too
            if checkpoint is not None:  # integrity and setup, before any model loads
                verify_checkpoint(checkpoint, run_fingerprint(cfg))
            check_history(cfg, checkpoint)
            if (run_dir / METRICS_FILENAME).is_file():
                read_metrics(run_dir)  # a damaged metrics line fails here, not after the model loaded
            trainer = StarPOTrainer(cfg)  # with trainer.workers > 1, its learner is a Ray group
            try:
                return _train_locked(trainer, cfg, checkpoint)
            except Exception as error:
                if isinstance(error, ValueError) or not is_disk_full(error):  # a ValueError already says it
                    raise
                last = latest_checkpoint(run_dir)
                raise ValueError(
                    f"No space left on the device while writing to {run_dir} ({error}); the last complete "
                    f"checkpoint {last or '(none)'} is intact. Fix: free disk space and rerun the command to resume."
                ) from error
            finally:
                trainer.close()
    except BaseException:
        if created and run_dir.is_dir() and not any(run_dir.iterdir()):  # a start that failed leaves no folder
            run_dir.rmdir()
        raise


def _train_locked(trainer: StarPOTrainer, cfg: DictConfig, checkpoint: Path | None) -> Path:
    run_dir = trainer.run_dir
    if checkpoint is not None:
        trainer.restore(checkpoint)
    save_segment_config(cfg, run_dir, trainer.iteration)
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
    validating, final_val = bool(every.eval_every), None
    try:
        if validating and trainer.iteration == 0 and trainer.iteration < total:
            trainer.initial_val = _timed_validation(trainer)
            trainer.initial_outcomes = trainer.val_outcomes
            logger.log(trainer.initial_val, step=0)
            progress.write(_validation_line(0, trainer.initial_val))
        while trainer.iteration < total:
            metrics = trainer.train_iteration()
            if validating and (trainer.iteration % every.eval_every == 0 or trainer.iteration == total):
                val = _timed_validation(trainer)
                metrics.update(val)
                progress.write(_validation_line(trainer.iteration, val))
                final_val = val
            logger.log(metrics, step=trainer.iteration)
            progress.update(metrics)
            if trainer.iteration % every.save_every == 0 or trainer.iteration == total:
                trainer.save(keep_last=every.keep_checkpoints)
            if every.viz_every and (trainer.iteration % every.viz_every == 0 or trainer.iteration == total):
                sample = trainer.last_trajectories[: every.viz_episodes]
                save_sample_gifs(sample, run_dir / "gifs" / f"iter_{trainer.iteration:06d}")
    except KeyboardInterrupt:
        last = latest_checkpoint(run_dir)
        # Printed even with the progress bar off: it is the one thing to know after Ctrl-C.
        print(f"Interrupted. Last complete checkpoint: {last or 'none'}; rerun the command to resume.", flush=True)
        raise
    finally:
        progress.close()
        logger.close()
    if final_val is None and validating and trainer.initial_val and trainer.iteration == total:  # a finished run rerun
        final_val = _logged_validation(run_dir, total)
    if final_val is not None and trainer.initial_val:
        played = trainer.iteration * cfg.trainer.groups * cfg.trainer.group_size
        greedy = trainer.greedy_history.get(0), trainer.greedy_history.get(trainer.iteration)
        line = held_out_line(
            trainer.initial_val,
            final_val,
            played,
            trainer.initial_outcomes,
            trainer.val_outcomes,
            greedy if all(greedy) else None,
        )
        print(line, flush=True)  # the line that says whether RL worked
    return run_dir
