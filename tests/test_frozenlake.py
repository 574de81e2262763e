"""FrozenLake: Gymnasium-exact dynamics, solvable random maps, text and grid views."""

from __future__ import annotations

from collections import Counter, defaultdict

import gymnasium
import numpy as np
import pytest

from envs_text.frozenlake import (
    ACTIONS,
    FROZEN,
    GOAL,
    HOLE,
    PLAYER,
    PLAYER_IN_HOLE,
    PLAYER_ON_GOAL,
    FrozenLakeTextEnv,
    random_map,
    shortest_path,
    transition_table,
    validate_desc,
)

MAP_4X4 = ["SFFF", "FHFH", "FFFH", "HFFG"]
MAP_8X8 = ["SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG"]
RANDOM_MAP = list(random_map(5, 0.7, np.random.default_rng(7)))


def answer(*actions: str) -> str:
    return f"<think>plan</think><answer>{' || '.join(actions)}</answer>"


def per_next_state(outcomes) -> dict[tuple[int, float, bool], float]:
    """Probability mass per (next state, reward, terminated), zero-probability entries dropped."""
    mass: dict[tuple[int, float, bool], float] = defaultdict(float)
    for prob, state, reward, terminated in outcomes:
        if prob > 0:
            mass[(int(state), float(reward), bool(terminated))] += prob
    return dict(mass)


@pytest.mark.parametrize("desc", [MAP_4X4, MAP_8X8, RANDOM_MAP], ids=["4x4", "8x8", "random"])
@pytest.mark.parametrize("success_rate", [1.0, 0.8, 1 / 3, 0.0])
def test_transition_table_equals_gymnasium(desc, success_rate):
    reference = gymnasium.make("FrozenLake-v1", desc=desc, is_slippery=True, success_rate=success_rate).unwrapped.P
    mine = transition_table(desc, success_rate)
    assert mine.keys() == reference.keys()
    for state in reference:
        assert mine[state].keys() == reference[state].keys()
        for action in reference[state]:
            ours, theirs = per_next_state(mine[state][action]), per_next_state(reference[state][action])
            assert ours.keys() == theirs.keys(), (state, action)
            for key in theirs:
                assert ours[key] == pytest.approx(theirs[key]), (state, action, key)


def test_transition_table_non_slippery_equals_gymnasium_deterministic():
    reference = gymnasium.make("FrozenLake-v1", desc=MAP_4X4, is_slippery=False).unwrapped.P
    mine = transition_table(MAP_4X4, 1.0)
    for state in reference:
        for action in reference[state]:
            assert mine[state][action] == reference[state][action]


def test_sampled_steps_follow_transition_probabilities():
    # From the start of the 4x4 map, "Right" with success_rate 0.8: right 0.8, down 0.1, up (= stay) 0.1.
    env = FrozenLakeTextEnv(desc=MAP_4X4, success_rate=0.8, max_actions_per_turn=1)
    expected = per_next_state(transition_table(MAP_4X4, 0.8)[0][ACTIONS.index("Right")])
    counts: Counter[int] = Counter()
    env.reset(seed=0)
    trials = 3000
    for _ in range(trials):
        env.reset()
        env.step(answer("Right"))
        counts[env.player[0] * 4 + env.player[1]] += 1
    assert set(counts) == {state for state, _, _ in expected}
    chi_square = sum((counts[state] - trials * prob) ** 2 / (trials * prob) for (state, _, _), prob in expected.items())
    assert chi_square < 13.8  # 99.9% quantile of chi-square with 2 degrees of freedom


def test_random_maps_are_solvable_with_distinct_start_and_goal():
    env = FrozenLakeTextEnv(size=4, p_frozen=0.6)
    for seed in range(50):
        env.reset(seed=seed)
        rows = env.desc
        assert sum(row.count("S") for row in rows) == 1 and sum(row.count("G") for row in rows) == 1
        plan = env.solver_actions()
        assert plan, f"seed {seed} has no path on {rows}"
        _, reward, terminated, _, info = env.step(answer(*plan[:3]))
        while not terminated:
            _, reward, terminated, _, info = env.step(answer(*env.solver_actions()[:3]))
        assert info["success"] and reward == 1.0


def test_random_maps_vary_and_are_deterministic_per_seed():
    env_a, env_b = FrozenLakeTextEnv(success_rate=0.8), FrozenLakeTextEnv(success_rate=0.8)
    maps = set()
    for seed in range(10):
        obs_a, _ = env_a.reset(seed=seed)
        obs_b, _ = env_b.reset(seed=seed)
        assert obs_a.text == obs_b.text and env_a.desc == env_b.desc
        maps.add(env_a.desc)
        for actions in (["Right", "Down"], ["Up", "Left", "Down"]):
            step_a, step_b = env_a.step(answer(*actions)), env_b.step(answer(*actions))
            assert step_a[0].text == step_b[0].text and step_a[1:] == step_b[1:]
            if step_a[2] or step_a[3]:
                break
    assert len(maps) > 5


def test_goal_terminates_with_reward_one_and_success():
    env = FrozenLakeTextEnv(desc=["SG", "FF"], render_mode="ansi")
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(answer("Right", "Down"))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["actions"] == ["Right"]  # the move after the goal is never executed
    assert env.grid()[0, 1] == PLAYER_ON_GOAL
    assert env.render().splitlines() == ["_√", "__"]


def test_hole_terminates_with_reward_zero_and_no_success():
    env = FrozenLakeTextEnv(desc=["SH", "FG"], render_mode="ansi")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(answer("Right"))
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    assert env.grid()[0, 1] == PLAYER_IN_HOLE
    assert env.render().splitlines() == ["_X", "_G"]
    assert env.solver_actions() == []


