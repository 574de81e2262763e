"""Held-out validation inside training: fixed evaluation seeds, deterministic, logged at 0, every k, and the end."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_trainer import CONFIG_DIR, TEXT, VISUAL, config, repo_module

from vagen.env import make_env
from vagen.logging import read_metrics
from vagen.rollout.move_probe import optimal_first_actions
from vagen.rollout.trajectory import Trajectory, Turn
from vagen.rollout.validation import EVAL_SEED_BASE, distance_bins, eval_seeds, reading_metrics, wilson_interval
from vagen.trainer.checkpoint import latest_checkpoint, read_state
from vagen.trainer.run import held_out_line, train
from vagen.trainer.starpo import SEED_STRIDE, StarPOTrainer


def test_eval_seeds_never_overlap_training_seeds():
    seeds = eval_seeds(256)
    assert seeds == list(range(EVAL_SEED_BASE, EVAL_SEED_BASE + 256))
    # Run seed s trains on env seeds s·SEED_STRIDE + k (k < SEED_STRIDE): every run seed below 10_000 stays below.
    assert min(seeds) > 10_000 * SEED_STRIDE - 1
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        eval_seeds(0)


def test_validation_is_deterministic_and_does_not_move_the_training_cursor():
    trainer = StarPOTrainer(config([*TEXT, "trainer.eval_episodes=12", "rollout.temperature=1.0"]))
    cursor = trainer.seed_cursor
    first, second = trainer.validate(), trainer.validate()
    assert first == second
    assert set(first) == {
        "val/success",
        "val/reward",
        "val/turns",
        "val/format_ok",
        "val/actions_per_turn",
        "val/success_ci_low",
        "val/success_ci_high",
        "val/episodes",
        "val/levels",
        "val/greedy_success",
    }
    assert first["val/episodes"] == first["val/levels"] == 12 and trainer.seed_cursor == cursor
    low, high = wilson_interval(round(first["val/success"] * 12), 12)
    assert (first["val/success_ci_low"], first["val/success_ci_high"]) == (low, high)


def test_validation_with_several_samples_per_level_keeps_sample_0_and_pairs_by_level_rate():
    """trainer.eval_samples=3: each held-out level is played 3 times; sample 0 is the episode that 1 sample plays, the
    outcomes are each level's success rate, and the interval counts levels."""
    overrides = [*TEXT, "trainer.eval_episodes=8", "trainer.eval_move_probe=false"]
    one = StarPOTrainer(config(overrides))
    single = one.learner.play_held_out(range(8))
    one.validate()
    three = StarPOTrainer(config([*overrides, "trainer.eval_samples=3"]))
    episodes = three.learner.play_held_out(range(8))
    val = three.validate()
    assert [t.seed for t in episodes] == [seed for seed in eval_seeds(8) for _ in range(3)]
    assert [t.token_ids_and_mask() for t in episodes[::3]] == [t.token_ids_and_mask() for t in single]
    first, second = episodes[::3], episodes[1::3]
    assert any(a.token_ids_and_mask() != b.token_ids_and_mask() for a, b in zip(first, second, strict=True))
    by_level = {seed: sum(t.success for t in episodes if t.seed == seed) / 3 for seed in eval_seeds(8)}
    assert three.val_outcomes == by_level and one.val_outcomes == {t.seed: float(t.success) for t in single}
    assert val["val/episodes"] == 24 and val["val/levels"] == 8
    assert val["val/success"] == pytest.approx(sum(by_level.values()) / 8)
    assert (val["val/success_ci_low"], val["val/success_ci_high"]) == wilson_interval(sum(by_level.values()), 8)


def test_validation_plays_at_most_an_iterations_rollout_batch_at_once_and_the_same_episodes(monkeypatch):
    """The trainer's validation plays `trainer.groups` × `trainer.group_size` episodes at a time (whole levels), as the
    memory plan counts the engine's kept dialogues; the episodes are token for token those of one batch."""
    import vagen.rollout.validation as validation

    cfg = config([*TEXT, "trainer.eval_episodes=5", "trainer.eval_samples=2", "rollout.temperature=1.0"])
    learner = StarPOTrainer(cfg).learner
    batches, collect = [], validation.collect_rollouts

    def counted(make, engine, formatter, spec, sampling):
        batches.append(len(spec.group_seeds) * spec.group_size)
        return collect(make, engine, formatter, spec, sampling)

    monkeypatch.setattr(validation, "collect_rollouts", counted)
    chunked = learner.play_held_out(range(5))
    assert batches == [4, 4, 2]  # groups 2 × group_size 2 = 4 episodes: 2 levels × 2 samples, twice, then 1 level
    whole = validation.validation_episodes(
        lambda: make_env(cfg.env.id, **cfg.env.kwargs),
        learner.engine,
        learner.formatter,
        episodes=range(5),
        temperature=cfg.trainer.eval_temperature,
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_context_tokens=cfg.rollout.max_context_tokens,
        env_name=cfg.env.name,
        samples=2,
    )
    assert [t.seed for t in chunked] == [t.seed for t in whole] == [seed for seed in eval_seeds(5) for _ in range(2)]
    assert [t.token_ids_and_mask() for t in chunked] == [t.token_ids_and_mask() for t in whole]


