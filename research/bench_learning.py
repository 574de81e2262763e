"""Learning curves in episodes: held-out success against training episodes, per arm and training seed, resumable.

    python research/bench_learning.py [arms=grpo,gigpo,starpo_s,gigpo_plr] [seeds=0,1,2] [episodes=10000]
                                     [eval_at=0,1000,2500,5000,10000] [eval_episodes=256] [jobs=1]
                                     [paired_samples=0] [paired_greedy=false] [out=outputs/bench_learning]
                                     [hydra overrides for scripts/train.py ...]

An arm is a named set of `scripts/train.py` overrides (`ARMS` below: the algorithm presets, GiGPO with prioritised
level replay, GRPO with the top-p filter); every other setting is the default's, plus the overrides given here. Each
(arm, seed) is one run in `out/<arm>-seed<seed>`. The budget is in episodes: an iteration plays trainer.groups ×
trainer.group_size episodes (64 by default), so `eval_at` = E becomes the iteration round(E / 64), and the runs are
validated there, and only there, on `eval_episodes` fixed held-out seeds (1e9 + k, never trained on; the trainer's
own validation with its first-move probe). Runs advance stage by stage (every run to 1,000 episodes, then every run
to 2,500, ...), `jobs` side by side on `cpu_threads / jobs` torch threads each.

Resume: rerun the same command. Each run checkpoints every iteration and continues its last complete checkpoint
(`trainer.resume=auto`), so a killed benchmark loses at most one iteration per run; a stage a run has validated is
never replayed. Prints, and writes to `out/summary.md`, a table per stage: each run's held-out success with its 95%
Wilson interval, and each arm's mean over seeds, its change from episode 0 with a 95% interval (the seeds' pooled
episodes against the shared start), and whether every seed gained. Draws `out/curves.png`: held-out success and the
first-move probe against episodes, one line per arm (mean over seeds, 95% band). With `paired_samples=k` > 0, once
every run has reached the last stage, `scripts/evaluate.py` replays the start and each run's last checkpoint k times
per held-out seed for a second, paired-by-level table (`vagen.eval.paired_change`). With `paired_greedy=true` it
also replays them once each, greedily: validation samples at T = 0.5, where a gain may be only the sharpening that
greedy decoding of the warm start already gives (docs/learning.md measures both).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

import vagen
from vagen.cli import script_options
from vagen.eval import CellStore, change_text, evaluate, paired_change, success_by_seed
from vagen.eval.runner import episode_seeds
from vagen.logging import read_metrics
from vagen.rollout.validation import Z_95, mean_interval
from vagen.viz.plots import new_figure, save_figure

ROOT = Path(__file__).resolve().parent.parent
COLOURS = ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:gray")
DEFAULTS = {
    "arms": "grpo,gigpo,starpo_s,gigpo_plr",
    "seeds": "0,1,2",
    "episodes": 10000,
    "eval_at": "0,1000,2500,5000,10000",
    "eval_episodes": 256,
    "jobs": 1,
    "paired_samples": 0,
    "paired_greedy": False,
    "out": "outputs/bench_learning",
}
# Every arm states its learning rate and GiGPO normalisation: the arms measured before the defaults became
# gigpo_meannorm's (2026-11-27) ran at the then defaults, lr 2e-5 and std normalisation, and keep meaning that.
LR_2E5, STD = "trainer.lr=2e-5", "algorithm.normalize_std=true"
# the defaults since 2026-11-27 (GiGPO, mean_norm, lr 1e-4), and the base of the arms that add to them
MEANNORM = ["algorithm=gigpo", "trainer.lr=1e-4", "algorithm.normalize_std=false"]
# the defaults with the vision tower fixed, and the base of the arms that add to it
FREEZE_VISION = [*MEANNORM, "trainer.freeze_vision=true"]
# the learning rate annealed linearly to 0 over the last quarter of the budget (the benchmark ends the decay at it)
ANNEAL = ["trainer.lr_schedule=linear", "trainer.lr_decay_start=0.75"]
ARMS = {
    "grpo": ["algorithm=grpo", LR_2E5],
    "gigpo": ["algorithm=gigpo", LR_2E5, STD],
    "starpo_s": ["algorithm=starpo_s", LR_2E5],
    "ppo": ["algorithm=ppo", LR_2E5],
    "gigpo_plr": ["algorithm=gigpo", LR_2E5, STD, "trainer.level_sampler=plr"],
    "grpo_plr": ["algorithm=grpo", LR_2E5, "trainer.level_sampler=plr"],
    "grpo_top_p": ["algorithm=grpo", LR_2E5, "filter=top_p"],
    "gigpo_lr1e-4": ["algorithm=gigpo", "trainer.lr=1e-4", STD],
    "gigpo_lr3e-4": ["algorithm=gigpo", "trainer.lr=3e-4", STD],
    # Sokoban only: a per-action potential-based reward from the solver's distance (dead ends priced), lr 1e-4
    "gigpo_shaped": ["algorithm=gigpo", "trainer.lr=1e-4", STD, "env.kwargs.distance_shaping=1.0"],
    # self-imitation: advantages clamped at 0, so no sampled text is pushed down (format cannot be unlearned that way)
    "gigpo_sil1e-4": ["algorithm=gigpo", "trainer.lr=1e-4", STD, "algorithm.advantage_min=0"],
    "gigpo_sil3e-4": ["algorithm=gigpo", "trainer.lr=3e-4", STD, "algorithm.advantage_min=0"],
    # no per-action cost: an all-fail group's spread is then 0 (no update), not "fewer moves" scaled to unit advantages
    "gigpo_nostep": ["algorithm=gigpo", "trainer.lr=1e-4", STD, "env.kwargs.step_penalty=0"],
    # GiGPO's mean_norm variant: advantages in reward units, not divided by the group's std, so groups weigh by their
    # reward spread: a solve/fail difference (10) outweighs a move-count difference (0.1 a move) about 100 times
    "gigpo_meannorm": MEANNORM,
    # the algorithm presets at the defaults' learning rate, for arms at equal episodes beside gigpo_meannorm
    "grpo_lr1e-4": ["algorithm=grpo", "trainer.lr=1e-4"],
    "starpo_s_lr1e-4": ["algorithm=starpo_s", "trainer.lr=1e-4"],
    # the defaults at the last learning rate of tiny_text's SFT (recipe 4's cosine ends at 2.5e-5)
    "gigpo_meannorm_lr2.5e-5": ["algorithm=gigpo", "trainer.lr=2.5e-5", "algorithm.normalize_std=false"],
    "gigpo_meannorm_lr3e-4": ["algorithm=gigpo", "trainer.lr=3e-4", "algorithm.normalize_std=false"],
    "gigpo_meannorm_lr1e-3": ["algorithm=gigpo", "trainer.lr=1e-3", "algorithm.normalize_std=false"],
    # a VAGEN-style reasoning reward: 0.5 × the share of an episode's turns whose <think> is the demonstration's
    # reading of the state (a solve is worth 1 in FrozenLake, 10 in Sokoban), so groups whose outcomes do not vary
    # still rank their readings
    "gigpo_meannorm_reason": [
        *MEANNORM,
        "++env.kwargs.reasoning_coef=0.5",  # ++: the text games' yamls (tiny_text's stamped recipe) lack it
    ],
    # the same reward, paid per fact (FrozenLake: the goal's direction and a hole or none on each side), so a reading
    # with one hole missed earns 4/5 where the exact match paid nothing
    "gigpo_meannorm_facts": [
        *MEANNORM,
        "++env.kwargs.reasoning_coef=0.5",
        "++env.kwargs.reasoning_credit=facts",
    ],
    # image games: the defaults with the vision tower fixed. At the shipped tiny_vl on sokoban_visual its block holds
    # about two thirds of the update's gradient noise and no measurable signal (research/grad_noise.py), and Adam
    # moves each of its weights by about lr per step whatever the signal, so they drift at random.
    "gigpo_meannorm_freeze_vision": FREEZE_VISION,
    # the vision-fixed arm with its <think> reading held in place: by a KL to the warm start, or by paying for the
    # demonstration's reading (as gigpo_meannorm_reason)
    "gigpo_meannorm_freeze_vision_kl": [*FREEZE_VISION, "algorithm.kl_coef=0.05"],
    "gigpo_meannorm_freeze_vision_reason": [*FREEZE_VISION, "++env.kwargs.reasoning_coef=0.5"],
    # the KL arm with the advantage on the answer's tokens only: the reward judges the moves, and the <think> reading
    # gets no policy gradient (it learns only as the answer's context), so the reading RL's noise drifts is left alone
    "gigpo_meannorm_freeze_vision_kl_answer": [
        *FREEZE_VISION,
        "algorithm.kl_coef=0.05",
        "algorithm.advantage_tokens=answer",
    ],
    # the vision-fixed arm held to the demonstrations by their own supervised loss instead of a KL to the warm start:
    # each step adds the mean log-loss of 16 solver demonstrations (algorithm.sft_coef, PPO-ptx)
    "gigpo_meannorm_freeze_vision_sft": [*FREEZE_VISION, "algorithm.sft_coef=1"],
    # the same loss on the solver's turn at the states the iteration's own rollouts reached, after their own dialogue
    # (algorithm.sft_source=visited, DAgger's labels) instead of the demonstrations' states
    "gigpo_meannorm_freeze_vision_dagger": [*FREEZE_VISION, "algorithm.sft_coef=1", "algorithm.sft_source=visited"],
    # the KL arm's KL for a policy without a vision tower (the text games' tiny_text): the defaults held to the warm
    # start, whose <think> reading RL otherwise drifts
    "gigpo_meannorm_kl": [*MEANNORM, "algorithm.kl_coef=0.05"],
    # the KL arm training low-rank adapters (LoRA r=8 on every linear layer of the language model) at 10x the lr
    # instead of all 3.35M weights: RL's few bits per episode fit a small update ("LoRA without regret", Schulman et
    # al. 2025: LoRA matches full training in RL, at about 10x its lr), and Adam no longer moves millions of
    # coordinates by about lr per step on noise alone; the KL reference is the base with the adapters off
    "gigpo_meannorm_freeze_vision_kl_lora": [
        "algorithm=gigpo",
        "trainer.lr=1e-3",
        "algorithm.normalize_std=false",
        "trainer.freeze_vision=true",
        "algorithm.kl_coef=0.05",
        "trainer.lora.enabled=true",
        "trainer.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    ],
    # the KL arm with its new levels kept most at the solver distances where its success is nearest 50%
    "gigpo_meannorm_freeze_vision_kl_frontier": [
        *FREEZE_VISION,
        "algorithm.kl_coef=0.05",
        "trainer.level_sampler=frontier",
    ],
    # Sokoban only: the KL arm with the solver-distance reward at half weight (each action earns 0.5 x the drop in the
    # distance to the solution, so a push into a dead end costs about what a solve earns): its held-out failures are
    # a right reading and then a push into a wall in turn 1 or 2, which the solve reward prices only at the end.
    # gigpo_shaped (no KL, std normalisation) was flat to 4,992 episodes, where the KL arm was flat too and rose later
    "gigpo_meannorm_freeze_vision_kl_shaped": [
        *FREEZE_VISION,
        "algorithm.kl_coef=0.05",
        "env.kwargs.distance_shaping=0.5",
    ],
    # the KL arm with the same 64 episodes per iteration as 4 levels x 16 rollouts instead of 8 x 8: fewer groups
    # whose episodes all end alike (a level solved 90% of the time gives no spread in 8 rollouts 43% of the time, in 16
    # rollouts 19%), a closer baseline per level, and larger step groups for GiGPO's turns (RAGEN uses 16 per group)
    "gigpo_meannorm_freeze_vision_kl_g16": [
        *FREEZE_VISION,
        "algorithm.kl_coef=0.05",
        "trainer.groups=4",
        "trainer.group_size=16",
    ],
    # the KL arm's settings with a critic instead of group baselines: PPO with VAGEN's bi-level GAE (turn-level GAE at
    # gamma_turn across turns, token-level inside each), whitened advantages, the critic started at the first batch's
    # mean return (since 2026-11-30: from a zero head it explained 2% of the returns' variance after 12 iterations, 37%
    # with the start). RAGEN found PPO steadier than GRPO on Sokoban
    "bilevel_gae_freeze_vision_kl": [
        "algorithm=ppo",
        "algorithm.advantage=bilevel_gae",
        "trainer.lr=1e-4",
        "trainer.freeze_vision=true",
        "algorithm.kl_coef=0.05",
    ],
    # the KL arm with its learning rate annealed linearly to 0 over the last quarter of the budget (the benchmark ends
    # the decay at its budget; at 9,984 episodes iterations 117-156): before that it trains as the KL arm.
    # Annealing the KL arm's last 3,400 of 14,976 episodes gained +2.7 points paired (docs/learning.md)
    "gigpo_meannorm_freeze_vision_kl_anneal": [*FREEZE_VISION, "algorithm.kl_coef=0.05", *ANNEAL],
    # the defaults with the same anneal (FrozenLake's best arm at 9,984 episodes is the defaults, not the KL arm)
    "gigpo_meannorm_anneal": [*MEANNORM, *ANNEAL],
    # frozenlake_visual's default since 2026-12-07: the anneal with GiGPO's step returns undiscounted across turns
    "gigpo_meannorm_anneal_gamma1": [*MEANNORM, *ANNEAL, "algorithm.gamma_turn=1.0"],
    # the defaults' learning rate decayed linearly from twice its value to 0 over the whole budget (the same mean lr,
    # 1e-4): FrozenLake's curve levels off by 5,000 episodes at the constant lr and its last-quarter anneal adds +2;
    # a decay over the whole run spends the larger steps early and the noise-averaging small ones longer
    "gigpo_meannorm_lr2e-4_decay": [
        "algorithm=gigpo",
        "trainer.lr=2e-4",
        "algorithm.normalize_std=false",
        "trainer.lr_schedule=linear",
        "trainer.lr_decay_start=0",
    ],
    # FrozenLake's default (the anneal) with two passes over each batch instead of one: four optimizer steps per
    # 64 episodes instead of two, the second pass clipped against the rollout's log-probs: each episode of the budget
    # is trained on twice (PPO's own data reuse; every arm above makes one pass)
    "gigpo_meannorm_anneal_e2": [*MEANNORM, *ANNEAL, "trainer.ppo_epochs=2"],
    # the defaults trained at the validation's temperature: the update then raises the success of the very policy that
    # is measured (softmax(logits / 0.5)), not of the T=1 policy, whose first gain, sharpening, T=0.5 already has
    "gigpo_meannorm_t0.5": [*MEANNORM, "rollout.temperature=0.5"],
    "gigpo_meannorm_plr": [*MEANNORM, "trainer.level_sampler=plr"],
    # FrozenLake's best arm (the anneal) with prioritised level replay: its curve stops at about 5,000 episodes as the
    # groups whose 8 episodes agree rise from 4 to 5.4 of 8; replaying the levels whose groups varied keeps signal
    "gigpo_meannorm_anneal_plr": [*MEANNORM, *ANNEAL, "trainer.level_sampler=plr"],
    # new levels kept most at the solver distances where the policy's success is nearest 50% (levels.FrontierSampler)
    "gigpo_meannorm_frontier": [*MEANNORM, "trainer.level_sampler=frontier"],
    # RAGEN's SNR filter with the defaults: roll 8 groups out, train on the smallest set of highest-spread groups that
    # holds 90% of the spread (at equal rollouts with gigpo_meannorm_plr, which chooses the levels before rolling out)
    "gigpo_meannorm_top_p": [*MEANNORM, "filter=top_p"],
    # Sokoban only: per-turn credit from the solver's distance (potential-based shaping, c = 1) with no discount, so a
    # turn answers for what its own moves did to the distance to the solution (r + V*(s') − V*(s) with V* = −distance),
    # not for the later turns' luck, against the group's turns at the same index (grpo_turn)
    "grpo_turn_shaped": [
        "algorithm=grpo",
        "algorithm.advantage=grpo_turn",
        "algorithm.gamma_turn=0",
        "trainer.lr=1e-4",
        "env.kwargs.distance_shaping=1.0",
    ],
    # Sokoban only: the same with a discount of 0.5 per turn, so a turn also answers for the later turns' rewards,
    # the solve's included, halved per turn: a move left out costs the turn part of the solve it delays past the budget
    "grpo_turn_shaped_g0.5": [
        "algorithm=grpo",
        "algorithm.advantage=grpo_turn",
        "algorithm.gamma_turn=0.5",
        "trainer.lr=1e-4",
        "env.kwargs.distance_shaping=1.0",
    ],
    # Sokoban only: the move cost charged at the solve (none on a failure): all-success groups still rank solutions by
    # length, all-fail groups no longer rank attempts by how little they moved
    "gigpo_solvecost": ["algorithm=gigpo", "trainer.lr=1e-4", STD, "++env.kwargs.step_penalty_on_solve=true"],
}


def training_overrides(
    arm: str, seed: int, run_dir: Path, iterations: int, horizon: int, episodes: int, extra: list[str]
) -> list[str]:
    """The `scripts/train.py` overrides of one run up to `iterations` of a budget of `horizon` iterations: the arm and
    seed, plus only what a benchmark must set (validation size and place, a checkpoint each iteration, resume, quiet
    logging, the budget as the end of a learning-rate decay); these win over `extra`."""
    return [
        "~tuned",  # an arm is its overrides on train.yaml's base, whatever configs/tuned/ holds at the time
        *ARMS[arm],
        *extra,
        f"seed={seed}",
        f"trainer.iterations={iterations}",
        f"trainer.lr_decay_end={horizon}",  # a run goes stage by stage; a decaying schedule spans the whole budget
        f"trainer.eval_episodes={episodes}",
        "trainer.eval_every=1000000000",  # validate at iteration 0 and at the stage's end only
        "trainer.save_every=1",
        "trainer.keep_checkpoints=1",
        "trainer.resume=auto",
        "trainer.viz_every=0",
        "logger.wandb_mode=disabled",
        "logger.progress=false",
        f"run_dir={run_dir}",
    ]


def validated_at(run_dir: Path) -> dict[int, dict]:
    """The run's validations by iteration (the last logged one wins: a resumed iteration replaces its record)."""
    if not (run_dir / "metrics.jsonl").exists():
        return {}
    return {int(r["step"]): r for r in read_metrics(run_dir) if "val/success" in r}


