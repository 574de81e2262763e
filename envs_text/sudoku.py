"""Sudoku as a language game: fill the blank cells of a 4×4 or 9×9 grid, a few placements per turn.

Puzzles are generated from `np_random` alone: a full grid (a base pattern with relabelled digits
and shuffled rows, columns, bands and stacks), then cells are blanked one by one in random order,
each kept blank only if the puzzle still has exactly one solution (`count_solutions`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from vagen.env.base import ActionResult, LanguageEnv

SIZES = (4, 9)
DEFAULT_BLANKS = {4: 6, 9: 40}
MAX_BLANKS = {4: 12, 9: 56}  # 4x4: a puzzle needs >= 4 clues; 9x9: beyond 56, greedy blanking needs many grids
SOLVE_REWARD = 1.0
_ACTION_RE = re.compile(r"R(\d)C(\d)=(\d)")


def box_side(size: int) -> int:
    """Side of one box: 2 for a 4×4 grid, 3 for 9×9."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES} (a 4x4 grid with 2x2 boxes or 9x9 with 3x3), got {size!r}.")
    return math.isqrt(size)


def cell_actions(size: int) -> tuple[str, ...]:
    """Every placement name "R{row}C{col}={digit}" (1-based), row-major then by digit: size³ names."""
    box_side(size)
    digits = range(1, size + 1)
    return tuple(f"R{r}C{c}={d}" for r in digits for c in digits for d in digits)


def _shuffled_lines(size: int, rng: np.random.Generator) -> list[int]:
    """A line order that keeps Sudoku validity: bands (stacks) permuted, lines permuted inside each."""
    side = box_side(size)
    return [int(band) * side + int(line) for band in rng.permutation(side) for line in rng.permutation(side)]