def test_greedy_validation_plays_each_level_once_by_the_argmax_and_keeps_its_outcomes():
    """trainer.eval_greedy=true: each validation also plays every held-out level once, every sampled token the
    model's argmax given the dialogue before it (teacher-forced check), as `val/greedy_success` and, by level, in
    `greedy_history`; the sampled validation is the one without it."""
    import torch

    overrides = [*TEXT, "trainer.eval_episodes=8", "trainer.eval_move_probe=false"]
    plain = StarPOTrainer(config([*overrides, "trainer.eval_greedy=false"])).validate()
    trainer = StarPOTrainer(config([*overrides, "trainer.eval_greedy=true"]))
    greedy_episodes = trainer.learner.play_held_out(range(8), greedy=True)
    val = trainer.validate()
    assert {k: v for k, v in val.items() if k != "val/greedy_success"} == plain
    assert [t.seed for t in greedy_episodes] == eval_seeds(8)
    assert trainer.greedy_history == {0: {t.seed: float(t.success) for t in greedy_episodes}}
    assert val["val/greedy_success"] == sum(t.success for t in greedy_episodes) / 8
    model = trainer.learner.model
    checked = 0
    for episode in greedy_episodes:
        ids, mask = episode.token_ids_and_mask()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        sampled = [p for p, m in enumerate(mask) if m]
        assert [int(logits[p - 1].argmax()) for p in sampled] == [ids[p] for p in sampled]
        checked += len(sampled)
    assert checked > 8


def test_a_greedy_validation_is_not_played_twice_for_its_greedy_part():
    """trainer.eval_temperature=0: the validation itself plays greedily, so its outcomes are the greedy part's and
    the held-out levels are played once, not twice."""
    trainer = StarPOTrainer(
        config([*TEXT, "trainer.eval_episodes=8", "trainer.eval_move_probe=false", "trainer.eval_temperature=0"])
    )
    played = []
    play = trainer.learner.play_held_out
    trainer.learner.play_held_out = lambda levels, greedy=False: played.append(greedy) or play(levels, greedy)
    val = trainer.validate()
    assert played == [False]
    assert trainer.greedy_history == {0: trainer.val_outcomes}
    assert val["val/greedy_success"] == val["val/success"]
    assert trainer.val_outcomes == {t.seed: float(t.success) for t in play(range(8), greedy=True)}


def test_reading_metrics_replay_each_turn_against_the_demonstration_reading():
    """frozenlake_text: two held-out episodes played by the solver with the demonstration's reading (every turn exact,
    every fact right) and one whose single reading puts the goal on the wrong side and no hole anywhere."""
    make = lambda: make_env("vagen/FrozenLake-v0")
    env = make()
    game = env.unwrapped
    played = []
    for seed in eval_seeds(2):
        env.reset(seed=seed)
        trajectory, done = Trajectory(group_id=0, seed=seed, env_name="frozenlake_text"), False
        while not done:
            response = f"<think>{game.demo_reasoning()}</think><answer>{game.solver_actions()[0]}</answer>"
            trajectory.turns.append(Turn(observation="", images=[], prompt_ids=[], response_text=response))
            _, _, terminated, truncated, _ = env.step(response)
            done = terminated or truncated
        played.append(trajectory)
    assert reading_metrics(make, played) == {"val/reading_exact": 1.0, "val/reading_facts": 1.0}

    # A third episode, one turn, on a start with a hole beside the player and the goal not up.
    def beside_a_hole(seed: int) -> bool:
        env.reset(seed=seed)
        return bool(game._holes_next_to_player()) and game._goal_direction() != "up"

    seed = next(filter(beside_a_hole, eval_seeds(64)))
    wrong = Trajectory(group_id=0, seed=seed, env_name="frozenlake_text")
    response = "<think>goal is up of me, no hole next to me.</think><answer>Up</answer>"
    wrong.turns.append(Turn(observation="", images=[], prompt_ids=[], response_text=response))
    holes = len(game._holes_next_to_player())
    turns = sum(len(t.turns) for t in played) + 1
    metrics = reading_metrics(make, [*played, wrong])
    assert metrics["val/reading_exact"] == pytest.approx((turns - 1) / turns)
    # the wrong turn: goal wrong, every side with a hole wrong, the other sides right
    assert metrics["val/reading_facts"] == pytest.approx((turns - 1 + (4 - holes) / 5) / turns)
    assert reading_metrics(lambda: make_env("vagen/Bandit-v0"), played) == {}  # no demonstration reading


