"""Is one update's gradient more signal than noise? `python research/grad_noise.py env=sokoban_visual [train options]`.

Measures the gradient noise scale (McCandlish et al. 2018) of the update `scripts/train.py` would make with the same
options, at the model's weights (`model=`, or `model.source=pretrained model.path=<folder>`): the critical batch in
prompt groups (where the step's signal and noise are equal) and the signal fraction of a step of `trainer.groups`
groups, for all weights and for the vision tower and the language model apart (`noise.split_tokens=true`: also for
the loss on the `<think>` tokens alone and on the answer tokens alone). Options: configs/grad_noise.yaml (`noise:`)
and everything of train.yaml.
"""

import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from vagen.trainer.config import check_overrides
from vagen.trainer.gradient_noise import measure_gradient_noise
from vagen.trainer.starpo import StarPOTrainer

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


def report_lines(result: dict) -> list[str]:
    lines = [
        f"{result['groups']} groups x {result['group_size']} rollouts: success {result['success']:.1%}, "
        f"{result['groups_with_reward_spread']} groups with reward spread",
        f"{'weights':10s} {'|G|^2 (se)':>22s} {'tr Cov':>10s} {'critical batch':>16s} "
        f"{'signal at ' + str(result['batch_groups']) + ' groups':>20s} {'halves cos':>11s}",
    ]
    for name, n in result["blocks"].items():
        critical = f"{n['critical_groups']:.3g} groups" if n["critical_groups"] != float("inf") else "no signal"
        lines.append(
            f"{name:10s} {n['signal_sq']:>11.3g} ({n['signal_sq_se']:.2g}) {n['noise_trace']:>10.3g} "
            f"{critical:>16s} {n['signal_fraction']:>20.1%} {n['halves_cosine']:>11.3f}"
        )
    for name, n in result.get("token_classes", {}).items():
        critical = f"{n['critical_groups']:.3g} groups" if n["critical_groups"] != float("inf") else "no signal"
        lines.append(
            f"loss on the {name} tokens only ({n['tokens_per_episode']:.1f} per episode, mean -log p "
            f"{n['neg_logprob_mean']:.3f}): |G|^2 {n['signal_sq']:.3g} ({n['signal_sq_se']:.2g}), "
            f"tr Cov {n['noise_trace']:.3g}, critical batch {critical}"
        )
    return lines


def measure(cfg: DictConfig) -> dict:
    if cfg.trainer.workers != 1:
        raise ValueError("grad_noise measures one process's gradient: leave trainer.workers=1.")
    trainer = StarPOTrainer(cfg)
    seeds = list(range(cfg.noise.first_seed, cfg.noise.first_seed + cfg.noise.groups))
    result = measure_gradient_noise(
        trainer.learner,
        trainer.sampling(),
        seeds,
        cfg.noise.folds,
        progress=lambda line: print(line, flush=True),
        split_tokens=cfg.noise.split_tokens,
    )
    trainer.close()
    return result


def main(argv: list[str]) -> None:
    check_overrides(CONFIG_DIR, "grad_noise", argv)  # a misspelt option fails here, with the right name
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("grad_noise", overrides=argv)
    result = measure(cfg)
    print("\n".join(report_lines(result)))
    if cfg.noise.out is not None:
        Path(cfg.noise.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as error:  # user errors: every one says what to change
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