def solved_grid(size: int, rng: np.random.Generator) -> np.ndarray:
    """A random complete, valid (size, size) grid of digits 1..size (int64).

    Base pattern (r // b + b·(r % b) + c) mod size, then digit relabelling and row/column
    shuffles that keep every row, column and box a permutation.
    """
    side = box_side(size)
    r, c = np.indices((size, size))
    pattern = (r // side + side * (r % side) + c) % size  # (size, size) in 0..size-1
    relabel = rng.permutation(size) + 1
    return relabel[pattern][np.ix_(_shuffled_lines(size, rng), _shuffled_lines(size, rng))]


def count_solutions(cells: list[int], size: int, limit: int = 2) -> int:
    """How many ways the blanks (0) of a row-major list of `size`² digits can be completed, counting
    up to `limit` (so `== 1` means unique). Bitmask backtracking, most-constrained cell first."""
    side, full = box_side(size), (1 << size) - 1
    rows, cols, boxes = [0] * size, [0] * size, [0] * size
    blanks = []
    for index, digit in enumerate(cells):
        r, c = divmod(index, size)
        k = (r // side) * side + c // side
        if digit:
            bit = 1 << (digit - 1)
            if (rows[r] | cols[c] | boxes[k]) & bit:
                return 0  # the givens already clash
            rows[r], cols[c], boxes[k] = rows[r] | bit, cols[c] | bit, boxes[k] | bit
        else:
            blanks.append((r, c, k))

    def search(todo: list[tuple[int, int, int]]) -> int:
        if not todo:
            return 1
        best, best_free, best_count = 0, 0, size + 1
        for position, (r, c, k) in enumerate(todo):
            free = full & ~(rows[r] | cols[c] | boxes[k])
            count = free.bit_count()
            if count < best_count:
                best, best_free, best_count = position, free, count
                if count <= 1:
                    break
        r, c, k = todo[best]
        rest = todo[:best] + todo[best + 1 :]
        total = 0
        while best_free and total < limit:
            bit = best_free & -best_free
            best_free ^= bit
            rows[r], cols[c], boxes[k] = rows[r] | bit, cols[c] | bit, boxes[k] | bit
            total += search(rest)
            rows[r], cols[c], boxes[k] = rows[r] ^ bit, cols[c] ^ bit, boxes[k] ^ bit
        return total

    return min(search(blanks), limit)


def generate_puzzle(
    size: int, num_blanks: int, rng: np.random.Generator, max_tries: int = 50
) -> tuple[np.ndarray, np.ndarray]:
    """(puzzle, solution): (size, size) int64 arrays, the puzzle with exactly `num_blanks` zeros and
    exactly one completion, which is `solution`. Cells are blanked in random order, each kept blank
    only if the solution stays unique; a grid that cannot reach `num_blanks` is redrawn."""
    for _ in range(max_tries):
        solution = solved_grid(size, rng)
        cells = solution.flatten().tolist()
        blanked = 0
        for index in rng.permutation(size * size).tolist():
            if blanked == num_blanks:
                break
            cells[index] = 0
            if count_solutions(cells, size) == 1:
                blanked += 1
            else:
                cells[index] = int(solution.flat[index])
        if blanked == num_blanks:
            return np.array(cells, dtype=np.int64).reshape(size, size), solution
    raise RuntimeError(
        f"No {size}x{size} puzzle with {num_blanks} blanks and a unique solution in {max_tries} grids; "
        "lower num_blanks."
    )


def cell_name(row: int, col: int) -> str:
    """The 1-based name of a 0-based cell: (0, 1) -> "R1C2"."""
    return f"R{row + 1}C{col + 1}"


class SudokuTextEnv(LanguageEnv):
    """Sudoku with text observations.

    ## Description
    A `size` x `size` grid (4: 2x2 boxes, 9: 3x3 boxes) with `num_blanks` blank cells and exactly
    one solution. Fill every blank so that each row, column and box holds each digit 1..size once.

    ## Actions
    "R{row}C{col}={digit}", 1-based, e.g. `R2C3=4` (any letter case, no spaces): size³ names, several
    per turn separated by `||`. A placement is invalid (format penalty, not applied, and the rest of
    the turn is dropped) when the cell is a given or already filled, or the digit is not the
    solution's: wrong digits are never written, so the grid always agrees with the solution.

    ## Observations
    The grid, one row per line, `.` for a blank, `|` and `-` between boxes, rows labelled R1.. and
    columns C1.. so that cells can be named as in the actions (see `_state_text`).

    ## Rewards
    `placement_reward` (default 0.1) per correct placement, a dense signal for progress in long
    puzzles; +1 more when the grid is complete. Guessing does not pay: a wrong digit costs the format
    penalty (-0.1 by default), at least as much as a right one earns.

    ## Episode end
    Terminated (success) when the last blank is filled; truncated after `max_turns` turns
    (default: enough turns for the blanks at `max_actions_per_turn` per turn, plus 2).
    """

    action_names = cell_actions(4)
    example_answer = "R1C2=3 || R4C1=2"

    def __init__(
        self,
        *,
        size: int = 4,
        num_blanks: int | None = None,
        placement_reward: float = 0.1,
        max_turns: int | None = None,
        **base_kwargs: Any,
    ) -> None:
        self.size, self.box = size, box_side(size)
        self.num_blanks = DEFAULT_BLANKS[size] if num_blanks is None else num_blanks
        if not isinstance(self.num_blanks, int) or not 1 <= self.num_blanks <= MAX_BLANKS[size]:
            raise ValueError(
                f"num_blanks for a {size}x{size} grid must be an integer in 1..{MAX_BLANKS[size]} (more blanks "
                f"rarely keep the solution unique), got {num_blanks!r}; null picks {DEFAULT_BLANKS[size]}."
            )
        self.action_names = cell_actions(size)
        if max_turns is None:  # a perfect player needs ceil(blanks / per turn) turns; 2 spare for one slip
            per_turn = max(1, int(base_kwargs.get("max_actions_per_turn", 3)))
            max_turns = -(-self.num_blanks // per_turn) + 2
        super().__init__(max_turns=max_turns, **base_kwargs)
        self.placement_reward = float(placement_reward)
        self.example_answer = f"R1C2=3 {self.action_separator} R4C1=2"
        self._moves = {
            name: tuple(int(x) - 1 for x in _ACTION_RE.fullmatch(name).groups()) for name in self.action_names
        }
        self.digits = np.zeros((size, size), dtype=np.int64)  # current grid, 0 = blank
        self.given = np.zeros((size, size), dtype=bool)  # cells shown from the start
        self.solution = np.zeros((size, size), dtype=np.int64)

    # ---- game hooks ----------------------------------------------------------------------
    def _reset_game(self, options: dict[str, Any] | None) -> None:
        puzzle, self.solution = generate_puzzle(self.size, self.num_blanks, self.np_random)
        self.digits, self.given = puzzle.copy(), puzzle > 0

    def _apply(self, action: str) -> ActionResult:
        row, col, value = self._moves[action]
        digit = value + 1
        if self.given[row, col]:
            return ActionResult(0.0, False, error=f"{cell_name(row, col)} is a given digit and cannot be changed")
        if self.digits[row, col]:
            return ActionResult(0.0, False, error=f"{cell_name(row, col)} is already filled")
        if self.solution[row, col] != digit:
            return ActionResult(0.0, False, error=self._why_wrong(row, col, digit))
        self.digits[row, col] = digit
        solved = bool(self.digits.all())
        reward = self.placement_reward + (SOLVE_REWARD if solved else 0.0)
        return ActionResult(reward=reward, effective=True, terminated=solved, success=solved)

    def _why_wrong(self, row: int, col: int, digit: int) -> str:
        """Why `digit` cannot go in (row, col), naming a visible clash when there is one (never the answer)."""
        name = cell_name(row, col)
        for unit, cells in (("row", self.digits[row]), ("column", self.digits[:, col]), ("box", self._box(row, col))):
            if digit in cells:
                return f"{name}={digit} is wrong: its {unit} already has a {digit}"
        return f"{name}={digit} is wrong: the puzzle's only solution has another digit there"

    def _box(self, row: int, col: int) -> np.ndarray:
        top, left = row - row % self.box, col - col % self.box
        return self.digits[top : top + self.box, left : left + self.box].ravel()

    def candidates(self, row: int, col: int) -> list[int]:
        """Digits not yet in the row, column or box of (row, col), ascending (0-based cell)."""
        seen = set(self.digits[row].tolist()) | set(self.digits[:, col].tolist()) | set(self._box(row, col).tolist())
        return [d for d in range(1, self.size + 1) if d not in seen]

    def _state_text(self) -> str:
        """The grid with 1-based labels that match the action names; e.g. for 4×4 (`.` = blank):

            C1 C2 | C3 C4
        R1   .  . |  4  3
        R2   3  4 |  .  .
            ------+------
        R3   2  3 |  1  4
        R4   .  . |  3  2
        """
        groups = self._grouped
        header = "    " + groups([f"C{c + 1}" for c in range(self.size)])
        rule = "    " + "-+-".join("-" * (3 * self.box - 1) for _ in range(self.box))
        lines = [header]
        for row in range(self.size):
            if row and row % self.box == 0:
                lines.append(rule)
            cells = [f"{d:>2}" if d else " ." for d in self.digits[row].tolist()]
            lines.append(f"R{row + 1}  " + groups(cells))
        return "\n".join(lines)

    def _grouped(self, items: list[str]) -> str:
        """Items joined by spaces, with " | " between boxes."""
        return " | ".join(" ".join(items[i : i + self.box]) for i in range(0, self.size, self.box))

    def _rules_text(self) -> str:
        n, b = self.size, self.box
        return (
            f"You are playing Sudoku on a {n}x{n} grid with {b}x{b} boxes. Fill every blank cell '.' with a digit "
            f"1-{n} so that each row, each column and each {b}x{b} box contains every digit 1-{n} exactly once. "
            "The puzzle has exactly one solution.\n"
            f"Action: R<row>C<col>=<digit>, rows and columns numbered from 1 (R1 is the top row, C1 the left "
            f"column), e.g. R2C3={n} writes {n} in row 2, column 3. Only blank cells can be filled.\n"
            f"Rewards: {self.placement_reward:g} per correct digit and {SOLVE_REWARD:g} more when the grid is "
            "complete. A wrong digit or a filled cell is an invalid action: it is not written, it costs a penalty "
            "and the rest of that turn's actions are skipped."
        )

    def state_key(self) -> bytes:
        """The digits on the grid (the puzzle's solution is fixed by the level)."""
        return self.digits.tobytes()

    def solve_order(self) -> list[tuple[int, int]]:
        """The blanks in the order a human would fill them: repeatedly the first blank (reading order)
        that has a single candidate once the earlier ones are filled, else the first blank."""
        saved = self.digits.copy()
        order: list[tuple[int, int]] = []
        try:
            while not self.digits.all():
                blanks = list(zip(*np.nonzero(self.digits == 0), strict=True))
                cell = next((rc for rc in blanks if len(self.candidates(*rc)) == 1), blanks[0])
                order.append((int(cell[0]), int(cell[1])))
                self.digits[cell] = self.solution[cell]
        finally:
            self.digits = saved
        return order

    def solver_actions(self) -> list[str]:
        """Every remaining placement with its solution digit, in `solve_order` ([] once solved)."""
        return [f"{cell_name(r, c)}={self.solution[r, c]}" for r, c in self.solve_order()]

    def demo_reasoning(self) -> str:
        """One clause per placement of this turn, e.g. "R1C2: row, column and box have 1 3 4, so 2."
        (when several candidates remain: "R1C2 could be 2 or 3; only 2 completes the grid.")."""
        saved, clauses = self.digits.copy(), []
        try:
            for row, col in self.solve_order()[: self.max_actions_per_turn]:
                options, answer = self.candidates(row, col), int(self.solution[row, col])
                if len(options) == 1:
                    seen = " ".join(str(d) for d in range(1, self.size + 1) if d != answer)
                    clauses.append(f"{cell_name(row, col)}: row, column and box have {seen}, so {answer}.")
                else:
                    listed = " or ".join(map(str, options))
                    clauses.append(f"{cell_name(row, col)} could be {listed}; only {answer} completes the grid.")
                self.digits[row, col] = answer
        finally:
            self.digits = saved
        return " ".join(clauses) or "The grid is complete."
