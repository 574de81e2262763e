"""Sokoban: generator solvability, solver optimality, hand-built dynamics, determinism, Boxoban files, text."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from envs_text.boxoban import DATA_DIR, LEVEL_SETS, load_level_set, parse_level
from envs_text.sokoban import (
    BOX,
    BOX_ON_TARGET,
    FLOOR,
    PLAYER,
    PLAYER_ON_TARGET,
    SYMBOLS,
    TARGET,
    WALL,
    SokobanLevel,
    SokobanTextEnv,
    generate_level,
    render_text,
)
from envs_text.sokoban_solver import solve


def make_env(**kwargs) -> SokobanTextEnv:
    defaults = {"max_turns": 1000, "max_actions_per_turn": 4}
    return SokobanTextEnv(**{**defaults, **kwargs})


def answer(*actions: str) -> str:
    return f"<think>plan</think><answer>{' || '.join(actions)}</answer>"


def play(env: SokobanTextEnv, plan: list[str]) -> tuple[float, bool, bool, dict]:
    """Replay `plan` through `env.step`, a few actions per turn; returns (return, terminated, truncated, info)."""
    total, terminated, truncated, info = 0.0, False, False, {}
    for start in range(0, len(plan), env.max_actions_per_turn):
        _, reward, terminated, truncated, info = env.step(answer(*plan[start : start + env.max_actions_per_turn]))
        total += reward
        if terminated or truncated:
            break
    return total, terminated, truncated, info


def naive_bfs_length(level: SokobanLevel) -> int | None:
    """Fewest moves by plain BFS over (player, frozenset(boxes)), with no pruning: the solver's referee."""
    layout = level.layout
    targets = {tuple(cell) for cell in np.argwhere(layout == TARGET).tolist()}
    start = (level.player, frozenset(level.boxes))
    depth, queue = {start: 0}, deque([start])
    while queue:
        state = queue.popleft()
        (row, col), boxes = state
        if boxes == targets:
            return depth[state]
        for d_row, d_col in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            ahead = (row + d_row, col + d_col)
            if layout[ahead] == WALL:
                continue
            new_boxes = boxes
            if ahead in boxes:
                beyond = (ahead[0] + d_row, ahead[1] + d_col)
                if layout[beyond] == WALL or beyond in boxes:
                    continue
                new_boxes = (boxes - {ahead}) | {beyond}
            child = (ahead, new_boxes)
            if child not in depth:
                depth[child] = depth[state] + 1
                queue.append(child)
    return None


# ---- tiles and text ---------------------------------------------------------------------------
def test_tile_codes_and_symbols_are_the_shared_contract():
    assert tuple(range(7)) == (WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET)
    assert SYMBOLS == {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}


def test_text_round_trip_and_state_text_follows_grid():
    text = "######\n#S_X_#\n#√__O#\n#_X__#\n######"
    level = SokobanLevel.from_text(text)
    assert level.text() == text
    assert level.player == (1, 1) and level.boxes == ((1, 3), (2, 1), (3, 2))
    env = make_env()
    obs, _ = env.reset(options={"level": level})
    assert env.grid().dtype == np.uint8 and env.grid().shape == (5, 6)
    assert np.array_equal(env.grid(), level.grid())
    assert obs.text.endswith("Current state:\n" + text)
    for symbol in SYMBOLS.values():
        assert symbol in env._rules_text()
    for action in ("Up", "Down", "Left", "Right"):
        assert action in env._rules_text()
    assert render_text(np.array([[WALL, BOX_ON_TARGET], [PLAYER_ON_TARGET, TARGET]])) == "#√\nSO"


def test_cell_separator_puts_the_same_cells_apart_and_rejects_a_newline():
    text = "######\n#S_X_#\n#√__O#\n#_X__#\n######"
    env = make_env(cell_separator=" ")
    obs, _ = env.reset(options={"level": SokobanLevel.from_text(text)})
    assert obs.text.endswith("Current state:\n" + "\n".join(" ".join(row) for row in text.splitlines()))
    assert np.array_equal(env.grid(), SokobanLevel.from_text(text).grid())  # only the text changes
    for bad in ("\n", 3):
        with pytest.raises(ValueError, match="cell_separator must be a string without a newline"):
            make_env(cell_separator=bad)


