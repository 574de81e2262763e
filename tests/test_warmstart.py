"""Supervised warm starts: demonstration structure, the SFT loss going down, the cached tiny_vl build, and
scripts/sft.py end to end on the tiny test models."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from envs_text import sokoban as codes
from vagen.bootstrap import demos as demo_module
from vagen.bootstrap.demos import play_demo, sft_batch
from vagen.bootstrap.tiny import build_tiny_vl, load_tiny_vl
from vagen.bootstrap.tiny_text import make_text_game
from vagen.bootstrap.warmstart import (
    FROZENLAKE_VISUAL,
    SHIPPED_DIR,
    SOKOBAN_VISUAL,
    WarmStartRecipe,
    backward_sft_batch,
    build_warm_tiny_vl,
    evaluate_model,
    evaluate_scripted,
    make_frozenlake_visual,
    make_sokoban_visual,
    pretrain_vision,
    probe_columns,
    probe_labels,
    read_report,
    sft_loss,
    tile_direction_labels,
    train_sft,
)
from vagen.env import make_env
from vagen.env.policies import RELATIVE_DIRECTIONS
from vagen.models.cache import is_complete, read_stamp, verify_built_folder
from vagen.rollout import DialogueFormatter, trajectories_to_batch
from vagen.rollout.validation import eval_seeds

TEST_RECIPE = WarmStartRecipe(
    size="test",
    train_episodes=6,
    steps=3,
    batch_size=3,
    warmup_steps=1,
    bf16=False,
    vision_steps=2,
    vision_batch_size=4,
    eval_episodes=2,
    max_new_tokens=16,
)


def demonstrations(formatter, seeds, noise_eps):
    return demo_module.demonstrations(make_sokoban_visual, formatter, seeds, noise_eps, name="sokoban_visual")


def sokoban_at(grid: np.ndarray):
    """A Sokoban env whose current position is `grid`."""
    env = make_sokoban_visual(observation="text")
    env.reset(options={"level": codes.SokobanLevel.from_grid(grid)})
    return env.unwrapped


@pytest.fixture(scope="module")
def tiny_vl():
    return load_tiny_vl(build_tiny_vl(size="test"))


@pytest.fixture(scope="module")
def formatter(tiny_vl):
    _, processor = tiny_vl
    return DialogueFormatter(processor.tokenizer, processor.image_processor)


def test_think_text_names_relative_directions():
    grid = np.full((6, 6), codes.WALL, dtype=np.uint8)
    grid[1:5, 1:5] = codes.FLOOR
    grid[1, 3], grid[2, 2], grid[4, 3] = codes.PLAYER, codes.BOX, codes.TARGET
    assert sokoban_at(grid).demo_reasoning() == "box is down-left of me, target is down-right of box."
    grid[4, 3] = codes.FLOOR
    grid[2, 2] = codes.BOX_ON_TARGET
    assert sokoban_at(grid).demo_reasoning() == "all boxes are on targets."


def test_tile_labels_give_the_think_words_at_the_player_and_box_tiles():
    grid = np.full((6, 6), codes.WALL, dtype=np.uint8)
    grid[1:5, 1:5] = codes.FLOOR
    grid[1, 3], grid[2, 2], grid[4, 3] = codes.PLAYER, codes.BOX, codes.TARGET
    game = sokoban_at(grid)
    assert game.key_cells() == [(1, 3), (2, 2), (4, 3)]
    labels = tile_direction_labels(grid.shape, game.key_cells())  # columns: player, box, target from each tile
    assert labels.shape == (36, 3)
    assert RELATIVE_DIRECTIONS[labels[1 * 6 + 3, 1]] == "down-left"  # "box is down-left of me"
    assert RELATIVE_DIRECTIONS[labels[2 * 6 + 2, 2]] == "down-right"  # "target is down-right of box"
    assert RELATIVE_DIRECTIONS[labels[1 * 6 + 3, 0]] == "here" and RELATIVE_DIRECTIONS[labels[0, 0]] == "down-right"


def test_games_warm_started_together_get_their_own_probe_columns(formatter):
    """Sokoban (player, box, target) and FrozenLake (player, goal) side by side: 5 columns, each game's labels in its
    own columns and -100 (ignored by cross-entropy) in the other game's."""
    lake = demo_module.demonstrations(make_frozenlake_visual, formatter, range(2), 0.0, name="lake")
    mixed = demonstrations(formatter, range(2), noise_eps=0.0) + lake
    columns = probe_columns(mixed)
    assert columns == {"sokoban_visual": (0, 3), "lake": (3, 5)}
    demo = lake[0]
    labels = probe_labels(demo.grid_shapes[0], demo.key_cells[0], columns["lake"], 5)
    assert labels.shape == (16, 5) and (labels[:, :3] == -100).all()
    assert np.array_equal(labels[:, 3:], tile_direction_labels(demo.grid_shapes[0], demo.key_cells[0]))


