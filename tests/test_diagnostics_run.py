"""A 2-iteration StarPO-S run on a warm tiny VLM logs every filtering, MI and Echo Trap metric, and plots."""

import math
from pathlib import Path

from hydra import compose, initialize_config_dir

from vagen.logging import read_metrics
from vagen.trainer.run import train
from vagen.viz.plots import render_run

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")
MI_KEYS = [
    "retrieval_acc",
    "retrieval_chance",
    "recall@2",
    "recall@2_chance",
    "recall@4",
    "recall@4_chance",
    "recall@8",
    "recall@8_chance",
    "mi_est",
    "mi_seq_est",
    "mi_upper_bound",
    "mi_zscore",
    "mi_zscore_ema",
    "h_cond_est",
    "h_marg_est",
]
FILTER_KEYS = [
    "kept_count",
    "kept_ratio",
    "zero_spread_count",
    "reward_std_mean",
    "reward_std_std",
    "reward_std_ratio",
    "chosen_reward_mean",
    "chosen_reward_std",
]
ECHO_KEYS = ["reward_std_falling", "entropy_falling", "grad_norm_spike", "echo_trap"]


def test_starpo_s_run_logs_every_diagnostic(tmp_path):
    overrides = [
        "env=sokoban_visual",
        "model=tiny_vl_warm_test",
        "algorithm=starpo_s",
        "trainer.iterations=2",
        "trainer.groups=10",
        "trainer.group_size=2",
        "trainer.mini_batch_size=20",
        "trainer.micro_batch_size=10",
        "env.kwargs.max_turns=2",
        "rollout.max_new_tokens=40",
        "diagnostics.compute_freq=1",
        "diagnostics.max_prompts=10",
        "filter.empty_policy=keep_all",
        "logger.wandb_mode=disabled",
        "logger.progress=false",
        "trainer.viz_every=0",
        "trainer.eval_every=0",
        f"run_dir={tmp_path / 'run'}",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        run_dir = train(compose("train", overrides=overrides))
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        required = [f"filter/{k}" for k in FILTER_KEYS] + [f"echo/{k}" for k in ECHO_KEYS]
        for scope in ("first_turn", "trajectory"):
            required += [f"mi/{scope}/{k}" for k in MI_KEYS]
        required += [
            "mi/visual_retrieval_acc",
            "mi/visual_mi_est",
            "mi/blank_drop",
            "mi/regime",
            "mi/mi_threshold",
            "mi/h_threshold",
            "perf/mi_s",
        ]
        missing = [k for k in required if k not in record]
        assert not missing, missing
        assert all(math.isfinite(record[k]) for k in required)
        assert math.isclose(record["mi/first_turn/mi_upper_bound"], math.log(10), rel_tol=1e-6)
        assert 0 <= record["mi/first_turn/retrieval_acc"] <= 1
    paths, _ = render_run(records, run_dir / "plots", run_name="test")
    assert {p.name for p in paths} == {"training.png", "filtering.png", "diagnostics.png", "regimes.png"}
