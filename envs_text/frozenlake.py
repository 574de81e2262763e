"""FrozenLake as a language game: walk across the ice to the goal without falling into a hole.

The dynamics are Gymnasium's FrozenLake-v1 (`transition_table` builds the same table as its
`env.unwrapped.P`); maps are random and solvable with a random start and goal (RAGEN), or given.
"""

from __future__ import annotations

import re
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from envs_text.limits import check_grid
from vagen.env.base import ActionResult, LanguageEnv
from vagen.env.grading import side_neighbours
from vagen.env.observation import check_cell_separator, check_list_positions, positions_line
from vagen.env.policies import SIDES, relative_direction

ACTIONS = ("Left", "Down", "Right", "Up")  # Gymnasium's action ids 0..3, in that order
LEFT, DOWN, RIGHT, UP = range(4)
_DELTAS = {LEFT: (0, -1), DOWN: (1, 0), RIGHT: (0, 1), UP: (-1, 0)}
_TILES = "SFHG"

# Cell codes of `FrozenLakeTextEnv.grid()`; the visual renderer depends on these exact values.
FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = range(6)
SYMBOLS = {FROZEN: "_", HOLE: "O", GOAL: "G", PLAYER: "P", PLAYER_IN_HOLE: "X", PLAYER_ON_GOAL: "√"}

_GOAL_READING = re.compile(r"\bgoal is ([a-z]+(?:-[a-z]+)?) of me\b")
_HOLES_READING = re.compile(r"\bholes?((?: (?:up|down|left|right)\b)+)")
_NO_HOLE_READING = re.compile(r"\bno hole next to me\b")

Transition = tuple[float, int, float, bool]  # (probability, next state, reward, terminated)


def validate_desc(desc: Sequence[str]) -> tuple[str, ...]:
    """Check a Gymnasium-style map (rows of S/F/H/G) and return it as a tuple of strings."""
    if isinstance(desc, str) or not isinstance(desc, Sequence) or len(desc) == 0:
        raise ValueError(f"desc must be a non-empty list of row strings such as ['SFFF', 'FHFH', ...], got {desc!r}.")
    rows = tuple(str(row) for row in desc)
    if any(len(row) != len(rows[0]) for row in rows) or not rows[0]:
        raise ValueError(f"desc rows must be non-empty and all the same length, got lengths {[len(r) for r in rows]}.")
    bad = sorted({char for row in rows for char in row} - set(_TILES))
    if bad:
        raise ValueError(f"desc has unknown tile(s) {bad}; use S (start), F (frozen), H (hole), G (goal).")
    starts = sum(row.count("S") for row in rows)
    if starts != 1:
        raise ValueError(f"desc must have exactly one start tile 'S', found {starts}.")
    if not any("G" in row for row in rows):
        raise ValueError("desc has no goal tile 'G'; add one.")
    return rows


def _check_success_rate(success_rate: float) -> float:
    if not 0.0 <= success_rate <= 1.0:
        raise ValueError(f"success_rate is a probability in [0, 1] (1.0 = not slippery), got {success_rate}.")
    return float(success_rate)


def _slide(row: int, col: int, action: int, shape: tuple[int, int]) -> tuple[int, int]:
    """Where a move from (row, col) lands; a move off the edge stays in place."""
    d_row, d_col = _DELTAS[action]
    return min(max(row + d_row, 0), shape[0] - 1), min(max(col + d_col, 0), shape[1] - 1)


