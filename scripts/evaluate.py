"""Benchmark models on environments:

    python scripts/evaluate.py model=[tiny_vl,solver,random] env=[sokoban_visual,frozenlake_visual] episodes=50
    python scripts/evaluate.py model=outputs/runs/<run> env=sokoban_visual       # a trained run (latest checkpoint)
    OPENAI_API_KEY=... python scripts/evaluate.py engine=api engine.base_url=https://api.openai.com/v1 \\
        engine.model=gpt-4o-mini env=[sokoban_visual]

Every option is in configs/evaluate.yaml (and configs/engine/); results go to outputs/eval/<name>/:
one JSON per episode, GIFs, summary.md / .csv / .json and success.png. Re-running resumes.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from vagen.eval import evaluate, rename_overrides

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@hydra.main(config_path="../configs", config_name="evaluate", version_base=None)
def main(cfg: DictConfig) -> None:
    report = evaluate(cfg, CONFIG_DIR)
    print(report.table())
    print(
        f"Results in {report.out_dir} ({', '.join(p.name for p in report.files.values())}); {report.wall_time_s:.1f} s"
    )


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *rename_overrides(sys.argv[1:])]
    main()