def test_validation_scores_the_first_move_probe_where_the_game_has_a_solver():
    """sokoban_visual: `val/` also holds the teacher-forced first-move probe on the held-out starts of the validation
    seeds (deterministic, read from the live weights: it changes after an update); off with trainer.eval_move_probe."""
    trainer = StarPOTrainer(config([*VISUAL, "trainer.eval_episodes=6"]))
    first, second = trainer.validate(), trainer.validate()
    probe = {key: value for key, value in first.items() if key.startswith("val/move_")}
    names = ("optimal_mass", "top_optimal", "rarely_optimal", "chance", "states")
    assert set(probe) == {f"val/move_{name}" for name in names}
    assert probe == {key: value for key, value in second.items() if key.startswith("val/move_")}
    assert 0 <= first["val/reading_exact"] <= 1 and "val/reading_facts" not in first  # Sokoban: exact readings only
    env = make_env(trainer.cfg.env.id, **trainer.cfg.env.kwargs)
    optimal = [o for o in (optimal_first_actions(env, seed) for seed in eval_seeds(6)) if o is not None]
    assert probe["val/move_states"] == len(optimal) > 0
    assert probe["val/move_chance"] == pytest.approx(sum(sum(o) / len(o) for o in optimal) / len(optimal))
    assert all(0 <= probe[f"val/move_{name}"] <= 1 for name in ("optimal_mass", "top_optimal", "rarely_optimal"))
    trainer.train_iteration()
    assert trainer.validate()["val/move_optimal_mass"] != probe["val/move_optimal_mass"]
    off = StarPOTrainer(config([*VISUAL, "trainer.eval_episodes=2", "trainer.eval_move_probe=false"])).validate()
    assert not any(key.startswith("val/move_") for key in off)


def test_held_out_line_pairs_the_levels_and_adds_the_probe_where_both_validations_have_it():
    start, end = {"val/success": 0.5, "val/episodes": 4.0}, {"val/success": 0.75, "val/episodes": 4.0}
    assert held_out_line(start, end, 1280) == (
        "held-out success 50.0% -> 75.0% after 1,280 training episodes (4 held-out episodes)"
    )
    # By hand: differences (1, 0, 0, 0): mean 0.25, sample variance 0.25, half-width 1.96 * sqrt(0.25 / 4) = 0.49.
    before, after = {7: 0.0, 8: 0.0, 9: 1.0, 10: 1.0}, {7: 1.0, 8: 0.0, 9: 1.0, 10: 1.0}
    assert held_out_line(start, end, 64, before, after) == (
        "held-out success 50.0% -> 75.0% after 64 training episodes: +25.0 pts [-24.0, +74.0] paired over 4 held-out "
        "levels"
    )
    # Fewer than 2 levels in common (a resumed run whose start predates the pairing): the unpaired line.
    assert held_out_line(start, end, 64, {}, after).endswith("after 64 training episodes (4 held-out episodes)")
    start, end = start | {"val/move_optimal_mass": 0.714}, end | {"val/move_optimal_mass": 0.7251}
    line = held_out_line(start, end, 64, before, after)
    assert line.endswith("paired over 4 held-out levels; mass on optimal first moves 0.714 -> 0.725")
    # Two samples per level: the outcomes are rates, and the line says how many episodes each level played.
    end = end | {"val/episodes": 8.0}
    line = held_out_line(start, end, 64, before, {7: 0.5, 8: 0.0, 9: 1.0, 10: 1.0})
    assert "+12.5 pts [-12.0, +37.0] paired over 4 held-out levels x 2 samples; mass" in line
    # With the greedy outcomes before and after (trainer.eval_greedy), their paired change ends the line; by hand as
    # above, with the sides swapped: differences (-1, 0, 0, 0).
    line = held_out_line(start, end, 64, before, after, greedy=(after, before))
    assert line.endswith("0.714 -> 0.725; greedy 75.0% -> 50.0%: -25.0 pts [-74.0, +24.0]")
    assert held_out_line(start, end, 64, before, after, greedy=({7: 1.0}, {7: 0.0})).endswith("0.714 -> 0.725")