def test_max_steps_truncates():
    env = FrozenLakeTextEnv(desc=["SFFG"], max_steps=2, max_turns=10)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step(answer("Left", "Left", "Left"))
    assert (terminated, truncated) == (False, True)
    assert info["actions"] == ["Left", "Left"] and not info["action_is_effective"]


def test_grid_codes_and_text_symbols():
    env = FrozenLakeTextEnv(desc=MAP_4X4, render_mode="ansi")
    env.reset(seed=0)
    grid = env.grid()
    assert grid.dtype == np.uint8 and grid.shape == (4, 4)
    assert grid[0, 0] == PLAYER and grid[1, 1] == HOLE and grid[3, 3] == GOAL and grid[0, 1] == FROZEN
    assert (FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL) == (0, 1, 2, 3, 4, 5)
    assert env.render().splitlines() == ["P___", "_O_O", "___O", "O__G"]
    env.step(answer("Down"))
    assert env.render().splitlines()[:2] == ["____", "PO_O"]  # the start cell is plain ice once left


def test_cell_separator_puts_the_cells_of_a_row_apart():
    env = FrozenLakeTextEnv(desc=MAP_4X4, render_mode="ansi", cell_separator=" ")
    env.reset(seed=0)
    assert env.render().splitlines() == ["P _ _ _", "_ O _ O", "_ _ _ O", "O _ _ G"]
    with pytest.raises(ValueError, match="cell_separator must be a string without a newline"):
        FrozenLakeTextEnv(desc=MAP_4X4, cell_separator="\n")


def test_list_positions_adds_a_line_of_coordinates_that_follows_the_player():
    env = FrozenLakeTextEnv(desc=MAP_4X4, list_positions=True)
    obs, _ = env.reset(seed=0)
    grid_text, positions = obs.text.split("Current state:\n")[1].rsplit("\n", 1)
    assert grid_text.splitlines() == ["P___", "_O_O", "___O", "O__G"]
    assert positions == (
        "Positions (row, col; row 0 is the top): player (0, 0); goal (3, 3); hole (1, 1); hole (1, 3); hole (2, 3); "
        "hole (3, 0)."
    )
    obs, *_ = env.step(answer("Right"))
    assert "player (0, 1); goal (3, 3);" in obs.text
    with pytest.raises(ValueError, match="list_positions must be true or false"):
        FrozenLakeTextEnv(desc=MAP_4X4, list_positions=1)


def test_solver_is_a_shortest_path():
    env = FrozenLakeTextEnv(desc=MAP_4X4)
    env.reset(seed=0)
    assert len(env.solver_actions()) == 6
    assert shortest_path(MAP_4X4, (0, 0)) == env.solver_actions()
    assert shortest_path(["SH", "HG"], (0, 0)) is None


def test_rules_mention_slipperiness_only_when_slippery():
    slippery, _ = FrozenLakeTextEnv(desc=MAP_4X4, success_rate=0.8).reset(seed=0)
    firm, _ = FrozenLakeTextEnv(desc=MAP_4X4).reset(seed=0)
    assert "slippery" in slippery.text and "0.8" in slippery.text
    assert "slippery" not in firm.text
    assert all(name in firm.text for name in ACTIONS)


@pytest.mark.parametrize(
    ("desc", "message"),
    [
        (["SFF", "FG"], "same length"),
        (["SFX", "FFG"], "unknown tile"),
        (["FFF", "FFG"], "exactly one start"),
        (["SFF", "FFF"], "no goal"),
        ("SFFG", "list of row strings"),
    ],
)
def test_bad_desc_raises_with_cause(desc, message):
    with pytest.raises(ValueError, match=message):
        validate_desc(desc)
    with pytest.raises(ValueError, match=message):
        FrozenLakeTextEnv(desc=desc)


def test_unsolvable_desc_warns_and_bad_parameters_raise():
    with pytest.warns(UserWarning, match="no hole-free path"):
        FrozenLakeTextEnv(desc=["SH", "HG"])
    with pytest.raises(ValueError, match="success_rate"):
        FrozenLakeTextEnv(success_rate=1.5)
    with pytest.raises(ValueError, match="p_frozen"):
        FrozenLakeTextEnv(p_frozen=0.0)


def test_hole_labels_give_every_tile_its_hole_neighbours():
    """`tile_facts` with `hole_labels` (the vision pre-training's extra labels): hole up, down, left, right of each
    tile, off the board not a hole; at the player's tile they are the holes `demo_reasoning` names."""
    env = FrozenLakeTextEnv(desc=MAP_4X4, hole_labels=True)
    env.reset(seed=0)
    facts = env.tile_facts()
    assert facts.shape == (16, 4)
    assert facts[0].tolist() == [0, 0, 0, 0]  # (0, 0): nothing below or right of it is a hole
    assert facts[1].tolist() == [0, 1, 0, 0] and facts[6].tolist() == [0, 0, 1, 1]  # (0, 1) above H; (1, 2) between two
    env.step(answer("Down", "Down"))  # to (2, 0): a hole below (3, 0)
    assert env.demo_reasoning().endswith("holes down.") and facts[2 * 4 + 0].tolist() == [0, 1, 0, 0]
    assert FrozenLakeTextEnv(desc=MAP_4X4).tile_facts() is None
    with pytest.raises(ValueError, match="hole_labels must be true or false"):
        FrozenLakeTextEnv(hole_labels="yes")
