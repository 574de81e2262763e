"""Play one episode with a built-in policy and save it as an annotated GIF.

    python scripts/render_gif.py env=sokoban_visual policy=solver seed=0

Prints the GIF's path and the episode's success and return.
"""

from __future__ import annotations

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from vagen.env import make_env
from vagen.viz import play_episode, save_episode_gif


@hydra.main(config_path="../configs", config_name="render_gif", version_base="1.3")
def main(cfg: DictConfig) -> None:
    env_kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) if cfg.env.get("kwargs") else {}
    env = make_env(cfg.env.id, **env_kwargs)
    record = play_episode(env, cfg.policy, seed=cfg.seed, max_turns=cfg.max_turns, rng=np.random.default_rng(cfg.seed))
    path = save_episode_gif(record, cfg.out, seconds_per_frame=cfg.seconds_per_frame, scale=cfg.scale)
    env.close()
    print(f"GIF: {path} ({len(record.frames)} frames)")
    print(f"success: {record.success}  return: {record.total_reward:.2f}  turns: {len(record.rewards)}")


if __name__ == "__main__":
    main()