def test_tile_facts_get_probe_columns_after_the_key_cells_and_the_vision_pretraining_runs_on_them(formatter):
    """Sokoban with `reading_walls`: its 3 key-cell columns, then 4 wall columns, each demo turn's facts recorded."""
    walls = demo_module.demonstrations(
        lambda: make_sokoban_visual(reading_walls=True), formatter, range(2), 0.0, name="walls"
    )
    lake = demo_module.demonstrations(make_frozenlake_visual, formatter, range(2), 0.0, name="lake")
    assert probe_columns(walls + lake) == {"walls": (0, 7), "lake": (7, 9)}
    demo = walls[0]
    assert len(demo.tile_facts) == len(demo.trajectory.turns) and demo.tile_facts[0].shape == (36, 4)
    labels = probe_labels(demo.grid_shapes[0], demo.key_cells[0], (0, 7), 9, demo.tile_facts[0])
    assert np.array_equal(labels[:, 3:7], demo.tile_facts[0]) and (labels[:, 7:] == -100).all()
    model, processor = load_tiny_vl(build_tiny_vl(size="test"))
    losses = pretrain_vision(model, processor, walls + lake, replace(TEST_RECIPE, vision_steps=1))
    assert len(losses) == 1 and np.isfinite(losses[0])


def test_vision_pretraining_learns_and_sft_keeps_the_vision_tower_frozen(formatter):
    model, processor = load_tiny_vl(build_tiny_vl(size="test"))
    demos = demonstrations(formatter, range(6), noise_eps=0.0)
    losses = pretrain_vision(model, processor, demos, replace(TEST_RECIPE, vision_steps=30, vision_lr=1e-2))
    assert len(losses) == 30 and np.mean(losses[-5:]) < losses[0] - 0.2
    vision_before = [p.detach().clone() for p in model.model.visual.parameters()]
    text_before = model.lm_head.weight.detach().clone()
    train_sft(model, processor, demos, replace(TEST_RECIPE, steps=2, vision_lr_scale=0.0))
    assert all(torch.equal(a, b) for a, b in zip(vision_before, model.model.visual.parameters(), strict=True))
    assert not torch.equal(text_before, model.lm_head.weight)
    assert all(p.requires_grad for p in model.parameters())


def test_noise_free_demos_succeed_with_one_image_per_turn_and_the_end_token(formatter):
    end_id = formatter.stop_token_ids()[0]
    demos = demonstrations(formatter, range(4), noise_eps=0.0)
    assert len(demos) == 4
    for demo in demos:
        trajectory = demo.trajectory
        assert trajectory.success and not any(demo.noisy_turns)
        assert len(trajectory.images) == len(trajectory.turns) == len(demo.noisy_turns)
        for turn in trajectory.turns:
            assert turn.response_ids[-1] == end_id and end_id not in turn.response_ids[:-1]
            assert formatter.tokenizer.decode(turn.response_ids[:-1]) == turn.response_text
            assert turn.response_text.startswith("<think>box is ") and turn.info["format_ok"]


