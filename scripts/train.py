"""Train a policy with StarPO: `python scripts/train.py env=sokoban_visual [overrides...]`.

Every option is in configs/ (train.yaml and its groups env/, model/, algorithm/, filter/, rollout/,
logger/); the run's config, metrics.jsonl, checkpoints and GIFs go to `run_dir`.
"""

import hydra
from omegaconf import DictConfig

from vagen.trainer.run import train


@hydra.main(config_path="../configs", config_name="train", version_base=None)
def main(cfg: DictConfig) -> None:
    run_dir = train(cfg)
    print(f"Run folder: {run_dir}")


if __name__ == "__main__":
    main()