def train_run(
    arm: str, seed: int, run_dir: Path, iterations: int, horizon: int, episodes: int, threads: int, extra: list[str]
) -> None:
    """Bring one run to `iterations` of `horizon` (validated there) in a subprocess on its own torch threads; log to
    train.out."""
    if iterations in validated_at(run_dir):
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(ROOT / "scripts" / "train.py")]
    command += training_overrides(arm, seed, run_dir, iterations, horizon, episodes, extra)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(run_dir / "train.out", "a") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=True, cwd=ROOT)


def episodes_per_iteration(extra: list[str]) -> int:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("train", overrides=extra)
    return int(cfg.trainer.groups) * int(cfg.trainer.group_size)


def arm_change(before: dict, afters: list[dict]) -> tuple[float, float, float, float]:
    """Mean held-out success over seeds, and its change from the shared start with a 95% interval: the seeds'
    pooled levels (n·S) against the start's n (normal approximation of two proportions). It counts levels, not
    episodes: with trainer.eval_samples=k a level's k samples are not independent (runs before `val/levels` was
    logged played one sample per level)."""

    def levels(record: dict) -> float:
        return record.get("val/levels", record["val/episodes"])

    n_before = levels(before)
    p_before = before["val/success"]
    pooled = sum(r["val/success"] * levels(r) for r in afters) / sum(levels(r) for r in afters)
    n_after = sum(levels(r) for r in afters)
    half = Z_95 * math.sqrt(p_before * (1 - p_before) / n_before + pooled * (1 - pooled) / n_after)
    change = pooled - p_before
    return pooled, change, change - half, change + half


