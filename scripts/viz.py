"""Pictures: the figures of a training run, or one episode of a built-in policy as an annotated GIF.

    python scripts/viz.py run=outputs/runs/<run> [out=DIR]                # PNGs of training, filtering, diagnostics
    python scripts/viz.py mode=gif env=sokoban_visual policy=solver seed=3 [out=FILE.gif]

Every option is in configs/viz.yaml. mode=plot reads RUN/metrics.jsonl (and RUN/config.yaml for the title), writes
DIR/<figure>.png (default RUN/plots), prints each path and one note per figure left out for want of its metrics.
mode=gif prints the GIF's path and the episode's success and return. A model's own episodes are drawn by
scripts/evaluate.py (gif_episodes=k) and by training runs (trainer.viz_every), from their records.
A user error ends with one `error:` line naming the fix (exit 2), no traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from vagen.env import make_env
from vagen.eval.runner import result_gif_episode
from vagen.logging import read_metrics
from vagen.logging.sinks import METRICS_FILENAME
from vagen.rollout.chat import play_chat_episodes, policy_responder
from vagen.viz import save_episode_gif
from vagen.viz.plots import render_run, run_title

MODES = ("plot", "gif")


def plot(cfg: DictConfig) -> list[str]:
    if not cfg.run:
        raise ValueError("mode=plot needs run=, the folder scripts/train.py wrote, e.g. run=outputs/runs/<run>.")
    run_dir = Path(cfg.run)
    if not (run_dir / METRICS_FILENAME).is_file():
        raise ValueError(
            f"No {METRICS_FILENAME} in {run_dir}; pass the run folder that scripts/train.py wrote "
            "(its `run_dir`, e.g. run=outputs/runs/<env>-<model>-<algorithm>-seed<seed>)."
        )
    out = Path(cfg.out) if cfg.out else run_dir / "plots"
    paths, skipped = render_run(read_metrics(run_dir), out, run_title(run_dir))
    return [f"wrote {path}" for path in paths] + [f"note: {note}" for note in skipped]


def gif(cfg: DictConfig) -> list[str]:
    env_kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) if cfg.env.get("kwargs") else {}
    if cfg.max_turns is not None:
        env_kwargs["max_turns"] = int(cfg.max_turns)
    make = lambda: make_env(cfg.env.id, **env_kwargs)
    (result,) = play_chat_episodes(make, [int(cfg.seed)], policy_responder(cfg.policy), system_prompt=None)
    record = result_gif_episode(result)
    out = cfg.out or f"outputs/gifs/{cfg.env.name}_{cfg.policy}_seed{cfg.seed}.gif"
    path = save_episode_gif(record, out, seconds_per_frame=cfg.seconds_per_frame, scale=cfg.scale)
    return [
        f"GIF: {path} ({len(record.frames)} frames)",
        f"success: {record.success}  return: {record.total_reward:.2f}  turns: {len(record.rewards)}",
    ]


def run(cfg: DictConfig) -> list[str]:
    """The lines to print for `cfg.mode`."""
    if cfg.mode not in MODES:
        raise ValueError(f"mode={cfg.mode!r} is not one of {', '.join(MODES)}.")
    return plot(cfg) if cfg.mode == "plot" else gif(cfg)


@hydra.main(config_path="../configs", config_name="viz", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        lines = run(cfg)
    except ValueError as error:  # user errors: each says what to change
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