def test_run_validates_at_start_every_k_and_end_and_prints_the_held_out_line(tmp_path, capsys):
    overrides = [
        *TEXT,
        "trainer.eval_every=2",
        "trainer.eval_episodes=6",
        "trainer.save_every=1",
        "trainer.eval_greedy=true",
    ]
    cfg = config([*overrides, "trainer.iterations=3"], tmp_path)
    per_iteration = cfg.trainer.groups * cfg.trainer.group_size
    run_dir = train(cfg)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val/success" in r] == [0, 2, 3]
    assert "env/success" not in records[0]  # iteration 0 is the policy before any update
    out = capsys.readouterr()
    first, last = records[0]["val/success"], records[-1]["val/success"]
    expected = f"held-out success {first:.1%} -> {last:.1%} after {3 * per_iteration} training episodes: "
    assert expected in out.out and "paired over 6 held-out levels" in out.out
    greedy = f"; greedy {records[0]['val/greedy_success']:.1%} -> {records[-1]['val/greedy_success']:.1%}: "
    assert greedy in out.out  # trainer.eval_greedy: the greedy outcomes' paired change, from iteration 0 to the end
    # A resumed run still knows where it started: the line compares with iteration 0 (its success and each level's
    # outcome, kept in the checkpoint), not with the resume point.
    train(config([*overrides, "trainer.iterations=4"], tmp_path))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val/success" in r] == [0, 2, 3, 4]
    out = capsys.readouterr()
    expected = f"held-out success {first:.1%} -> {records[-1]['val/success']:.1%} after {4 * per_iteration} training "
    assert expected in out.out and "paired over 6 held-out levels" in out.out
    # Rerun once finished, it trains nothing and prints the same line again (from its log and its checkpoint).
    (line,) = [text for text in out.out.splitlines() if text.startswith("held-out success")]
    train(config([*overrides, "trainer.iterations=4"], tmp_path))
    assert len(read_metrics(run_dir)) == len(records)
    assert line in capsys.readouterr().out.splitlines()
    # The checkpoint keeps every validation's outcome per level, by iteration, across the resume.
    state = read_state(latest_checkpoint(run_dir))
    for name, metric in (("val_history", "val/success"), ("greedy_history", "val/greedy_success")):
        history = state[name]
        assert sorted(history) == [0, 2, 3, 4] and all(sorted(h) == eval_seeds(6) for h in history.values())
        assert [sum(history[k].values()) / 6 for k in (0, 2, 3, 4)] == [r[metric] for r in records if metric in r]
    # research/compare_runs.py reads either history from the run folder; greedy=true the greedy one.
    compare_runs = repo_module("research/compare_runs.py")
    assert compare_runs.validations(run_dir) == state["val_history"]
    assert compare_runs.validations(run_dir, greedy=True) == state["greedy_history"]
    (greedy_run,) = compare_runs.load_runs(str(run_dir), greedy=True)
    assert greedy_run.history == state["greedy_history"]
    # save= keeps both, so a file stands for the runs greedily too; one saved without greedy validations says so.
    kept = tmp_path / "kept.json"
    compare_runs.save_runs(compare_runs.load_runs(str(run_dir)), kept, compare_runs.kept_greedy(str(run_dir)))
    assert compare_runs.load_runs(str(kept))[0].history == state["val_history"]
    assert compare_runs.load_runs(str(kept), greedy=True)[0].history == state["greedy_history"]
    compare_runs.save_runs(compare_runs.load_runs(str(run_dir)), kept)
    with pytest.raises(ValueError, match="keeps no greedy validations"):
        compare_runs.load_runs(str(kept), greedy=True)


def test_compare_runs_pairs_each_pair_and_the_mean_run_by_level():
    """Hand-computed: pair 0 gains on levels 1 and 3 of 4 (+50 [-6.6, +106.6]: differences 1, 0, 1, 0), pair 1 on
    none; the mean run gains 0.5 on levels 1 and 3 (+25 [-3.3, +53.3]). Without a, each b run meets its iteration 0."""
    compare_runs = repo_module("research/compare_runs.py")
    runs = {
        "a0": {0: {1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}, 10: {1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}},
        "a1": {0: {1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}, 10: {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}},
        "b0": {0: {1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}, 10: {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}, 20: {1: 1, 2: 1, 3: 1, 4: 1}},
        "b1": {0: {1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}, 10: {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}},
    }
    a, b = [compare_runs.Run(n, runs[n]) for n in ("a0", "a1")], [compare_runs.Run(n, runs[n]) for n in ("b0", "b1")]
    table = compare_runs.compare(a, b, -1, -1)
    assert table.startswith("b at iteration 10 against a at iteration 10")  # the latest both b runs validated
    assert "| 0 | a0 | b0 | 50.0% | 100.0% | +50.0 pts [-6.6, +106.6] over 4 levels |" in table
    assert "| 1 | a1 | b1 | 50.0% | 50.0% | +0.0 pts [+0.0, +0.0] over 4 levels |" in table
    assert table.endswith("The mean run: 50.0% -> 75.0%, +25.0 pts [-3.3, +53.3] over 4 levels.")
    assert "| 0 | b0 | b0 | 50.0% | 100.0% | +50.0 pts" in compare_runs.compare([], b, 10, -1)  # against iteration 0
    with pytest.raises(ValueError, match=r"b0 has no validation at iteration 5 .*it has \[0, 10, 20\]"):
        compare_runs.compare(a, b, 5, 10)
    with pytest.raises(ValueError, match="a= names 1 runs and b= 2"):
        compare_runs.compare(a[:1], b, -1, -1)