def cell(record: dict) -> str:
    return f"{record['val/success']:.1%} [{record['val/success_ci_low']:.1%}, {record['val/success_ci_high']:.1%}]"


def summary(runs: dict[tuple[str, int], Path], stages: list[int], per_iteration: int) -> str:
    """One table per reached stage: each run's held-out success; each arm's mean, change and interval."""
    lines = []
    for iteration in stages:
        validated = {key: validated_at(run_dir) for key, run_dir in runs.items()}
        if not all(iteration in v for v in validated.values()):
            continue
        minutes = {
            key: sum(r.get("perf/iteration_s", 0.0) for r in read_metrics(d) if r["step"] <= iteration) / 60
            for key, d in runs.items()
        }
        lines += [
            f"### {iteration * per_iteration} episodes (iteration {iteration})",
            "",
            "| arm | seed | held-out success [95% CI] | greedy | first-move mass | readings exact | training minutes |",
            "|---|---|---|---|---|---|---|",
        ]
        for (arm, seed), v in validated.items():
            mass = v[iteration].get("val/move_optimal_mass", float("nan"))
            reading = v[iteration].get("val/reading_exact", float("nan"))  # absent in runs before 2026-11-28
            greedy = v[iteration].get("val/greedy_success", float("nan"))  # trainer.eval_greedy, since 2026-12-04
            lines.append(
                f"| {arm} | {seed} | {cell(v[iteration])} | {greedy:.1%} | {mass:.3f} | {reading:.1%} | "
                f"{minutes[arm, seed]:.1f} |"
            )
        if iteration > 0:
            lines += [
                "",
                "| arm | seeds | mean success | change [95% CI] | every seed positive |",
                "|---|---|---|---|---|",
            ]
            for arm in dict.fromkeys(a for a, _ in runs):
                keys = [k for k in runs if k[0] == arm]
                before = validated[keys[0]][0]
                afters = [validated[k][iteration] for k in keys]
                mean, change, low, high = arm_change(before, afters)
                positive = all(validated[k][iteration]["val/success"] > validated[k][0]["val/success"] for k in keys)
                lines.append(
                    f"| {arm} | {len(keys)} | {mean:.1%} | {change_text(change, low, high)} | "
                    f"{'yes' if positive else 'no'} |"
                )
        lines.append("")
    return "\n".join(lines)


