"""Benchmark models on environments:

    python scripts/evaluate.py model=[tiny_vl,solver,random] env=[sokoban_visual,frozenlake_visual] episodes=50
    python scripts/evaluate.py model=outputs/runs/<run> env=sokoban_visual       # a trained run (latest checkpoint)
    OPENAI_API_KEY=... python scripts/evaluate.py engine=api engine.base_url=https://api.openai.com/v1 \\
        engine.model=gpt-4o-mini env=[sokoban_visual]

Every option is in configs/evaluate.yaml (and configs/engine/); results go to outputs/eval/<name>/:
one JSON per episode, GIFs, summary.md / .csv / .json and success.png. Re-running resumes.
A user error ends with one `error:` line naming the fix (exit 2), Ctrl-C with exit 130, no traceback.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from vagen.eval import evaluate, rename_overrides

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@hydra.main(config_path="../configs", config_name="evaluate", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        report = evaluate(cfg, CONFIG_DIR)
    except ValueError as error:  # user errors (unknown model or env, damaged results folder): each names the fix
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # finished episodes are on disk: rerunning the command resumes
        print("Interrupted; finished episodes are saved, rerun the same command to resume.", file=sys.stderr)
        sys.exit(130)
    print(report.table())
    print(
        f"Results in {report.out_dir} ({', '.join(p.name for p in report.files.values())}); {report.wall_time_s:.1f} s"
    )


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *rename_overrides(sys.argv[1:])]
    main()
