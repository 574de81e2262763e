"""Learning evidence: success before and after StarPO training, over several seeds, per algorithm.

    python scripts/bench_learning.py [algorithms=grpo,starpo_s] [seeds=0,1,2] [eval_episodes=64] [hydra overrides...]

Each (algorithm, seed) trains from the same starting model in its own run folder under
outputs/bench_learning/, then plays `eval_episodes` held-out episodes (evaluation seeds 1e9 + k,
disjoint from training seeds) at temperature 0.5, as does the untrained model once. Prints a table
and the mean ± std of the change over seeds.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from vagen.engines import SamplingParams
from vagen.env import make_env
from vagen.eval.runner import eval_seeds
from vagen.rollout import RolloutSpec, collect_rollouts
from vagen.trainer.run import train, trained
from vagen.trainer.starpo import StarPOTrainer

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


def success_rate(trainer: StarPOTrainer, episodes: int, temperature: float = 0.5) -> float:
    """Held-out success of the trainer's current policy (one rollout per evaluation seed)."""
    env_cfg = trainer.cfg.env
    spec = RolloutSpec(
        group_seeds=eval_seeds(episodes),
        group_size=1,
        max_context_tokens=trainer.cfg.rollout.max_context_tokens,
        env_name=env_cfg.name,
    )
    sampling = SamplingParams(max_new_tokens=trainer.cfg.rollout.max_new_tokens, temperature=temperature, seed=1234)
    trajectories = collect_rollouts(
        lambda: make_env(env_cfg.id, **env_cfg.kwargs), trainer.engine, trainer.formatter, spec, sampling
    )
    return sum(t.success for t in trajectories) / len(trajectories)


def option(argv: list[str], name: str, default: str) -> str:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")), default)


def main(argv: list[str]) -> None:
    algorithms = option(argv, "algorithms", "grpo,starpo_s").split(",")
    seeds = [int(s) for s in option(argv, "seeds", "0,1,2").split(",")]
    episodes = int(option(argv, "eval_episodes", "64"))
    overrides = [a for a in argv if a.split("=", 1)[0] not in ("algorithms", "seeds", "eval_episodes")]

    def config(algorithm: str, seed: int):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            return compose(
                "train",
                overrides=[
                    f"algorithm={algorithm}",
                    f"seed={seed}",
                    "logger.wandb_mode=disabled",
                    "trainer.resume=never",
                    f"run_dir=outputs/bench_learning/{algorithm}-seed{seed}",
                    *overrides,
                ],
            )

    before = success_rate(StarPOTrainer(config(algorithms[0], seeds[0])), episodes)
    print(f"untrained policy: success {before:.3f} on {episodes} held-out episodes", flush=True)
    rows = []
    for algorithm in algorithms:
        for seed in seeds:
            cfg = config(algorithm, seed)
            train(cfg)
            after = success_rate(trained(cfg), episodes)
            rows.append((algorithm, seed, after))
            print(
                f"{algorithm:9s} seed {seed}: success {before:.3f} -> {after:.3f} ({after - before:+.3f})", flush=True
            )
    print("\n| algorithm | seeds | success before | success after (mean ± std) | change |\n|---|---|---|---|---|")
    for algorithm in algorithms:
        afters = [after for name, _, after in rows if name == algorithm]
        spread = statistics.stdev(afters) if len(afters) > 1 else 0.0
        print(
            f"| {algorithm} | {len(afters)} | {before:.3f} | {statistics.mean(afters):.3f} ± {spread:.3f} | "
            f"{statistics.mean(afters) - before:+.3f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