def test_compare_runs_breaks_the_mean_runs_change_down_by_solver_distance():
    """Bins merge neighbouring distances until each holds min_levels levels (a short last bin joins the one before).
    By hand, min_levels 2 over distances 2, 2, 5, 6, 9: bins 2 and 5–9. Bin 2 (levels 1, 2): 0.5 -> 1.0, differences
    1 and 0: +50 [-48.0, +148.0]. Bin 5–9 (levels 3, 4, 5): differences 0, 0, 0: +0 [+0, +0]. The distances are the
    game's solver's: a Sokoban level's equals the length of the plan its solver returns from the start."""
    compare_runs = repo_module("research/compare_runs.py")
    assert distance_bins([2, 2, 5, 6, 9], 2) == [(2, 2), (5, 9)]
    assert distance_bins([4, 4, 4], 16) == [(4, 4)]  # fewer levels than one bin: one bin of them all
    before = {1: 0.0, 2: 1.0, 3: 0.5, 4: 0.0, 5: 1.0}
    after = {1: 1.0, 2: 1.0, 3: 0.5, 4: 0.0, 5: 1.0}
    table = compare_runs.by_distance(before, after, {1: 2, 2: 2, 3: 5, 4: 6, 5: 9}, min_levels=2)
    assert "| 2 | 2 | 50.0% | 100.0% | +50.0 pts [-48.0, +148.0] over 2 levels |" in table
    assert "| 5–9 | 3 | 50.0% | 50.0% | +0.0 pts [+0.0, +0.0] over 3 levels |" in table
    with pytest.raises(ValueError, match=r"no solver distance for levels \[5\]"):
        compare_runs.by_distance(before, after, {1: 2, 2: 2, 3: 5, 4: 6}, min_levels=2)
    a = [compare_runs.Run("a", {0: before})]
    b = [compare_runs.Run("b", {0: after})]
    assert "The mean run by the levels' solver distance" in compare_runs.compare(a, b, 0, 0, {k: 3 for k in before})

    seeds = eval_seeds(3)
    distances = compare_runs.solver_distances("sokoban_visual", seeds)
    env_cfg = OmegaConf.load(CONFIG_DIR / "env" / "sokoban_visual.yaml")
    env = make_env(env_cfg.id, **OmegaConf.to_container(env_cfg.kwargs))
    for seed in seeds:  # the plan from each level's start solves it in that many moves
        env.reset(seed=seed)
        plan = env.unwrapped.solver_actions()
        assert distances[seed] == len(plan) > 0
        for turn in range(0, len(plan), 3):
            *_, info = env.step(f"<think>plan</think><answer>{'||'.join(plan[turn : turn + 3])}</answer>")
        assert info["success"]


def test_first_move_gap_tables_each_set_in_the_held_out_levels_distance_bins():
    """research/first_move_gap.py's table, by hand: training levels 1, 2 and held-out levels 10, 11, 12; bins from
    the held-out distances 2, 5, 5 with min_levels 1: 2 and 5. Training level 2 (distance 5): mass 0.4, one level, no
    interval; held-out 11 and 12: 0.5 and 0.7, mean 0.6, stdev 0.1414, half-width 1.96 * 0.1414 / sqrt(2) = 0.196."""
    first_move_gap = repo_module("research/first_move_gap.py")
    results = {
        "train": {1: (0.9, True), 2: (0.4, False)},
        "held out": {10: (1.0, True), 11: (0.5, False), 12: (0.7, True)},
    }
    gap = first_move_gap.gap_table(results, {1: 2, 2: 5, 10: 2, 11: 5, 12: 5}, min_levels=1)
    assert "| 2 | 1, 0.900 [0.900, 0.900], 100% | 1, 1.000 [1.000, 1.000], 100% |" in gap
    assert "| 5 | 1, 0.400 [0.400, 0.400], 0% | 2, 0.600 [0.404, 0.796], 50% |" in gap


