"""Benchmark models on environments, say why their episodes fail, or probe their first moves:

    python scripts/evaluate.py model=[tiny_vl,solver,random] env=[sokoban_visual,frozenlake_visual] episodes=50
    python scripts/evaluate.py model=outputs/runs/<run> env=sokoban_visual       # a trained run (latest checkpoint)
    python scripts/evaluate.py mode=failures model=tiny_vl env=sokoban_visual episodes=64
    python scripts/evaluate.py mode=move_probe model=[tiny_vl,outputs/runs/<run>] env=sokoban_visual episodes=256
    OPENAI_API_KEY=... python scripts/evaluate.py engine=api engine.base_url=https://api.openai.com/v1 \\
        engine.model=gpt-4o-mini env=[sokoban_visual]

Every option is in configs/evaluate.yaml (and configs/engine/); results go to outputs/eval/<name>/:
one JSON per episode, GIFs, summary.md / .csv / .json and success.png (mode=failures adds failures.json,
mode=move_probe writes move_probe.json). Re-running resumes.
A user error ends with one `error:` line naming the fix (exit 2), Ctrl-C with exit 130, no traceback.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from vagen.eval import check_mode, evaluate, rename_overrides
from vagen.eval.failures import failure_reports
from vagen.eval.probe import probe_moves

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def run(cfg: DictConfig) -> list[str]:
    """The lines to print for `cfg.mode`."""
    if check_mode(cfg) == "move_probe":
        return probe_moves(cfg, CONFIG_DIR)[1]
    report = evaluate(cfg, CONFIG_DIR)
    files = ", ".join(p.name for p in report.files.values())
    lines = [report.table(), f"Results in {report.out_dir} ({files}); {report.wall_time_s:.1f} s"]
    if cfg.mode == "failures":
        lines += failure_reports(report.out_dir, report.rows)[1]
    return lines


@hydra.main(config_path="../configs", config_name="evaluate", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        lines = run(cfg)
    except (ValueError, NotImplementedError) as error:  # user errors (unknown model or env, damaged results
        print(f"error: {error}", file=sys.stderr)  # folder, a game the probe cannot score): each names the fix
        sys.exit(2)
    except KeyboardInterrupt:  # finished episodes are on disk: rerunning the command resumes
        print("Interrupted; finished episodes are saved, rerun the same command to resume.", file=sys.stderr)
        sys.exit(130)
    print("\n".join(lines))


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *rename_overrides(sys.argv[1:])]
    main()