def test_list_positions_adds_a_line_of_coordinates_that_follows_the_moves():
    text = "######\n#S_X_#\n#√__O#\n#_X__#\n######"
    env = make_env(list_positions=True)
    obs, _ = env.reset(options={"level": SokobanLevel.from_text(text)})
    grid_text, positions = obs.text.split("Current state:\n")[1].rsplit("\n", 1)
    assert grid_text == text
    assert positions == (
        "Positions (row, col; row 0 is the top): player (1, 1); box (1, 3); box (2, 1); box (3, 2); "
        "target (1, 1); target (2, 1); target (2, 4)."
    )
    obs, *_ = env.step("<think>go</think><answer>Down</answer>")  # pushes the box on (2, 1) off its target
    assert obs.text.endswith(
        "player (2, 1); box (1, 3); box (3, 1); box (3, 2); target (1, 1); target (2, 1); target (2, 4)."
    )
    with pytest.raises(ValueError, match="list_positions must be true or false"):
        make_env(list_positions="yes")


def test_reading_walls_names_the_walls_next_to_the_box_and_labels_every_tile():
    """The warm start's reading with `reading_walls`, and the tile facts the vision pre-training learns it from."""
    level = SokobanLevel.from_text("######\n#P_X_#\n#___O#\n#____#\n######")
    env = make_env(reading_walls=True)
    env.reset(options={"level": level})
    assert env.demo_reasoning() == "box is right of me, target is down-right of box, walls up of box."
    facts = env.tile_facts()  # (H·W, 4): wall up, down, left, right of each tile; off the board counts as wall
    assert facts.shape == (30, 4) and facts[1 * 6 + 3].tolist() == [1, 0, 0, 0]
    assert facts[0].tolist() == [1, 1, 1, 1] and facts[1 * 6 + 1].tolist() == [1, 0, 1, 0]
    env.step("<think>go</think><answer>Down</answer>")  # the player steps down; the box stays
    env.step("<think>go</think><answer>Right || Right</answer>")  # now under the box, next to the target row
    assert env.demo_reasoning() == "box is up of me, target is down-right of box, walls up of box."
    open_level = SokobanLevel.from_text("#######\n#P____#\n#__X__#\n#___O_#\n#######")
    env.reset(options={"level": open_level})
    assert env.demo_reasoning() == "box is down-right of me, target is down-right of box, no wall next to box."
    plain = make_env()
    plain.reset(options={"level": level})
    assert plain.demo_reasoning() == "box is right of me, target is down-right of box." and plain.tile_facts() is None
    unlabelled = make_env(reading_walls=True, wall_labels=False)
    unlabelled.reset(options={"level": level})
    assert unlabelled.demo_reasoning().endswith("walls up of box.") and unlabelled.tile_facts() is None
    with pytest.raises(ValueError, match="reading_walls must be true or false"):
        make_env(reading_walls="yes")


def test_reading_push_names_the_direction_of_the_solver_plans_first_push():
    """Replaying the solver's plan one move at a time, the first move after which the boxes stand elsewhere is the
    push the reading names; without a plan (an unsolvable level) the reading has no push."""
    env, plain = make_env(reading_push=True), make_env()
    for seed in range(6):
        env.reset(seed=seed)
        plain.reset(seed=seed)
        plan = env.solver_actions()
        reading = env.demo_reasoning()
        assert reading.startswith(plain.demo_reasoning()[:-1])
        boxes = np.isin(env.grid(), (BOX, BOX_ON_TARGET))
        for action in plan:
            env.step(f"<think>go</think><answer>{action}</answer>")
            if not np.array_equal(np.isin(env.grid(), (BOX, BOX_ON_TARGET)), boxes):
                break
        assert reading.endswith(f", push box {action.lower()} first.")
    stuck = SokobanLevel.from_text("######\n#P_X_#\n#___O#\n#____#\n######")  # the box can never leave row 1
    env.reset(options={"level": stuck})
    assert env.solver_actions() == [] and env.demo_reasoning() == "box is right of me, target is down-right of box."
    with pytest.raises(ValueError, match="reading_push must be true or false"):
        make_env(reading_push=1)


def test_invalid_levels_raise_with_a_reason():
    with pytest.raises(ValueError, match="border"):
        SokobanLevel.from_text("#####\n#P_XO\n#####")
    with pytest.raises(ValueError, match="targets as boxes"):
        SokobanLevel.from_text("######\n#PXXO#\n######")
    with pytest.raises(ValueError, match="one player"):
        SokobanLevel.from_text("######\n#_XO_#\n######")


# ---- dynamics on hand-built levels ------------------------------------------------------------
def start(text: str, **kwargs) -> SokobanTextEnv:
    env = make_env(**kwargs)
    env.reset(options={"level": SokobanLevel.from_text(text)})
    return env