def mean_band(records: list[dict], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in records if key in r]
    if len(values) == 1 and key == "val/success":
        return values[0], records[0]["val/success_ci_low"], records[0]["val/success_ci_high"]
    return mean_interval(values)


def plot_curves(runs: dict[tuple[str, int], Path], per_iteration: int, path: Path) -> Path:
    """Held-out success and first-move mass against training episodes: per arm the mean over seeds at every
    iteration all its seeds validated, with a 95% band (over seeds; a single seed's Wilson interval)."""
    figure = new_figure(12, 4.5)
    success_ax, probe_ax = figure.subplots(1, 2)
    for index, arm in enumerate(dict.fromkeys(a for a, _ in runs)):
        colour = COLOURS[index % len(COLOURS)]
        validated = [validated_at(d) for (a, _), d in runs.items() if a == arm]
        common = sorted(set.intersection(*(set(v) for v in validated)))
        if not common:
            continue
        episodes = [i * per_iteration for i in common]
        for ax, key in ((success_ax, "val/success"), (probe_ax, "val/move_optimal_mass")):
            if not all(key in v[i] for v in validated for i in common):
                continue
            bands = [mean_band([v[i] for v in validated], key) for i in common]
            ax.fill_between(episodes, [b[1] for b in bands], [b[2] for b in bands], color=colour, alpha=0.15, lw=0)
            label = f"{arm} ({len(validated)} seed{'s' if len(validated) > 1 else ''})"
            ax.plot(episodes, [b[0] for b in bands], color=colour, marker="o", markersize=4, label=label)
    success_ax.set_ylabel("held-out success (mean over seeds, 95% band)")
    probe_ax.set_ylabel("mass on optimal first moves (probe)")
    for ax in (success_ax, probe_ax):
        ax.set_xlabel("training episodes")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    success_ax.set_title("Held-out success against training episodes", loc="left")
    return save_figure(figure, path)


