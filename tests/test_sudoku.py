"""Sudoku: unique-solution puzzles from the seed, placements judged against the solution, text and image views."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from envs_text.sudoku import SudokuTextEnv, cell_actions, count_solutions, generate_puzzle, solved_grid
from envs_visual.sudoku import SudokuEnv, image_side, render_sudoku
from vagen.env.checker import check_env
from vagen.env.policies import POLICIES
from vagen.env.registry import make_env


def answer(*actions: str) -> str:
    return f"<think>plan</think><answer>{' || '.join(actions)}</answer>"


def is_valid_solution(grid: np.ndarray) -> bool:
    """Every row, column and box a permutation of 1..n."""
    n, b = len(grid), int(len(grid) ** 0.5)
    digits = set(range(1, n + 1))
    boxes = [grid[r : r + b, c : c + b].ravel() for r in range(0, n, b) for c in range(0, n, b)]
    return all(set(unit.tolist()) == digits for unit in [*grid, *grid.T, *boxes])


# All 288 complete 4x4 grids, by brute force: an oracle that shares no code with the solver under test.
ALL_4X4 = [
    grid
    for rows in itertools.product(itertools.permutations(range(1, 5)), repeat=4)
    if is_valid_solution(grid := np.array(rows))
]


def first_blank(env: SudokuTextEnv) -> tuple[int, int]:
    row, col = np.argwhere(env.digits == 0)[0]
    return int(row), int(col)


# ---- the environment protocol ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["text", "image", "text+image"])
@pytest.mark.parametrize("size", [4, 9])
def test_env_passes_checker(size, mode):
    short = {"max_turns": 4, "cell_px": 20} if size == 9 else {}  # keeps the 9x9 image checks fast
    check_env("vagen/Sudoku-v0", seed=3, cross_process=False, observation=mode, size=size, **short)


# ---- puzzle generation ----------------------------------------------------------------------
def test_4x4_puzzles_have_exactly_one_solution_that_agrees_with_the_givens():
    assert len(ALL_4X4) == 288
    stacked = np.stack(ALL_4X4)  # (288, 4, 4)
    for seed in range(200):
        puzzle, solution = generate_puzzle(4, 6, np.random.default_rng(seed))
        assert (puzzle == 0).sum() == 6 and is_valid_solution(solution)
        fits = ((stacked == puzzle) | (puzzle == 0)).all(axis=(1, 2))
        assert fits.sum() == 1 and np.array_equal(stacked[fits][0], solution), seed
        assert count_solutions(puzzle.ravel().tolist(), 4) == 1


@pytest.mark.parametrize("seed", range(4))
def test_9x9_puzzles_are_unique_and_consistent(seed):
    puzzle, solution = generate_puzzle(9, 40, np.random.default_rng(seed))
    assert (puzzle == 0).sum() == 40 and is_valid_solution(solution)
    assert np.array_equal(puzzle[puzzle > 0], solution[puzzle > 0])
    assert count_solutions(puzzle.ravel().tolist(), 9) == 1


def test_count_solutions_counts_up_to_the_limit():
    assert count_solutions([0] * 16, 4, limit=1000) == 288
    assert count_solutions([0] * 16, 4) == 2
    assert count_solutions([1, 1] + [0] * 14, 4) == 0  # clashing givens
    full = solved_grid(9, np.random.default_rng(0))
    assert is_valid_solution(full) and count_solutions(full.ravel().tolist(), 9) == 1


def test_same_seed_same_puzzle_and_seeds_vary():
    first, second = SudokuTextEnv(), SudokuTextEnv()
    puzzles = set()
    for seed in range(20):
        first.reset(seed=seed)
        second.reset(seed=seed)
        assert np.array_equal(first.digits, second.digits) and np.array_equal(first.solution, second.solution)
        puzzles.add(first.digits.tobytes())
    assert len(puzzles) > 15


# ---- play -----------------------------------------------------------------------------------
def test_solver_policy_solves_200_puzzles_with_the_full_return():
    env, policy, rng = SudokuTextEnv(), POLICIES.get("solver"), np.random.default_rng(0)
    for seed in range(200):
        env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, info = env.step(policy(env, rng))
            total, done = total + reward, terminated or truncated
            assert info["error"] is None
        assert info["success"] and terminated and env.solver_actions() == []
        assert total == pytest.approx(1.0 + 0.1 * 6) and env._turn == 2


def test_solver_solves_a_9x9_puzzle():
    env = SudokuTextEnv(size=9, max_actions_per_turn=10)
    env.reset(seed=5)
    done = False
    while not done:
        _, _, terminated, truncated, info = env.step(answer(*env.solver_actions()[:10]))
        done = terminated or truncated
    assert info["success"] and np.array_equal(env.digits, env.solution)


def test_correct_placement_is_written_and_rewarded_case_insensitively():
    env = SudokuTextEnv()
    env.reset(seed=1)
    row, col = first_blank(env)
    digit = int(env.solution[row, col])
    _, reward, terminated, _, info = env.step(answer(f"r{row + 1}c{col + 1}={digit}"))
    assert env.digits[row, col] == digit and reward == pytest.approx(0.1) and not terminated
    assert info["actions"] == [f"R{row + 1}C{col + 1}={digit}"] and info["action_is_effective"]


@pytest.mark.parametrize("mistake", ["wrong digit", "given cell", "filled cell"])
def test_invalid_placement_costs_the_penalty_and_stops_the_turn(mistake):
    env = SudokuTextEnv()
    env.reset(seed=2)
    row, col = first_blank(env)
    right = f"R{row + 1}C{col + 1}={env.solution[row, col]}"
    if mistake == "wrong digit":
        wrong, prefix = f"R{row + 1}C{col + 1}={env.solution[row, col] % 4 + 1}", []
    elif mistake == "given cell":
        g_row, g_col = np.argwhere(env.given)[0]
        wrong, prefix = f"R{g_row + 1}C{g_col + 1}={env.solution[g_row, g_col]}", []
    else:
        wrong, prefix = right, [right]  # the same correct placement twice: the cell is filled by then
    before = env.digits.copy()
    later = env.solver_actions()[-1]  # a correct move that must not run after the mistake
    _, reward, _, _, info = env.step(answer(*prefix, wrong, later))
    expected = before.copy()
    if prefix:
        expected[row, col] = env.solution[row, col]
    assert np.array_equal(env.digits, expected)
    assert reward == pytest.approx(0.1 * len(prefix) - 0.1)
    assert not info["action_is_valid"] and info["actions"] == prefix and "R" in info["error"]


def test_wrong_digit_error_names_a_visible_clash_not_the_answer():
    env = SudokuTextEnv()
    env.reset(seed=0)
    row, col = first_blank(env)
    clash = next(int(d) for d in env.digits[row] if d)  # a digit already in that row
    _, _, _, _, info = env.step(answer(f"R{row + 1}C{col + 1}={clash}"))
    assert f"row already has a {clash}" in info["error"]


@pytest.mark.parametrize("text", ["R1C1 = 1", "R0C1=1", "R5C5=4", "R1C1=0", "R1C1=5", "11=1", "R1C1=1=1"])
def test_malformed_placements_are_invalid_and_never_raise(text):
    env = SudokuTextEnv()
    env.reset(seed=0)
    before = env.digits.copy()
    _, reward, _, _, info = env.step(answer(text))
    assert reward == pytest.approx(-0.1) and not info["action_is_valid"] and np.array_equal(env.digits, before)


def test_turn_budget_defaults_to_the_blanks_per_turn_plus_two():
    assert SudokuTextEnv().max_turns == 4
    assert SudokuTextEnv(size=9, max_actions_per_turn=5).max_turns == 10
    assert SudokuTextEnv(max_turns=7).max_turns == 7
    assert len(SudokuTextEnv(size=9).action_names) == 729 and cell_actions(4)[0] == "R1C1=1"


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"size": 5}, "size"), ({"num_blanks": 0}, "num_blanks"), ({"num_blanks": 13}, "1..12")]
)
def test_bad_parameters_raise_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SudokuTextEnv(**kwargs)


# ---- what the player sees -------------------------------------------------------------------
def test_state_text_spells_the_grid_with_labels_and_box_rules():
    env = SudokuTextEnv(render_mode="ansi")
    env.reset(seed=4)
    lines = env.render().splitlines()
    assert lines[0].split() == ["C1", "C2", "|", "C3", "C4"] and set(lines[3].strip()) == {"-", "+"}
    rows = [line for line in lines if line.startswith("R")]
    assert [row.split()[0] for row in rows] == ["R1", "R2", "R3", "R4"]
    cells = [[0 if t == "." else int(t) for t in row.split()[1:] if t != "|"] for row in rows]
    assert np.array_equal(np.array(cells), env.digits)


def test_demo_reasoning_grounds_each_placement_of_the_turn():
    env = SudokuTextEnv()
    env.reset(seed=0)
    reasoning, plan = env.demo_reasoning(), env.solver_actions()[:3]
    for action in plan:
        cell, digit = action.split("=")
        assert cell in reasoning and (f"so {digit}." in reasoning or f"only {digit} " in reasoning)
    assert "R" in reasoning and len(reasoning) < 300


@pytest.mark.parametrize(("size", "cell_px"), [(4, 40), (4, 16), (9, 24)])
def test_image_size_is_exact_and_placements_change_it(size, cell_px):
    env = make_env("vagen/Sudoku-v0", observation="image", size=size, cell_px=cell_px)
    obs, _ = env.reset(seed=0)
    side = image_side(size, cell_px)
    assert obs.images[0].size == (side, side) and obs.images[0].mode == "RGB"
    again, _ = SudokuEnv(observation="image", size=size, cell_px=cell_px).reset(seed=0)
    assert again.images[0].tobytes() == obs.images[0].tobytes()
    after, _, _, _, _ = env.step(answer(env.unwrapped.solver_actions()[0]))
    assert after.images[0].size == (side, side) and after.images[0].tobytes() != obs.images[0].tobytes()


def test_player_digits_look_different_from_given_ones():
    digits = np.array([[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]])
    as_given = np.asarray(render_sudoku(digits, np.ones_like(digits, dtype=bool)))
    as_placed = np.asarray(render_sudoku(digits, np.zeros_like(digits, dtype=bool)))
    assert not np.array_equal(as_given, as_placed)
    with pytest.raises(ValueError, match="cell_px"):
        render_sudoku(digits, digits > 0, cell_px=4)


def test_describe_state_names_the_first_blank():
    env = SudokuEnv()
    env.reset(seed=0)
    row, col = first_blank(env)
    assert f"R{row + 1}C{col + 1}" in env.describe_state() and "6 blank" in env.describe_state()