def test_sft_mask_covers_exactly_the_solver_responses(formatter):
    env, rng = make_sokoban_visual(), np.random.default_rng(3)
    demos = [play_demo(env, formatter, seed, 0.5, rng, "sokoban_visual") for seed in range(8)]
    demos = [d for d in demos if d.trajectory.turns and not all(d.noisy_turns)]
    assert any(any(d.noisy_turns) for d in demos), "the noise should hit some turn of 8 episodes"
    batch = sft_batch(demos, formatter.tokenizer.pad_token_id)
    for row, demo in enumerate(demos):
        expected = torch.zeros(batch.input_ids.shape[1])
        spans, turns = demo.trajectory.response_spans(), demo.trajectory.turns
        for (start, end), turn, noisy in zip(spans, turns, demo.noisy_turns, strict=True):
            assert batch.input_ids[row, start:end].tolist() == turn.response_ids
            if not noisy:
                expected[start:end] = 1.0
        assert torch.equal(batch.response_mask[row], expected)
    # imitate_noise: the noisy turns are trained on as well, so the mask is every response
    imitated = sft_batch(demos, formatter.tokenizer.pad_token_id, imitate_noise=True)
    everything = trajectories_to_batch([demo.trajectory for demo in demos], formatter.tokenizer.pad_token_id)
    assert torch.equal(imitated.response_mask, everything.response_mask)
    assert imitated.response_mask.sum() > batch.response_mask.sum()


def test_an_all_noise_demonstrator_is_kept_only_when_imitated(formatter):
    """noise_eps=1 plays random actions every turn: those demos teach nothing unless the noise is imitated, and then
    they are a start that writes the format and the true think text but acts at random (`keep_all_noise`)."""
    dropped = demonstrations(formatter, range(4), noise_eps=1.0)
    kept = demo_module.demonstrations(make_sokoban_visual, formatter, range(4), 1.0, keep_all_noise=True)
    assert dropped == [] and len(kept) == 4 and all(all(demo.noisy_turns) for demo in kept)
    env = make_sokoban_visual()
    for demo in kept:  # the think text is the state's (replayed from the seed), the answer a random one
        env.reset(seed=demo.trajectory.seed)
        for turn in demo.trajectory.turns:
            assert turn.response_text.startswith(f"<think>{env.unwrapped.demo_reasoning()}</think><answer>")
            env.step(turn.response_text)


def test_demo_ids_are_what_the_rollout_would_build(formatter):
    """Each turn's context is the previous ids + close + the formatter's next prompt (the RL layout)."""
    demo = demonstrations(formatter, [5], noise_eps=0.0)[0]
    ids, _ = demo.trajectory.token_ids_and_mask()
    image_pad = formatter.image_pad_id
    assert ids.count(image_pad) == sum(formatter.image_token_counts(demo.trajectory.images))
    assert ids[: len(demo.trajectory.turns[0].prompt_ids)] == formatter.first_prompt(
        make_sokoban_visual().reset(seed=5)[0]
    )


def test_a_few_sft_steps_reduce_the_loss_on_a_fixed_batch(tiny_vl, formatter):
    _, processor = tiny_vl
    model, _ = load_tiny_vl(build_tiny_vl(size="test"))  # a private copy: the module fixture stays untrained
    demos = demonstrations(formatter, range(4), noise_eps=0.0)
    batch = sft_batch(demos, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        before = float(sft_loss(model, batch, processor))
    recipe = replace(TEST_RECIPE, steps=8, batch_size=4, lr=3e-3)
    losses = train_sft(model, processor, demos, recipe)
    with torch.no_grad():
        after = float(sft_loss(model.eval(), batch, processor))
    assert len(losses) == 8 and all(np.isfinite(losses))
    assert after < before - 0.5


def test_micro_batches_accumulate_the_whole_batch_gradient_and_loss(tiny_vl, formatter):
    """`sft.micro_batch_size` bounds memory only: the gradient and loss of 6 dialogues of different lengths in
    micro-batches of 4 (+2) and 1 equal one pass over all 6 (each part is divided by the whole batch's tokens)."""
    model, processor = tiny_vl
    demos = demonstrations(formatter, range(6), noise_eps=0.3)
    batch = sft_batch(demos, processor.tokenizer.pad_token_id)
    assert len(set(batch.attention_mask.sum(dim=1).tolist())) > 1  # the micro-batches really are trimmed apart
    results = []
    for micro_batch_size in (None, 4, 1):
        model.zero_grad(set_to_none=True)
        loss = backward_sft_batch(model, batch, processor, micro_batch_size, bf16=False)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss, grads))
    model.zero_grad(set_to_none=True)
    (whole_loss, whole), *parts = results
    with torch.no_grad():
        assert whole_loss == pytest.approx(float(sft_loss(model, batch, processor)), rel=1e-5)
    assert len(whole) > 10
    for loss, grads in parts:
        assert loss == pytest.approx(whole_loss, rel=1e-5) and grads.keys() == whole.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, whole[name], rtol=1e-4, atol=1e-6, msg=name)