def test_compare_runs_saves_runs_to_a_file_that_stands_for_them_later(tmp_path, monkeypatch):
    """save= keeps each run's every validation per level (a level one validation did not play stays absent), and the
    file in a= or b= is those runs, in order: the comparison against it equals the one against the run folders. Seed 1
    by hand: levels 7 and 8 paired, differences +1 and -1, so +0 pts and 1.96 * sqrt(2) / sqrt(2) = 196 pts each way."""
    compare_runs = repo_module("research/compare_runs.py")
    histories = {
        "arm-seed0": {0: {7: 0.0, 8: 1.0, 9: 0.5}, 16: {7: 1.0, 8: 1.0, 9: 0.5}},
        "arm-seed1": {0: {7: 0.0, 8: 1.0, 9: 0.5}, 16: {7: 1.0, 8: 0.0}},
    }
    monkeypatch.setattr(compare_runs, "validations", lambda run, greedy=False: histories[run.name])
    folders = f"{tmp_path}/arm-seed0,{tmp_path}/arm-seed1"
    saved = tmp_path / "kept" / "arm.json"
    compare_runs.save_runs(compare_runs.load_runs(folders), saved)
    from_file = compare_runs.load_runs(str(saved))
    assert [(run.name, run.history) for run in from_file] == list(histories.items())
    against_start = compare_runs.compare([], from_file, -1, -1)  # each run against its own iteration 0
    assert against_start.startswith("b at iteration 16 against a at iteration 0 (the b runs themselves)")
    assert compare_runs.compare(from_file, from_file, 16, 0).splitlines()[1:] == against_start.splitlines()[1:]
    assert "| 1 | arm-seed1 | arm-seed1 | 50.0% | 50.0% | +0.0 pts [-196.0, +196.0] over 2 levels |" in against_start
    other = compare_runs.load_runs(f"{saved},{tmp_path}/arm-seed0")  # a file and a folder in one list
    assert [run.name for run in other] == ["arm-seed0", "arm-seed1", "arm-seed0"]
    with pytest.raises(ValueError, match="two runs of one name"):
        compare_runs.save_runs(other, tmp_path / "twice.json")
    saved.write_text('{"format": "vagen.compare_runs/1", "runs": {"x": {"levels": [1, 2], "history": {"0": [1]}}}}')
    with pytest.raises(ValueError, match="is damaged"):
        compare_runs.load_runs(str(saved))
    saved.write_text("{}")
    with pytest.raises(ValueError, match=r"not a file of compare_runs\.py save="):
        compare_runs.load_runs(str(saved))


def test_compare_runs_reads_checkpoints_saved_before_the_validation_history(tmp_path, monkeypatch):
    """A checkpoint without `val_history` still gives its start and its last validation, whose iteration comes from
    the run's metrics (the validation logged last at or before the checkpoint)."""
    compare_runs = repo_module("research/compare_runs.py")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "iter_000005").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"step": 0, "val/success": 0.5},
                {"step": 4, "val/success": 1.0},
                {"step": 5, "loss": 1.0},
                {"step": 6, "val/success": 0.0},
            ]
        )
    )
    state = {"iteration": 5, "initial_outcomes": {1: 0.0, 2: 1.0}, "val_outcomes": {1: 1.0, 2: 1.0}}
    monkeypatch.setattr(compare_runs, "latest_checkpoint", lambda run: run / "checkpoints" / "iter_000005")
    monkeypatch.setattr(compare_runs, "read_state", lambda path: state)
    assert compare_runs.validations(run_dir) == {0: {1: 0.0, 2: 1.0}, 4: {1: 1.0, 2: 1.0}}
    with pytest.raises(ValueError, match="has no greedy validations"):  # they came later (trainer.eval_greedy)
        compare_runs.validations(run_dir, greedy=True)


def bench_learning():
    """research/bench_learning.py as a module."""
    return repo_module("research/bench_learning.py")


BENCH_ONLY = {
    "eval_episodes",
    "eval_every",
    "iterations",
    "save_every",
    "keep_checkpoints",
    "viz_every",
    "lr_decay_end",
}


def assert_same_training(cfg, benched):
    """The two configs train alike: they differ only in what a benchmark must set (`BENCH_ONLY`)."""
    for section in ("env", "model", "algorithm", "filter", "rollout", "diagnostics"):
        assert cfg[section] == benched[section], section
    differing = {key for key in cfg.trainer if cfg.trainer[key] != benched.trainer[key]}
    assert differing == BENCH_ONLY, differing


def test_bench_learning_trains_with_the_default_configs():
    """bench_learning's runs differ from `scripts/train.py ~tuned algorithm=X` only in the arm and in what a benchmark
    must set (validation size and place, checkpoints, resume, logging): an arm means its overrides on train.yaml's
    base, whatever configs/tuned/ adds to the defaults later."""

    bench = bench_learning()
    for arm in ("grpo", "starpo_s", "gigpo_plr"):
        overrides = bench.training_overrides(arm, 1, Path("/tmp/x"), 16, 156, 256, [])
        assert_same_training(config(["~tuned", *bench.ARMS[arm], "seed=1"]), config(overrides))