def transition_table(desc: Sequence[str], success_rate: float) -> dict[int, dict[int, list[Transition]]]:
    """Gymnasium FrozenLake-v1 dynamics as `{state: {action: [(prob, next_state, reward, terminated)]}}`.

    state = row * ncol + col; actions 0..3 = Left, Down, Right, Up. From a frozen or start cell
    the intended move happens with probability `success_rate` and each of the two perpendicular
    moves with (1 - success_rate) / 2 (entries in the order action-1, action, action+1 mod 4, as
    Gymnasium lists them; zero-probability entries are left out). Landing on G pays 1.0 and
    terminates, landing in H pays 0.0 and terminates. Hole and goal cells are absorbing:
    `[(1.0, state, 0.0, True)]`. Equals `gymnasium.make("FrozenLake-v1", desc=desc, is_slippery=True,
    success_rate=success_rate).unwrapped.P` up to those zero-probability entries.
    """
    rows = validate_desc(desc)
    success_rate = _check_success_rate(success_rate)
    shape = (len(rows), len(rows[0]))
    slip_rate = (1.0 - success_rate) / 2.0
    table: dict[int, dict[int, list[Transition]]] = {}
    for state in range(shape[0] * shape[1]):
        row, col = divmod(state, shape[1])
        table[state] = {}
        for action in range(4):
            if rows[row][col] in "GH":
                table[state][action] = [(1.0, state, 0.0, True)]
                continue
            outcomes: list[Transition] = []
            for direction, prob in (
                ((action - 1) % 4, slip_rate),
                (action, success_rate),
                ((action + 1) % 4, slip_rate),
            ):
                if prob == 0.0:
                    continue
                new_row, new_col = _slide(row, col, direction, shape)
                tile = rows[new_row][new_col]
                outcomes.append((prob, new_row * shape[1] + new_col, 1.0 if tile == "G" else 0.0, tile in "GH"))
            table[state][action] = outcomes
    return table


def shortest_path(rows: Sequence[str], start: tuple[int, int]) -> list[str] | None:
    """Action names of a shortest hole-free walk from `start` to a goal (intended moves), or None."""
    shape = (len(rows), len(rows[0]))
    previous: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if rows[cell[0]][cell[1]] == "G":
            path: list[str] = []
            while previous[cell] is not None:
                cell, action = previous[cell]
                path.append(ACTIONS[action])
            return path[::-1]
        if rows[cell[0]][cell[1]] == "H":
            continue
        for action in range(4):
            neighbour = _slide(cell[0], cell[1], action, shape)
            if neighbour not in previous and rows[neighbour[0]][neighbour[1]] != "H":
                previous[neighbour] = (cell, action)
                queue.append(neighbour)
    return None