def test_push_into_wall_or_box_does_nothing_but_costs_the_step():
    env = start("######\n#PXXO#\n#__O_#\n######")
    before = env.grid().copy()
    _, reward, terminated, truncated, info = env.step(answer("Right"))  # box into box
    assert reward == pytest.approx(-0.1) and not info["action_is_effective"]
    assert np.array_equal(env.grid(), before) and not terminated and not truncated
    _, reward, _, _, info = env.step(answer("Up"))  # walk into a wall
    assert reward == pytest.approx(-0.1) and not info["action_is_effective"]
    env = start("#####\n#_PX#\n#__O#\n#####")
    before = env.grid().copy()
    _, reward, _, _, info = env.step(answer("Right"))  # box into a wall
    assert reward == pytest.approx(-0.1) and not info["action_is_effective"]
    assert np.array_equal(env.grid(), before)


def test_mark_no_effect_names_the_moves_that_changed_nothing():
    """Off (the default), the feedback lists the executed moves as before; on, each move into a wall says so."""
    level = "######\n#PX_O#\n#____#\n######"
    plain, marked = start(level), start(level, mark_no_effect=True)
    plain_obs, *_ = plain.step(answer("Up", "Right"))
    marked_obs, reward, _, _, info = marked.step(answer("Up", "Right"))  # Up walks into the wall, Right pushes
    assert "Executed: Up, Right. Reward: -0.2." in plain_obs.text
    assert "Executed: Up (no effect), Right. Reward: -0.2." in marked_obs.text
    assert reward == pytest.approx(-0.2) and info["action_is_effective"]  # the mark changes text only
    assert marked_obs.text.replace(" (no effect)", "") == plain_obs.text
    with pytest.raises(ValueError, match="mark_no_effect must be true or false"):
        make_env(mark_no_effect="yes")


def test_box_onto_and_off_target_rewards():
    env = start("#######\n#PX_O_#\n#_X__O#\n#_____#\n#######")
    _, reward, _, _, info = env.step(answer("Right"))  # box to (1, 3): floor
    assert reward == pytest.approx(-0.1) and info["action_is_effective"]
    _, reward, terminated, _, info = env.step(answer("Right"))  # box onto the target at (1, 4)
    assert reward == pytest.approx(0.9) and not terminated and not info["success"]
    assert env.grid()[1, 4] == BOX_ON_TARGET and env.grid()[1, 3] == PLAYER
    _, reward, _, _, _ = env.step(answer("Right"))  # box off the target again
    assert reward == pytest.approx(-1.1)
    assert env.grid()[1, 4] == PLAYER_ON_TARGET and env.grid()[1, 5] == BOX


def test_success_reward_and_termination():
    env = start("######\n#PX_O#\n######")
    _, reward, terminated, truncated, info = env.step(answer("Right", "Right", "Left"))
    assert reward == pytest.approx(-0.2 + 1.0 + 10.0)
    assert terminated and not truncated and info["success"]
    assert info["actions"] == ["Right", "Right"]  # nothing runs after the level is solved


def test_distance_shaping_telescopes_and_prices_dead_ends():
    """c · (d before − d after) per action: a solving episode earns c · d0 on top of the plain rewards; pushing
    the box into a corner (no solution left) costs c · (dead-end distance − d0)."""
    level = "#######\n#_____#\n#_PX_O#\n#_____#\n#######"
    plain, shaped = start(level), start(level, distance_shaping=0.5)
    assert shaped.unwrapped._solution_distance() == 2
    _, r_plain, *_ = plain.step(answer("Right", "Right"))
    _, r_shaped, terminated, _, info = shaped.step(answer("Right", "Right"))
    assert terminated and info["success"] and r_shaped == pytest.approx(r_plain + 0.5 * 2)
    cornered = start("######\n#____#\n#_XP_#\n#___O#\n######", distance_shaping=0.5)
    d0 = cornered.unwrapped._solution_distance()
    _, reward, *_ = cornered.step(answer("Left"))  # box into the left wall: no solution left
    assert reward == pytest.approx(-0.1 + 0.5 * (d0 - 2 * (5 + 6)))
    with pytest.raises(ValueError, match="distance_shaping"):
        make_env(distance_shaping=-1.0)