def test_cached_build_is_reused_and_reports(tmp_path):
    folder = build_warm_tiny_vl(tmp_path, TEST_RECIPE)
    report = read_report(folder)
    assert report["eval"]["seeds"] == [eval_seeds(2)[0], eval_seeds(2)[-1]]
    assert {"greedy", "temperature_0.5", "random", "solver"} <= set(report["eval"])
    assert 0.0 <= report["eval"]["greedy"]["success"] <= 1.0 and report["eval"]["solver"]["success"] == 1.0
    built_at = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_warm_tiny_vl(tmp_path, TEST_RECIPE) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == built_at  # not rebuilt
    assert read_stamp(folder)["recipe"]["steps"] == TEST_RECIPE.steps
    other = build_warm_tiny_vl(tmp_path, replace(TEST_RECIPE, steps=2))  # another recipe: rebuilt in place
    assert other == folder and read_stamp(folder)["recipe"]["steps"] == 2


@pytest.mark.slow(seconds=75)
def test_shipped_tiny_vl_is_the_current_recipe_and_plays_as_its_report_says(tmp_path):
    """The committed warm tiny_vl is used only while its stamp is today's recipe (else it is rebuilt), and its
    weights replay the report: greedy success on the report's held-out seeds within 3 of 128 episodes (CPU
    float reductions differ with the thread count, which can flip an episode or two)."""
    folder = build_warm_tiny_vl(cache_dir=tmp_path)  # the default recipe: no 25-minute build
    assert folder.parent == SHIPPED_DIR, "the recipe changed: rebuild (scripts/sft.py sft.bf16=true) and ship it"
    assert not list(tmp_path.glob("warm-*"))
    report = read_report(folder)
    model, processor = load_tiny_vl(folder)
    episodes = report["recipe"]["eval_episodes"]
    assert report["eval"]["seeds"] == [eval_seeds(episodes)[0], eval_seeds(episodes)[-1]]
    greedy = evaluate_model(model, processor, episodes, 0.0, report["recipe"]["max_new_tokens"])
    assert abs(greedy["success"] - report["eval"]["greedy"]["success"]) <= 3 / episodes
    assert greedy["success"] > 2 * report["eval"]["random"]["success"]


@pytest.mark.parametrize(
    ("build", "game"),
    [
        ("warm-tiny-vl-default-seed0", None),
        ("warm-tiny-vl-default-seed0", "frozenlake_visual"),
        ("warm-tiny-text-default-seed0", None),
        ("warm-tiny-text-default-seed0", "frozenlake_text"),
    ],
)
def test_shipped_reports_scripted_baselines_replay_exactly(build, game):
    """The reports' random and solver rows are played by the evaluator's chat loop on the report's seeds: replayed,
    they give exactly the shipped numbers (no model, so no float differences)."""
    report = read_report(SHIPPED_DIR / build)
    block = report["other_games"][game]["eval"] if game else report["eval"]
    name = game or report["env"]
    make = {"sokoban_visual": make_sokoban_visual, "frozenlake_visual": make_frozenlake_visual}.get(name)
    make = make or (lambda: make_text_game(name))
    episodes = report["recipe"]["eval_episodes"]
    assert block["seeds"] == [eval_seeds(episodes)[0], eval_seeds(episodes)[-1]]
    for policy in ("random", "solver"):
        assert evaluate_scripted(policy, episodes, make) == block[policy], policy