def paired_config(
    runs: dict[tuple[str, int], Path], samples: int, seeds: int, out_dir: Path, greedy: bool = False
) -> DictConfig:
    """The scripts/evaluate.py config that plays the runs' warm start (their `model` config, entry first) and each
    run's last checkpoint `samples` times on each of the validation's first `seeds` seeds, with the runs' env and
    the validation's sampling (`trainer.eval_temperature`, `rollout.max_new_tokens`); greedy: once, greedily."""
    samples = 1 if greedy else samples
    run_configs = {run_dir: OmegaConf.load(run_dir / "config.yaml") for run_dir in runs.values()}
    first = next(iter(run_configs.values()))
    for run_dir, run_config in run_configs.items():
        if run_config.env != first.env or run_config.model != first.model:
            raise ValueError(f"{run_dir} trained another env or model than the other runs; they share one warm start.")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("evaluate", overrides=[f"out_dir={out_dir}", "plot=false", f"samples_per_seed={samples}"])
    temperature = 0.0 if greedy else float(first.trainer.eval_temperature)
    cfg.models = [str(first.model.name), *(str(run_dir) for run_dir in runs.values())]
    cfg.model_overrides = first.model  # the warm start exactly as trained (model.path=..., dtype, ...)
    cfg.envs = [str(first.env.name)]
    cfg.env_overrides = first.env.kwargs
    cfg.episodes = seeds * samples
    cfg.episodes_per_batch = max(int(cfg.episodes_per_batch), samples)  # a seed's samples never share a stream
    cfg.temperature, cfg.greedy = temperature, temperature == 0.0  # validation's 0 means greedy
    cfg.max_new_tokens = first.rollout.max_new_tokens
    cfg.max_context_tokens = first.rollout.max_context_tokens
    return cfg