def test_step_penalty_is_the_cost_of_each_action():
    """Default -0.1 per action (gym-sokoban's); step_penalty=0 leaves only the box and success rewards."""
    level = "#######\n#_____#\n#_PX_O#\n#_____#\n#######"
    _, reward, *_ = start(level, step_penalty=-0.3).step(answer("Up", "Down"))  # two effective non-pushes
    assert reward == pytest.approx(-0.6)
    free = start(level, step_penalty=0.0)
    _, reward, *_ = free.step(answer("Up", "Down", "Left"))
    assert reward == 0.0
    _, reward, terminated, _, info = free.step(answer("Right", "Right", "Right"))
    assert terminated and info["success"] and reward == pytest.approx(1.0 + 10.0)
    with pytest.raises(ValueError, match="step_penalty"):
        make_env(step_penalty=0.1)


def test_step_penalty_on_solve_charges_every_action_at_the_solve_and_nothing_on_a_failure():
    """Worked example, level `#_PX_O#` (box two pushes from its target), step_penalty -0.1: a 6-action solve
    (Up, Down, Left; then Right, and two pushes, the second onto the target) earns 0 on the first turn and
    1 + 10 - 0.6 on the solving one, the same return as the per-action charge; a failed episode pays none."""
    level = "#######\n#_____#\n#_PX_O#\n#_____#\n#######"
    plain, on_solve = start(level), start(level, step_penalty_on_solve=True)
    first = [env.step(answer("Up", "Down", "Left"))[1] for env in (plain, on_solve)]
    assert first == [pytest.approx(-0.3), 0.0]
    _, r_plain, *_ = plain.step(answer("Right", "Right", "Right"))
    _, r_solve, terminated, _, info = on_solve.step(answer("Right", "Right", "Right"))
    assert terminated and info["success"] and info["actions"] == ["Right", "Right", "Right"]
    assert r_solve == pytest.approx(1.0 + 10.0 - 0.1 * 6) and sum(first) + r_plain == pytest.approx(r_solve)
    failing = start(level, step_penalty_on_solve=True, max_turns=2)
    returns = [failing.step(answer("Up", "Down", "Up"))[1] for _ in range(2)]
    assert returns == [0.0, 0.0] and failing.unwrapped._steps == 6
    with pytest.raises(ValueError, match="step_penalty_on_solve"):
        make_env(step_penalty_on_solve="yes")


def test_max_steps_truncates_and_stops_the_turn():
    env = start("######\n#PX_O#\n######", max_steps=3)
    _, reward, terminated, truncated, info = env.step(answer("Up", "Up", "Up", "Right"))
    assert info["actions"] == ["Up", "Up", "Up"]
    assert reward == pytest.approx(-0.3) and truncated and not terminated and not info["success"]


def test_max_steps_counts_across_turns():
    env = start("######\n#PX_O#\n######", max_steps=2)
    _, _, _, truncated, _ = env.step(answer("Up"))
    assert not truncated
    _, _, _, truncated, info = env.step(answer("Down", "Right"))
    assert truncated and info["actions"] == ["Down"]


# ---- generation, solving, determinism ---------------------------------------------------------
def test_generated_1box_levels_are_solved_by_replaying_the_solver_plan():
    env = make_env()
    for seed in range(500):
        env.reset(seed=seed)
        level = env.current_level()
        assert level.layout.shape == (6, 6) and level.num_boxes == 1 and not level.is_solved()
        plan = env.solver_actions()
        # Reverse play keeps only states >= 2 pushes from solved: no one-move levels.
        assert len(plan) >= 2, f"seed {seed}: plan {plan} for\n{level.text()}"
        total, terminated, truncated, info = play(env, plan)
        assert terminated and not truncated and info["success"], f"seed {seed}: plan {plan} failed"
        assert total == pytest.approx(-0.1 * len(plan) + 1.0 + 10.0)


@pytest.mark.parametrize(("num_boxes", "seeds", "dim_room"), [(2, 60, (6, 6)), (3, 30, (7, 7)), (4, 10, (8, 8))])
def test_generated_multibox_levels_are_solvable(num_boxes, seeds, dim_room):
    env = make_env(num_boxes=num_boxes, dim_room=dim_room)
    for seed in range(seeds):
        env.reset(seed=seed)
        level = env.current_level()
        level.validate()
        assert level.num_boxes == num_boxes and level.layout.shape == dim_room and not level.is_solved()
        plan = env.solver_actions()
        assert len(plan) >= 2
        _, terminated, _, info = play(env, plan)
        assert terminated and info["success"], f"seed {seed}:\n{level.text()}"


def test_solver_plans_have_the_fewest_moves():
    rng = np.random.default_rng(7)
    for num_boxes in (1, 1, 2, 2, 3):
        for _ in range(12):
            level = generate_level(rng, (6, 6), num_boxes)
            assert len(solve(level)) == naive_bfs_length(level), level.text()