def test_bench_learning_refuses_to_train_with_another_checkouts_code(monkeypatch, tmp_path):
    """Run from a git worktree, `research/bench_learning.py` would import the editable install's vagen (main's code)
    in its runs and paired replays: it stops first and names PYTHONPATH."""

    bench = bench_learning()
    bench.check_checkout()  # this checkout is the one installed
    monkeypatch.setattr(bench, "ROOT", tmp_path / "worktree")
    with pytest.raises(SystemExit, match=f"PYTHONPATH={tmp_path / 'worktree'} python research/bench_learning.py"):
        bench.main(["arms=grpo", f"out={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "env, arm",
    [("sokoban_visual", "gigpo_meannorm_freeze_vision_sft"), ("frozenlake_visual", "gigpo_meannorm_anneal_gamma1")],
)
def test_the_image_games_defaults_are_the_arm_measured_best(env, arm):
    """`scripts/train.py env=<game>` (train.yaml plus configs/tuned/) trains exactly as the benchmark arm that
    docs/learning.md measured best on that game."""

    bench = bench_learning()
    benched = config([*bench.training_overrides(arm, 0, Path("/tmp/x"), 16, 156, 256, []), f"env={env}"])
    assert_same_training(config([f"env={env}", "run_dir=/tmp/x"]), benched)


def test_every_bench_learning_arm_composes_and_passes_the_option_checks():
    """Each arm is a command line a benchmark runs unattended for hours: it must compose, with the game it is written
    for, and pass the checks `scripts/train.py` makes before any model loads (a typo fails here, not mid-benchmark)."""

    from vagen.trainer.config import check_overrides, validate_config

    bench = bench_learning()
    only = {"distance_shaping": "sokoban_text", "step_penalty": "sokoban_text", "credit=facts": "frozenlake_text"}
    for arm, given in bench.ARMS.items():
        games = {game for option, game in only.items() if any(option in o for o in given)}
        for env in games or ("sokoban_text", "frozenlake_visual"):
            overrides = [*bench.training_overrides(arm, 0, Path("/tmp/x"), 16, 156, 256, []), f"env={env}"]
            check_overrides(str(CONFIG_DIR), "train", overrides)
            validate_config(config(overrides))


def test_bench_learning_interval_counts_levels_not_the_samples_of_one_level():
    """Two seeds at 60% and 70% on 100 levels against a start at 50%: pooled 65%, +15 points, half-width by hand
    1.96 * sqrt(0.5 * 0.5 / 100 + 0.65 * 0.35 / 200) = 0.1182. Four samples per level change nothing; a run logged
    before `val/levels` counts its episodes (one sample per level)."""
    bench = bench_learning()
    start = {"val/success": 0.5, "val/episodes": 100.0}
    afters = [
        {"val/success": 0.6, "val/episodes": 400.0, "val/levels": 100.0},
        {"val/success": 0.7, "val/episodes": 100.0},
    ]
    mean, change, low, high = bench.arm_change(start, afters)
    assert (mean, change) == (pytest.approx(0.65), pytest.approx(0.15))
    assert (low, high) == (pytest.approx(0.15 - 0.1182, abs=1e-4), pytest.approx(0.15 + 0.1182, abs=1e-4))


@pytest.mark.slow(seconds=70)
def test_bench_learning_resumes_and_never_replays_a_validated_stage(tmp_path, monkeypatch):
    """Budgets in episodes become iterations (4 episodes each here); a rerun with a larger budget continues each run
    from its checkpoint (the earlier validation is kept as logged), and a rerun of a finished budget trains nothing."""
    bench = bench_learning()
    out = tmp_path / "bench"
    args = ["arms=grpo,gigpo", "seeds=0", "eval_episodes=4", "out=" + str(out), *VISUAL]
    bench.main([*args, "episodes=4", "eval_at=0,4"])
    first = {arm: bench.validated_at(out / f"{arm}-seed0") for arm in ("grpo", "gigpo")}
    assert all(sorted(v) == [0, 1] for v in first.values())
    bench.main([*args, "episodes=8", "eval_at=0,4,8"])
    for arm in ("grpo", "gigpo"):
        run_dir = out / f"{arm}-seed0"
        validated = bench.validated_at(run_dir)
        assert sorted(validated) == [0, 1, 2] and validated[1] == first[arm][1]
        assert (run_dir / "config.until_iter_000001.yaml").exists()  # the second segment resumed at iteration 1
    assert "### 8 episodes (iteration 2)" in (out / "summary.md").read_text() and (out / "curves.png").exists()
    # each run's row has its greedy held-out success (trainer.eval_greedy) beside the sampled one
    last_stage = (out / "summary.md").read_text().split("### 8 episodes (iteration 2)")[1]
    row = next(line for line in last_stage.splitlines() if line.startswith("| grpo | 0 |"))
    logged = next(r for r in read_metrics(out / "grpo-seed0") if r["step"] == 2 and "val/greedy_success" in r)
    assert row.split(" | ")[3] == f"{logged['val/greedy_success']:.1%}"
    calls = []
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: calls.append(a))
    bench.main([*args, "episodes=8", "eval_at=0,4,8"])
    assert calls == []