def cell_success(cfg: DictConfig, label: str) -> dict[int, float]:
    """Each evaluation seed's success rate over its samples in the evaluate cell (label, the only env)."""
    env = str(cfg.envs[0])
    store = CellStore(Path(cfg.out_dir) / label / env, label, env)
    return success_by_seed([store.load(index, seed) for index, seed in enumerate(episode_seeds(cfg))])


def paired_summary(
    runs: dict[tuple[str, int], Path], samples: int, seeds: int, out_dir: Path, greedy: bool = False
) -> str:
    """Evaluate the warm start and every run `samples` times per seed (greedy: once each, greedily); the table of
    changes paired by level."""
    shutil.rmtree(out_dir, ignore_errors=True)  # the runs were just retrained: old episodes are not theirs
    cfg = paired_config(runs, samples, seeds, out_dir, greedy)
    base_row, *run_rows = evaluate(cfg, ROOT / "configs").rows
    before = cell_success(cfg, base_row["model"])
    plays = "greedy decoding, once each" if greedy else f"{samples} samples each"
    start = cfg.model_overrides.get("path") or base_row["model"]  # a model.path start is not its config's model
    lines = [
        f"Paired re-measurement: {seeds} held-out seeds x {plays}, warm start "
        f"{base_row['success']:.1%} ({start}, `{out_dir}`).",
        "",
        "| arm | seed | after | paired change [95% CI] |",
        "|---|---|---|---|",
    ]
    after_by_algorithm: dict[str, list[dict[int, float]]] = {}
    lows: dict[str, list[float]] = {}
    for (algorithm, seed), row in zip(runs, run_rows, strict=True):
        after = cell_success(cfg, row["model"])
        mean, low, high, _ = paired_change(before, after)
        after_by_algorithm.setdefault(algorithm, []).append(after)
        lows.setdefault(algorithm, []).append(low)
        lines.append(f"| {algorithm} | {seed} | {row['success']:.1%} | {change_text(mean, low, high)} |")
    lines += [
        "",
        "| arm | training seeds | mean change [95% CI] | measurable gain | every run's interval above 0 |",
        "|---|---|---|---|---|",
    ]
    for algorithm, afters in after_by_algorithm.items():
        # The mean run's per-level success against the one shared warm start, so its noise is counted once.
        mean_after = {seed: statistics.mean(after[seed] for after in afters) for seed in afters[0]}
        mean, low, high, _ = paired_change(before, mean_after)
        lines.append(
            f"| {algorithm} | {len(afters)} | {change_text(mean, low, high)} | {'yes' if low > 0 else 'no'} | "
            f"{'yes' if all(v > 0 for v in lows[algorithm]) else 'no'} |"
        )
    return "\n".join(lines)