@pytest.mark.slow(seconds=590)
def test_shipped_smollm2_text_option_is_its_recipe_and_plays_as_its_report_says():
    """`model=smollm2_135m` (the pretrained text option) is SmolLM2-135M-Instruct + the shipped sokoban_text adapter:
    the adapter's report holds the recipe of `SMOLLM2_TEXT_SFT` on the base `model=smollm2_135m_base`, and the folded
    model replays the report's greedy held-out success and format-ok (within 2 of its 32 episodes: CPU float
    reductions differ with the thread count)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from vagen.bootstrap.sources import SMOLLM2_TEXT_FOLDER, SMOLLM2_TEXT_SFT
    from vagen.models.lora import read_adapter
    from vagen.models.registry import load_policy

    report = read_report(SMOLLM2_TEXT_FOLDER)
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "configs"), version_base=None):
        sft = compose("sft", overrides=SMOLLM2_TEXT_SFT)
        default = compose("train", overrides=["env=sokoban_text", "model=smollm2_135m"])
    recipe = {key: value for key, value in report["recipe"].items() if key not in ("size", "base_seed")}
    assert recipe == {key: sft.sft[key] for key in recipe} and report["env"] == sft.env.name == "sokoban_text"
    adapter = read_adapter(SMOLLM2_TEXT_FOLDER)
    assert adapter["base"] == {key: sft.model[key] for key in ("source", "path", "size", "modality")}
    assert adapter["lora"] == {key: OmegaConf.to_container(sft.lora)[key] for key in adapter["lora"]}
    assert default.model.source == "smollm2_warm"
    policy = load_policy(default.model.name, default.model.source, default.model.modality, dtype="float32")
    kwargs = OmegaConf.to_container(default.env.kwargs)
    episodes = report["recipe"]["eval_episodes"]
    assert report["eval"]["seeds"] == [eval_seeds(episodes)[0], eval_seeds(episodes)[-1]]
    greedy = evaluate_model(policy.model.eval(), policy.tokenizer, episodes, 0.0, report["recipe"]["max_new_tokens"],
                            make=lambda: make_env(default.env.id, **kwargs), env_name="sokoban_text")  # fmt: skip
    for key in ("success", "format_ok"):
        assert abs(greedy[key] - report["eval"]["greedy"][key]) <= 2 / episodes, key


@pytest.mark.parametrize(
    ("env", "model", "also", "lora"),
    [
        ("sokoban_visual", "tiny_vl_test", ["frozenlake_visual"], False),
        ("frozenlake_text", "tiny_text_test", [], False),
        ("frozenlake_text", "tiny_text_test", [], True),
    ],
    ids=["vl-two-games", "text", "text-lora"],
)
def test_sft_script_end_to_end_writes_a_model_folder_report_and_config(env, model, also, lora, tmp_path, monkeypatch):
    """scripts/sft.py on the tiny test models: a loadable model folder, a report with held-out success before
    and after SFT (for every game of `also_envs` too), and a model config that the trainer's loader reads.
    With lora.enabled the folder holds the adapter alone, and the config loads base + adapter."""
    import subprocess
    import sys

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from vagen.eval.models import load_local_policy, resolve_model
    from vagen.models.registry import load_policy

    root = Path(__file__).resolve().parent.parent
    name = f"sft_test_{env}_{tmp_path.name}"
    entry = root / "configs" / "model" / f"{name}.yaml"
    quick = ["sft.train_episodes=6", "sft.steps=3", "sft.batch_size=3", "sft.warmup_steps=1", "sft.bf16=false"]
    quick += ["sft.vision_steps=2", "sft.vision_batch_size=4", "sft.eval_episodes=2", "sft.max_new_tokens=16"]
    quick += ["sft.imitate_noise=true", "sft.micro_batch_size=2"]  # reach the recipe / the step (each tested above)
    command = [sys.executable, str(root / "scripts" / "sft.py"), f"env={env}", f"model={model}", *quick]
    command += [f"out={tmp_path / 'out'}", f"sft.config_name={name}", f"also_envs=[{','.join(also)}]"]
    command += ["lora.enabled=true", "lora.r=4"] if lora else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=root, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "held-out before SFT" in done.stdout and "held-out after SFT" in done.stdout
        report = read_report(tmp_path / "out")
        assert report["env"] == env and report["recipe"]["steps"] == 3 and report["recipe"]["imitate_noise"] is True
        assert report["micro_batch_size"] == 2
        written = OmegaConf.load(tmp_path / "out" / "config.yaml")  # the env kwargs the model learned to read
        assert written.env.name == env and written.sft.steps == 3 and "max_turns" in written.env.kwargs
        phases = report["seconds"]  # each phase timed apart (the evaluation before SFT is not the demos' time)
        assert set(phases) == {"eval_before", "demos", "vision", "train", "save", "eval", "total"}
        assert all(phases[k] >= 0 for k in phases) and sum(phases.values()) == pytest.approx(2 * phases["total"], 1e-3)
        games = [report, *(report["other_games"][name] for name in also)]
        assert set(report.get("other_games", {})) == set(also)
        for game in games:
            for block in (game["eval_before"], game["eval"]):
                assert {"greedy", "temperature_0.5"} <= set(block) and 0 <= block["greedy"]["success"] <= 1
            assert game["eval"]["solver"]["success"] == 1.0
        for game_name in [env, *also]:
            assert f"{game_name} held-out after SFT" in done.stdout
        with initialize_config_dir(config_dir=str(root / "configs"), version_base=None):
            cfg = compose("train", overrides=[f"env={env}", f"model={name}"])
        assert cfg.model.path == str(tmp_path / "out")
        policy = load_policy(cfg.model.name, cfg.model.source, cfg.model.modality, path=cfg.model.path)
        assert sum(p.numel() for p in policy.model.parameters()) > 0
        # scripts/evaluate.py model=[<the folder>] loads the same model as the written config
        spec = resolve_model(str(tmp_path / "out"), OmegaConf.create({"name": "hf"}), root / "configs", {})
        assert {k: spec.model_config[k] for k in ("source", "path", "modality")} == {
            k: cfg.model[k] for k in ("source", "path", "modality")
        }
        evaluated = load_local_policy(spec, "cpu").model.state_dict()
        assert all(torch.equal(value, evaluated[key]) for key, value in policy.model.state_dict().items())
        saved = {path.name for path in (tmp_path / "out").iterdir()}
        assert ("adapter.safetensors" in saved) == lora and ("model.safetensors" in saved) == (not lora)
        if lora:  # SFT moved the adapted projections only; the folded model is base + adapter
            assert cfg.model.source == "lora_adapter"
            base = load_policy(model, "tiny_text", "text", size="test").model.state_dict()
            changed = {key for key, value in policy.model.state_dict().items() if not torch.equal(value, base[key])}
            assert changed and all(key.split(".")[-2].endswith("_proj") for key in changed)
    finally:
        entry.unlink(missing_ok=True)


@pytest.mark.parametrize(
    ("name", "kwargs"), [("sokoban_visual", SOKOBAN_VISUAL), ("frozenlake_visual", FROZENLAKE_VISUAL)]
)
def test_the_tiny_vl_games_are_the_env_configs(name, kwargs):
    """The shipped tiny_vl is warm-started on exactly what `env=sokoban_visual` / `env=frozenlake_visual` train on."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(
        OmegaConf.load(Path(__file__).resolve().parent.parent / "configs/env" / f"{name}.yaml")
    )
    for key, value in kwargs.items():
        assert config["kwargs"][key] == (list(value) if isinstance(value, tuple) else value), key