def test_bench_learning_pairs_each_run_with_the_warm_start_by_level(tmp_path):
    """The paired re-measurement plays the warm start and each run's last checkpoint k times per held-out seed (or
    once, greedily), with the runs' env and rollout settings, and its table is the per-level difference of those
    episodes."""
    from vagen.eval import outcomes_by_seed, paired_change

    bench = bench_learning()
    runs = {}
    for seed in (0, 1):
        cfg = config([*VISUAL, "trainer.iterations=1", "trainer.lr=1e-2", f"seed={seed}"])
        cfg.run_dir = str(tmp_path / f"grpo-seed{seed}")
        runs[("grpo", seed)] = train(cfg)
    out = tmp_path / "paired"
    (out / "stale").mkdir(parents=True)  # a previous bench's folder: its episodes are not these runs'
    table = bench.paired_summary(runs, samples=2, seeds=3, out_dir=out)

    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "grpo-seed0@iter1",
        "grpo-seed1@iter1",
        "tiny_vl_test",
    ]

    def check(out, table, samples, temperature):
        """Each side played every seed `samples` times at `temperature` with the runs' settings; the table's rows are
        the per-level differences of those episodes."""
        rates = {}
        for label in ("tiny_vl_test", "grpo-seed0@iter1", "grpo-seed1@iter1"):
            cell = out / label / "sokoban_visual"
            records = [json.loads(path.read_text()) for path in sorted((cell / "episodes").glob("*.json"))]
            assert [r["seed"] for r in records] == [EVAL_SEED_BASE + k for k in range(3) for _ in range(samples)]
            assert all(1 <= r["turns"] <= 2 for r in records)  # the runs' env.kwargs.max_turns=2
            assert all(r["response_tokens"] <= 12 * r["turns"] for r in records)  # their rollout.max_new_tokens=12
            assert json.loads((cell / "settings.json").read_text())["sampling"]["temperature"] == temperature
            rates[label] = {seed: sum(wins) / len(wins) for seed, wins in outcomes_by_seed(records).items()}
        base = rates["tiny_vl_test"]
        for seed in (0, 1):
            after = rates[f"grpo-seed{seed}@iter1"]
            mean, low, high, _ = paired_change(base, after)
            assert f"| grpo | {seed} | {sum(after.values()) / 3:.1%} | {bench.change_text(mean, low, high)} |" in table
        mean_after = {s: (rates["grpo-seed0@iter1"][s] + rates["grpo-seed1@iter1"][s]) / 2 for s in base}
        assert f"| grpo | 2 | {bench.change_text(*paired_change(base, mean_after)[:3])} |" in table

    check(out, table, samples=2, temperature=0.5)
    assert "3 held-out seeds x 2 samples each" in table
    assert "(tiny_vl_test, `" in table  # the start's model name, or its model.path where the runs started from one
    # paired_greedy: the same pairing with each side played once per seed, greedily
    greedy = bench.paired_summary(runs, samples=2, seeds=3, out_dir=tmp_path / "greedy", greedy=True)
    check(tmp_path / "greedy", greedy, samples=1, temperature=0.0)
    assert "3 held-out seeds x greedy decoding, once each" in greedy

    other_env = {("grpo", 0): runs[("grpo", 0)], ("grpo", 2): tmp_path / "other"}
    (tmp_path / "other").mkdir()
    cfg = config([*VISUAL, "env.kwargs.max_turns=3"])
    (tmp_path / "other" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    with pytest.raises(ValueError, match="trained another env or model than the other runs"):
        bench.paired_config(other_env, 2, 3, out)


def test_actions_per_turn_counts_the_executed_actions_of_every_turn():
    from types import SimpleNamespace

    from vagen.rollout.validation import actions_per_turn

    def episode(*executed):
        return SimpleNamespace(turns=[SimpleNamespace(info={"actions": list(a)}) for a in executed])

    played = [episode(["Up", "Up", "Left"], ["Down"]), episode([], ["Left", "Right"])]  # a malformed turn runs none
    assert actions_per_turn(played) == (3 + 1 + 0 + 2) / 4
    assert actions_per_turn([]) == 0.0