def check_checkout() -> None:
    """The runs (`scripts/train.py` of this checkout) and the paired replays must train and play with this checkout's
    vagen. Run from a git worktree, Python finds the editable install instead (another checkout's code) unless told."""
    imported = Path(vagen.__file__).resolve().parent.parent
    if imported != ROOT:
        raise SystemExit(
            f"This checkout ({ROOT}) would train with the vagen of {imported} (the editable install). "
            f"Run it as `PYTHONPATH={ROOT} python research/bench_learning.py ...`."
        )


def main(argv: list[str]) -> None:
    check_checkout()
    options, overrides = script_options(argv, DEFAULTS)
    arms = options.arms.split(",")
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        raise SystemExit(f"Unknown arms {unknown}; valid: {sorted(ARMS)}.")
    seeds = [int(s) for s in options.seeds.split(",")]
    budget, episodes, jobs, paired_samples = (
        options.episodes,
        options.eval_episodes,
        options.jobs,
        options.paired_samples,
    )
    eval_at = [int(e) for e in options.eval_at.split(",")]
    if paired_samples < 0:
        raise SystemExit(f"paired_samples={paired_samples} must be >= 0 (0 skips the paired re-measurement).")
    out = Path(options.out).resolve()
    per_iteration = episodes_per_iteration(overrides)
    stages = sorted({max(1, round(e / per_iteration)) for e in eval_at if 0 < e <= budget})
    horizon = max(1, round(budget / per_iteration))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    runs = {(arm, seed): out / f"{arm}-seed{seed}" for arm in arms for seed in seeds}
    print(f"{len(runs)} runs, stages at {[i * per_iteration for i in stages]} episodes; {out}", flush=True)
    for iteration in stages:
        with ThreadPoolExecutor(jobs) as pool:
            futures = [
                pool.submit(train_run, arm, seed, run_dir, iteration, horizon, episodes, threads, overrides)
                for (arm, seed), run_dir in runs.items()
            ]
            for future in futures:
                future.result()
        table = summary(runs, [0, *stages], per_iteration)
        (out / "summary.md").write_text(table + "\n")
        print(table, flush=True)
        print(f"curves: {plot_curves(runs, per_iteration, out / 'curves.png')}", flush=True)
    tables = [table]
    if paired_samples > 0:
        tables.append(paired_summary(runs, paired_samples, episodes, out / "paired"))
    if options.paired_greedy:
        tables.append(paired_summary(runs, 1, episodes, out / "paired_greedy", greedy=True))
    if len(tables) > 1:
        (out / "summary.md").write_text("\n\n".join(tables) + "\n")
        print("\n" + "\n\n".join(tables[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