def test_sft_script_refuses_lora_with_vision_pretraining_before_loading_a_model(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, str(root / "scripts" / "sft.py"), "model=tiny_vl_test", "lora.enabled=true"]
    done = subprocess.run([*command, f"out={tmp_path}/out"], capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        "sft.vision_steps=400 pre-trains the whole vision tower" in done.stderr and "sft.vision_steps=0" in done.stderr
    )
    assert {path.name for path in (tmp_path / "out").iterdir()} <= {"sft.log"}  # only Hydra's log


@pytest.mark.parametrize("native", [True, False], ids=["avx512-bf16-cpu", "avx2-only-cpu"])
def test_sft_bf16_auto_is_bf16_only_where_the_cpu_computes_it(native, monkeypatch, formatter):
    """`sft.bf16=auto` (the default) is bf16 on a CPU with native bf16 and float32 on one that emulates it (17x slower
    per SFT step, measured); an explicit true there trains as asked but warns with the fix; anything else is refused."""
    import warnings

    from hydra import compose, initialize_config_dir
    from test_trainer import repo_module

    root = Path(__file__).resolve().parent.parent
    sft_script = repo_module("scripts/sft.py")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    with initialize_config_dir(config_dir=str(root / "configs"), version_base=None):
        default, explicit, wrong = (compose("sft", overrides=o) for o in ([], ["sft.bf16=true"], ["sft.bf16=yes"]))
    assert default.sft.bf16 == "auto" and sft_script.recipe_of(default).bf16 is native
    assert sft_script.recipe_of(explicit).bf16 is True
    with pytest.raises(ValueError, match=r"sft\.bf16='yes' must be true, false or auto"):
        sft_script.recipe_of(wrong)
    model, processor = load_tiny_vl(build_tiny_vl(size="test"))  # a private copy: the module fixture stays untrained
    demos = demonstrations(formatter, range(2), noise_eps=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_sft(model, processor, demos, replace(TEST_RECIPE, steps=1, bf16=True))
    emulated = [str(w.message) for w in caught if "without native bf16" in str(w.message)]
    assert emulated == ([] if native else [emulated[0]]) and (native or "Set sft.bf16=false" in emulated[0])


@pytest.mark.slow(seconds=60)
def test_shipped_tiny_vl_holes_is_its_recipe_on_the_shipped_tiny_vl_and_plays_as_its_report_says():
    """`model=tiny_vl_holes` (frozenlake_visual's default) is what `TINY_VL_HOLES_SFT` makes of the shipped tiny_vl:
    the shipped config.yaml is those overrides composed (hole labels on), the report holds their recipe, the marker
    names today's tiny_vl weights as the base (a rebuilt tiny_vl makes it stale) and checksums every file, and the
    weights replay the report's greedy held-out success on frozenlake_visual within 3 of its 256 episodes (CPU float
    reductions differ with the thread count)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from vagen.bootstrap.sources import TINY_VL_HOLES_FOLDER, TINY_VL_HOLES_SFT, tiny_vl_holes_stamp
    from vagen.models.registry import model_folder

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "configs"), version_base=None):
        sft = compose("sft", overrides=TINY_VL_HOLES_SFT)
        default = compose("train", overrides=["env=frozenlake_visual"])
    shipped = OmegaConf.load(TINY_VL_HOLES_FOLDER / "config.yaml")
    for key in ("model", "env", "sft", "lora", "also_envs"):
        assert shipped[key] == sft[key], key
    assert sft.env.kwargs.hole_labels is True
    report = read_report(TINY_VL_HOLES_FOLDER)
    recipe = {key: value for key, value in report["recipe"].items() if key not in ("size", "base_seed", "bf16")}
    assert recipe == {key: sft.sft[key] for key in recipe} and report["env"] == "frozenlake_visual"
    assert is_complete(TINY_VL_HOLES_FOLDER, tiny_vl_holes_stamp()), (
        "the shipped tiny_vl or TINY_VL_HOLES_SFT changed: rebuild tiny_vl_holes with scripts/sft.py TINY_VL_HOLES_SFT "
        "and ship it, its marker {**tiny_vl_holes_stamp(), **file_manifest(folder, COMPLETE_MARKER)}"
    )
    assert (default.model.name, default.model.source) == ("tiny_vl_holes", "tiny_vl_holes")
    folder = model_folder(default.model.source, default.model.path, default.model.size)
    verify_built_folder(folder)
    model, processor = load_tiny_vl(folder)
    episodes = report["recipe"]["eval_episodes"]
    assert report["eval"]["seeds"] == [eval_seeds(episodes)[0], eval_seeds(episodes)[-1]]
    greedy = evaluate_model(model, processor, episodes, 0.0, report["recipe"]["max_new_tokens"],
                            make=make_frozenlake_visual, env_name="frozenlake_visual")  # fmt: skip
    assert abs(greedy["success"] - report["eval"]["greedy"]["success"]) <= 3 / episodes