def test_solver_reports_unsolvable_and_budget_and_solved():
    cornered = SokobanLevel.from_text("######\n#X_PO#\n######")  # box against the end wall
    assert solve(cornered) is None and naive_bfs_length(cornered) is None
    assert solve(SokobanLevel.from_text("#####\n#P√_#\n#####")) == []
    hard = load_level_set("boxoban_hard")[0]
    assert solve(hard, max_states=50) is None


def test_same_seed_same_level_and_seeds_differ():
    first = [make_env().reset(seed=seed)[0].text for seed in range(30)]
    again = [make_env().reset(seed=seed)[0].text for seed in range(30)]
    assert first == again
    assert len(set(first)) >= 25
    assert generate_level(np.random.default_rng(5), (7, 8), 2) == generate_level(np.random.default_rng(5), (7, 8), 2)


def test_generator_rejects_bad_sizes():
    with pytest.raises(ValueError, match="dim_room"):
        SokobanTextEnv(dim_room=(3, 6))
    with pytest.raises(ValueError, match="num_boxes"):
        generate_level(np.random.default_rng(0), (6, 6), 0)
    with pytest.raises(RuntimeError, match="larger dim_room"):
        generate_level(np.random.default_rng(0), (5, 5), 5, max_attempts=20)


# ---- Boxoban ----------------------------------------------------------------------------------
def level_zero_rows(file_name: str) -> list[str]:
    lines = (DATA_DIR / file_name).read_text().splitlines()
    assert lines[0] == "; 0"
    return lines[1:11]


@pytest.mark.parametrize("level_set", sorted(LEVEL_SETS))
def test_boxoban_level_zero_matches_the_file_and_is_playable(level_set):
    rows = level_zero_rows(LEVEL_SETS[level_set])
    levels = load_level_set(level_set)
    assert len(levels) == 1000
    grid = levels[0].grid()
    expected = {"#": WALL, " ": FLOOR, ".": TARGET, "$": BOX, "@": PLAYER}
    assert grid.shape == (10, 10)
    for row, line in enumerate(rows):
        assert [expected[char] for char in line] == grid[row].tolist()
    assert levels[0].num_boxes == 4
    env = make_env(level_set=level_set, max_steps=1000)
    env.reset(seed=0)
    assert np.array_equal(env.grid(), grid)
    _, terminated, _, info = play(env, env.solver_actions())
    assert terminated and info["success"]


def test_boxoban_seeds_wrap_around_the_panel_and_random_pick():
    """Seed i plays level i mod the panel size: the evaluator's seeds 1e9 + k play the panel in file order."""
    levels = load_level_set("boxoban_test")
    panel = make_env(level_set="boxoban_test", num_levels=100)
    for seed, index in ((0, 0), (7, 7), (1000, 0), (1_000_000_000 + 42, 42), (1_000_000_000 + 142, 42)):
        panel.reset(seed=seed)
        assert panel.current_level() == levels[index]
    with pytest.raises(ValueError, match=r"num_levels must be in 1\.\.1000"):
        make_env(level_set="boxoban_test", num_levels=0)
    with pytest.raises(ValueError, match="set level_set"):
        make_env(num_levels=10)
    env = make_env(level_set="boxoban_test")
    env.reset(seed=None)
    assert any(env.current_level() == level for level in load_level_set("boxoban_test"))
    with pytest.raises(ValueError, match="Unknown level_set"):
        make_env(level_set="boxoban_nope")


def test_boxoban_parses_box_and_player_on_target():
    level = parse_level(["#####", "#+$*#", "#####"])
    assert level.player == (1, 1) and level.boxes == ((1, 2), (1, 3))
    assert level.text() == "#####\n#SX√#\n#####"


def test_actions_beyond_the_turn_limit_are_counted_and_priced():
    env = start("#######\n#P____#\n#_X_O_#\n#_____#\n#######", max_actions_per_turn=2)
    _, reward, _, _, info = env.step(answer("Right", "Right", "Down", "Down"))
    assert info["actions"] == ["Right", "Right"] and info["dropped_actions"] == 2
    assert reward == pytest.approx(-0.2 + env.format_penalty) and "beyond max_actions_per_turn=2" in info["error"]
    _, reward, _, _, info = env.step(answer("Left"))
    assert info["dropped_actions"] == 0 and info["error"] is None and reward == pytest.approx(-0.1)
