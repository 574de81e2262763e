"""Train a policy with StarPO: `python scripts/train.py env=sokoban_visual [overrides...]`.

Every option is in configs/ (train.yaml and its groups env/, model/, algorithm/, filter/, rollout/,
logger/); the run's config, metrics.jsonl, checkpoints and GIFs go to `run_dir`.
Every option is type- and range-checked before any model loads (vagen/trainer/config.py, OPTIONS). A configuration
or checkpoint problem, or training that turns non-finite (inf/NaN, stopped before the step that would write it),
ends with one line naming the cause and the fix (exit 2), and Ctrl-C with the last complete checkpoint (exit 130),
without a traceback.
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from vagen.trainer.config import check_overrides, tuned_line
from vagen.trainer.run import train

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base=None)
def main(cfg: DictConfig) -> None:
    tuned = tuned_line(CONFIG_DIR, HydraConfig.get().runtime.choices.get("tuned"), cfg)
    if tuned:
        print(tuned, flush=True)
    try:
        run_dir = train(cfg)
    except ValueError as error:  # user errors: every one says what to change
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # the trainer has already printed the last complete checkpoint
        sys.exit(130)
    print(f"Run folder: {run_dir}")


if __name__ == "__main__":
    try:
        check_overrides(CONFIG_DIR, "train", sys.argv[1:])  # a misspelt option fails here, with the right name
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    main()