def random_map(size: int, p_frozen: float, rng: np.random.Generator, max_tries: int = 10_000) -> tuple[str, ...]:
    """A size x size map whose cells are frozen with probability `p_frozen`, with a start and a goal
    on two different random cells, redrawn until the goal is reachable from the start."""
    for _ in range(max_tries):
        board = np.where(rng.random((size, size)) < p_frozen, "F", "H")
        start, goal = rng.choice(size * size, size=2, replace=False)
        board[divmod(int(start), size)] = "S"
        board[divmod(int(goal), size)] = "G"
        rows = tuple("".join(row) for row in board)
        if shortest_path(rows, (int(start) // size, int(start) % size)) is not None:
            return rows
    raise RuntimeError(f"No solvable {size}x{size} map in {max_tries} draws with p_frozen={p_frozen}; raise p_frozen.")


class FrozenLakeTextEnv(LanguageEnv):
    """FrozenLake with text observations.

    ## Description
    Walk from the start to the goal `G` on a grid of ice without falling into a hole `O`. By
    default each reset draws a `size` x `size` map (cells frozen with probability `p_frozen`, start
    and goal on two different random cells) until the goal is reachable; pass `desc` (Gymnasium
    style, e.g. `["SFFF", "FHFH", "FFFH", "HFFG"]`) to play a fixed map instead.

    ## Actions
    `Left`, `Down`, `Right`, `Up` (Gymnasium's ids 0..3), several per turn separated by `||`.
    `success_rate` (default 1.0 = not slippery) is the probability that a move goes where it was
    meant to; otherwise it goes to one of the two perpendicular directions, each with probability
    (1 - success_rate) / 2, exactly as Gymnasium's FrozenLake-v1. RAGEN-style slippery play uses
    e.g. `success_rate=0.8`. Moving off the edge leaves the player in place.

    ## Observations
    The grid, one row per line: `P` player, `_` frozen ice (the start cell is ice), `O` hole,
    `G` goal, `X` player in a hole, `√` player on the goal, `cell_separator` between the cells of a row
    (see `check_cell_separator`). `grid()` gives the same as codes. With `list_positions`, a line under the grid
    also lists the (row, col) of the player, the goal and every hole (`state_objects`).
    With `hole_labels` (supervised warm starts only), the vision pre-training also learns every tile's hole
    neighbours (`tile_facts`).

    ## Rewards
    +1 for reaching the goal, 0 otherwise (plus the base class's format penalty).

    ## Episode end
    Terminated at the goal (success) or in a hole; truncated after `max_steps` actions or
    `max_turns` turns.
    """

    action_names = ACTIONS
    example_answer = "Left || Up"
    graded_nearby_only = ("hole",)  # a description names the holes next to the player, not all of them

    def __init__(
        self,
        *,
        size: int = 4,
        p_frozen: float = 0.8,
        desc: Sequence[str] | None = None,
        success_rate: float = 1.0,
        max_steps: int = 100,
        cell_separator: str = "",
        list_positions: bool = False,
        hole_labels: bool = False,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(**base_kwargs)
        if not isinstance(hole_labels, bool):
            raise ValueError(f"hole_labels must be true or false, got {hole_labels!r}.")
        self.hole_labels = hole_labels
        self.cell_separator = check_cell_separator(cell_separator)
        self.list_positions = check_list_positions(list_positions)
        if desc is None and size < 2:
            raise ValueError(f"size must be >= 2 so that start and goal differ, got {size}.")
        if desc is None:
            check_grid(size, size, "size", size)
        if not 0.0 < p_frozen <= 1.0:
            raise ValueError(f"p_frozen is the probability that a cell is frozen, in (0, 1], got {p_frozen}.")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}.")
        self.fixed_desc = validate_desc(desc) if desc is not None else None
        if self.fixed_desc is not None:
            start = next((r, row.index("S")) for r, row in enumerate(self.fixed_desc) if "S" in row)
            if shortest_path(self.fixed_desc, start) is None:
                warnings.warn("The given desc has no hole-free path from S to G; no episode can succeed.", stacklevel=2)
        self.size, self.p_frozen = size, float(p_frozen)
        self.success_rate = _check_success_rate(success_rate)
        self.max_steps = max_steps
        self.example_answer = f"Left {self.action_separator} Up"
        self.desc: tuple[str, ...] = ()
        self.player = (0, 0)
        self._steps = 0
        self._table: dict[int, dict[int, list[Transition]]] = {}

    # ---- game hooks ----------------------------------------------------------------------
    def _reset_game(self, options: dict[str, Any] | None) -> None:
        self.desc = self.fixed_desc or random_map(self.size, self.p_frozen, self.np_random)
        self.player = next((r, row.index("S")) for r, row in enumerate(self.desc) if "S" in row)
        self._steps = 0
        self._table = transition_table(self.desc, self.success_rate)

    def _apply(self, action: str) -> ActionResult:
        ncol = len(self.desc[0])
        outcomes = self._table[self.player[0] * ncol + self.player[1]][ACTIONS.index(action)]
        probabilities = np.array([outcome[0] for outcome in outcomes])
        pick = int(self.np_random.choice(len(outcomes), p=probabilities / probabilities.sum()))
        _, next_state, reward, terminated = outcomes[pick]
        moved = next_state != self.player[0] * ncol + self.player[1]
        self.player = divmod(next_state, ncol)
        self._steps += 1
        on_goal = self.desc[self.player[0]][self.player[1]] == "G"
        truncated = not terminated and self._steps >= self.max_steps
        return ActionResult(reward=reward, effective=moved, terminated=terminated, truncated=truncated, success=on_goal)

    def grid(self) -> np.ndarray:
        """The board as (H, W) uint8 codes: FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL."""
        codes = {"S": FROZEN, "F": FROZEN, "H": HOLE, "G": GOAL}
        board = np.array([[codes[tile] for tile in row] for row in self.desc], dtype=np.uint8)
        under_player = self.desc[self.player[0]][self.player[1]]
        board[self.player] = {"H": PLAYER_IN_HOLE, "G": PLAYER_ON_GOAL}.get(under_player, PLAYER)
        return board

    def _state_text(self) -> str:
        grid_text = "\n".join(self.cell_separator.join(SYMBOLS[int(code)] for code in row) for row in self.grid())
        return f"{grid_text}\n{positions_line(self.state_objects())}" if self.list_positions else grid_text

    def _rules_text(self) -> str:
        height, width = len(self.desc), len(self.desc[0])
        slippery = (
            f" The ice is slippery: a move goes the intended way with probability {self.success_rate:g}, "
            "otherwise it slides to one of the two perpendicular directions."
            if self.success_rate < 1.0
            else ""
        )
        return (
            f"You are playing FrozenLake on a {height}x{width} grid. Walk to the goal without falling into a hole.\n"
            "Symbols: P you, _ frozen ice, O hole, G goal, X you in a hole, √ you on the goal.\n"
            f"Actions: {', '.join(ACTIONS)} (one cell each; walking into the edge leaves you in place).{slippery}\n"
            "Rewards: 1 for reaching the goal, 0 otherwise. The episode ends at the goal or in a hole."
        )

    def demo_reasoning(self) -> str:
        """Where the goal is from the player and which neighbouring cells are holes, in relative words:
        "goal is down-right of me, holes right." """
        holes = self._holes_next_to_player()
        near = f"holes {' '.join(holes)}" if holes else "no hole next to me"
        return f"goal is {self._goal_direction()} of me, {near}."

    def reading_facts(self, think: str) -> float:
        """The share of five facts `think` states rightly: the goal's direction ("goal is <direction> of me"), and for
        each of up, down, left and right whether a hole is there ("holes up left"; "no hole next to me"; a cell off
        the board has none). Only the first statement of each counts; a reading that names no holes, or both holes
        and none, gets the four hole facts wrong."""
        goal = _GOAL_READING.search(think)
        holes_named, no_hole = _HOLES_READING.search(think), _NO_HOLE_READING.search(think)
        right = int(goal is not None and goal.group(1) == self._goal_direction())
        if (holes_named is None) != (no_hole is None):  # exactly one statement about the holes
            claimed = set(holes_named.group(1).split()) if holes_named else set()
            truth = set(self._holes_next_to_player())
            right += sum((side in claimed) == (side in truth) for side in SIDES)
        return right / (1 + len(SIDES))

    def _goal_cell(self) -> tuple[int, int]:
        return next((r, row.index("G")) for r, row in enumerate(self.desc) if "G" in row)

    def _goal_direction(self) -> str:
        goal = self._goal_cell()
        return relative_direction(goal[0] - self.player[0], goal[1] - self.player[1])

    def _holes_next_to_player(self) -> list[str]:
        """The sides of the player (up, down, left, right, in that order) whose cell is a hole."""
        row, col = self.player
        return [
            side
            for side, (dr, dc) in SIDES.items()
            if 0 <= row + dr < len(self.desc)
            and 0 <= col + dc < len(self.desc[0])
            and self.desc[row + dr][col + dc] == "H"
        ]

    def key_cells(self) -> list[tuple[int, int]]:
        """The player and the goal."""
        return [tuple(self.player), self._goal_cell()]

    def tile_facts(self) -> np.ndarray | None:
        """With `hole_labels`: for every tile, whether its up, down, left and right neighbours are holes (1) or not
        (0; off the board: not a hole), so that the player's own image token carries the holes its reading names."""
        if not self.hole_labels:
            return None
        holes = np.array([list(row) for row in self.desc]) == "H"
        return side_neighbours(holes, off_board=False).reshape(-1, len(SIDES)).astype(np.int64)

    def state_key(self) -> tuple[int, int]:
        """The player's cell: the map never changes within an episode."""
        return tuple(self.player)

    def state_objects(self) -> list[tuple[str, tuple[int, int]]]:
        """Player, goal and every hole, in (row, col); only the holes next to the player must be described."""
        cells = {
            kind: [(kind, (r, c)) for r, row in enumerate(self.desc) for c, t in enumerate(row) if t == tile]
            for kind, tile in (("goal", "G"), ("hole", "H"))
        }
        return [("player", tuple(self.player)), *cells["goal"], *cells["hole"]]

    def solver_actions(self) -> list[str]:
        """A shortest hole-free sequence of intended moves from the player to the goal ([] if none)."""
        if self.desc[self.player[0]][self.player[1]] in "GH":
            return []
        return shortest_path(self.desc, self.player) or []
