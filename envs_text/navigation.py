"""Navigation as a language game: walk through a small room to the object the instruction names.

A procedural top-down room (walls on the border, a few interior wall cells), the player and a
handful of coloured objects ("green ball", "red key", "blue box"); each episode's instruction
names one of them, e.g. "go to the green ball". The other objects are distractors that share a
colour or a type with the target, so the instruction has to be read, not guessed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs_text.limits import check_grid
from vagen.env.base import ActionResult, LanguageEnv
from vagen.env.policies import relative_direction

ACTIONS = ("Up", "Down", "Left", "Right")
DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
COLOURS = ("red", "green", "blue", "yellow", "purple")
OBJECT_TYPES = ("ball", "key", "box")
MAX_OBJECTS = 9  # objects are the digits 1..9 in the text grid

# Cell codes of `NavigationTextEnv.grid()`; the visual atlas is indexed by them. Object codes follow:
# OBJECT_BASE + colour index * len(OBJECT_TYPES) + type index.
FLOOR, WALL, PLAYER = range(3)
OBJECT_BASE = 3
NUM_CODES = OBJECT_BASE + len(COLOURS) * len(OBJECT_TYPES)
SYMBOLS = {FLOOR: ".", WALL: "#", PLAYER: "P"}

Cell = tuple[int, int]


def object_code(colour: str, kind: str) -> int:
    """The grid code of a (colour, type) object, e.g. ("green", "ball") → 6."""
    return OBJECT_BASE + COLOURS.index(colour) * len(OBJECT_TYPES) + OBJECT_TYPES.index(kind)


@dataclass(frozen=True, eq=False)  # an ndarray field: compare rooms field by field
class Room:
    """A room layout: `walls` is an (H, W) bool array (True = wall), `objects` are
    `(colour, type, (row, col))` triples in legend order, `target` indexes `objects`, and
    `start` is the player's first cell. The player's later cells live on the env."""

    walls: np.ndarray
    objects: tuple[tuple[str, str, Cell], ...]
    target: int
    start: Cell

    def name(self, index: int) -> str:
        colour, kind, _ = self.objects[index]
        return f"{colour} {kind}"

    def blocked(self) -> np.ndarray:
        """(H, W) bool: walls and object cells, where the player cannot stand."""
        blocked = self.walls.copy()
        for _, _, cell in self.objects:
            blocked[cell] = True
        return blocked


def neighbours(cell: Cell) -> list[tuple[str, Cell]]:
    """The four compass neighbours of `cell` as (action name, cell), in `ACTIONS` order."""
    return [(name, (cell[0] + dr, cell[1] + dc)) for name, (dr, dc) in DELTAS.items()]


def bfs_parents(blocked: np.ndarray, start: Cell) -> dict[Cell, tuple[Cell, str] | None]:
    """Every cell reachable from `start` through unblocked cells, mapped to (previous cell, action)
    on one shortest walk (None for `start`). `blocked` must be True on the border (rooms have walls)."""
    parents: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for name, nxt in neighbours(cell):
            if nxt not in parents and not blocked[nxt]:
                parents[nxt] = (cell, name)
                queue.append(nxt)
    return parents


def path_next_to(blocked: np.ndarray, start: Cell, goal: Cell) -> list[str] | None:
    """Action names of a shortest walk from `start` to a cell 4-adjacent to `goal` ([] when already
    adjacent), or None when no such cell is reachable. Ties break in `ACTIONS` order."""
    parents = bfs_parents(blocked, start)
    ends = {cell for _, cell in neighbours(goal)}
    # dicts keep insertion order and BFS inserts by distance: the first end found is a nearest one
    cell = next((cell for cell in parents if cell in ends), None)
    if cell is None:
        return None
    path: list[str] = []
    while (step := parents[cell]) is not None:
        cell, name = step
        path.append(name)
    return path[::-1]


def _playable(room: Room) -> bool:
    """Every object has a free neighbour the player can reach, and the player does not start next to the target."""
    blocked = room.blocked()
    reachable = bfs_parents(blocked, room.start)
    for _, _, cell in room.objects:
        if not any(nxt in reachable for _, nxt in neighbours(cell)):
            return False
    target = room.objects[room.target][2]
    return abs(target[0] - room.start[0]) + abs(target[1] - room.start[1]) > 1


def random_room(size: int, num_objects: int, num_walls: int, rng: np.random.Generator, max_tries: int = 1000) -> Room:
    """A size x size room with walls on the border, `num_walls` random interior wall cells, the player
    and `num_objects` objects of distinct (colour, type) on distinct interior cells, one of them the
    target; redrawn until every object is reachable and the player does not start next to the target."""
    interior = [(row, col) for row in range(1, size - 1) for col in range(1, size - 1)]
    for _ in range(max_tries):
        picks = rng.choice(len(interior), size=num_walls + 1 + num_objects, replace=False)
        cells = [interior[int(i)] for i in picks]
        walls = np.zeros((size, size), dtype=bool)
        walls[[0, -1], :] = walls[:, [0, -1]] = True
        for cell in cells[:num_walls]:
            walls[cell] = True
        pairs = rng.choice(len(COLOURS) * len(OBJECT_TYPES), size=num_objects, replace=False)
        objects = tuple(
            (COLOURS[int(p) // len(OBJECT_TYPES)], OBJECT_TYPES[int(p) % len(OBJECT_TYPES)], cell)
            for p, cell in zip(pairs, cells[num_walls + 1 :], strict=True)
        )
        room = Room(walls, objects, int(rng.integers(num_objects)), cells[num_walls])
        if _playable(room):
            return room
    raise RuntimeError(
        f"No playable {size}x{size} room with {num_objects} objects and {num_walls} interior walls in "
        f"{max_tries} draws; lower num_walls or num_objects, or raise size."
    )


class NavigationTextEnv(LanguageEnv):
    """Navigation with text observations.

    ## Description
    A `size` x `size` room seen from above: walls on the border, `num_walls` interior wall cells,
    the player and `num_objects` objects, each a colour (red, green, blue, yellow, purple) and a
    type (ball, key, box), no two alike. Each reset draws a new room and an instruction naming one
    object, e.g. "go to the green ball"; every object is reachable and the player never starts next
    to the target. The instruction is part of the rules, i.e. of the first observation only.

    ## Actions
    `Up`, `Down`, `Left`, `Right`: one cell each, several per turn separated by `||`. Walls and
    objects block; a blocked move leaves the player in place and is not effective.

    ## Observations
    The room, one row per line: `#` wall, `.` floor, `P` player, digits `1`..`9` objects, then one
    legend line naming each digit with its (row, col) from the top-left, 0-based:
    `Objects: 1 = green ball at (2, 4), 2 = red key at (5, 1).` `grid()` gives the same as codes.

    ## Rewards
    +1 for reaching the target, 0 otherwise (plus the base class's format penalty).

    ## Episode end
    Terminated (success) when the player stands on a cell 4-adjacent to the target object;
    truncated after `max_steps` moves or `max_turns` turns.
    """

    action_names = ACTIONS
    example_answer = "Up || Left"

    def __init__(
        self,
        *,
        size: int = 7,
        num_objects: int = 3,
        num_walls: int = 3,
        max_steps: int = 100,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(**base_kwargs)
        if size < 4:
            raise ValueError(f"size must be >= 4 (a border of walls around at least 2x2 floor), got {size}.")
        check_grid(size, size, "size", size)
        if not 1 <= num_objects <= min(MAX_OBJECTS, len(COLOURS) * len(OBJECT_TYPES)):
            raise ValueError(f"num_objects must be in 1..{MAX_OBJECTS} (digits 1-9 in the text), got {num_objects}.")
        if num_walls < 0 or num_walls + num_objects + 2 > (size - 2) ** 2:
            raise ValueError(
                f"num_walls={num_walls} and num_objects={num_objects} do not fit a {size}x{size} room "
                f"({(size - 2) ** 2} interior cells, the player needs one and room to move); lower them or raise size."
            )
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}.")
        self.size, self.num_objects, self.num_walls, self.max_steps = size, num_objects, num_walls, max_steps
        self.example_answer = f"Up {self.action_separator} Left"
        self.room: Room | None = None
        self.player: Cell = (0, 0)
        self._steps = 0

    # ---- game hooks ----------------------------------------------------------------------
    def _reset_game(self, options: dict[str, Any] | None) -> None:
        self.room = random_room(self.size, self.num_objects, self.num_walls, self.np_random)
        self.player = self.room.start
        self._steps = 0

    def _apply(self, action: str) -> ActionResult:
        room = self._require_room()
        d_row, d_col = DELTAS[action]
        nxt = (self.player[0] + d_row, self.player[1] + d_col)
        moved = not room.blocked()[nxt]
        if moved:
            self.player = nxt
        self._steps += 1
        success = self.at_target()
        truncated = not success and self._steps >= self.max_steps
        return ActionResult(
            reward=1.0 if success else 0.0, effective=moved, terminated=success, truncated=truncated, success=success
        )

    def at_target(self) -> bool:
        """Whether the player stands on a cell 4-adjacent to the target object."""
        target = self.target_cell()
        return abs(target[0] - self.player[0]) + abs(target[1] - self.player[1]) == 1

    def _require_room(self) -> Room:
        if self.room is None:
            raise RuntimeError(f"{type(self).__name__} has no room yet; call reset() first.")
        return self.room

    @property
    def instruction(self) -> str:
        """This episode's task, e.g. "go to the green ball"."""
        room = self._require_room()
        return f"go to the {room.name(room.target)}"

    def target_cell(self) -> Cell:
        room = self._require_room()
        return room.objects[room.target][2]

    def grid(self) -> np.ndarray:
        """The room as (H, W) uint8 codes: FLOOR, WALL, PLAYER, or `object_code(colour, type)`."""
        room = self._require_room()
        grid = np.where(room.walls, WALL, FLOOR).astype(np.uint8)
        for colour, kind, cell in room.objects:
            grid[cell] = object_code(colour, kind)
        grid[self.player] = PLAYER
        return grid

    def _state_text(self) -> str:
        room = self._require_room()
        digits = {cell: str(i + 1) for i, (_, _, cell) in enumerate(room.objects)}
        rows = []
        for r, row in enumerate(self.grid()):
            rows.append("".join(digits.get((r, c), SYMBOLS.get(int(code), "?")) for c, code in enumerate(row)))
        legend = ", ".join(f"{i + 1} = {room.name(i)} at {cell}" for i, (_, _, cell) in enumerate(room.objects))
        return "\n".join(rows) + f"\nObjects: {legend}."

    def _legend_text(self) -> str:
        """How to read the state; the visual variant describes its picture here instead."""
        return (
            "Symbols: P you, # wall, . floor, digits are objects (named, with their (row, col), "
            "in the line under the grid)."
        )

    def _rules_text(self) -> str:
        return (
            f"You are in a {self.size}x{self.size} room seen from above. Your task: {self.instruction}, "
            "i.e. stand on a cell directly next to it (up, down, left or right of it).\n"
            f"{self._legend_text()}\n"
            f"Actions: {', '.join(ACTIONS)} (one cell each; walls and objects block you).\n"
            "Rewards: 1 for reaching the target, 0 otherwise. The episode ends when you reach it."
        )

    # ---- oracle and demonstration labels --------------------------------------------------
    def solver_actions(self) -> list[str]:
        """A shortest walk to a cell next to the target ([] when already there or unreachable)."""
        room = self._require_room()
        return path_next_to(room.blocked(), self.player, self.target_cell()) or []

    def demo_reasoning(self) -> str:
        """Where the target is from the player and which moves are blocked, in relative words:
        "the green ball is up-right of me, blocked: up left." """
        room = self._require_room()
        target = self.target_cell()
        blocked = room.blocked()
        stuck = [name.lower() for name, cell in neighbours(self.player) if blocked[cell]]
        near = f"blocked: {' '.join(stuck)}" if stuck else "nothing blocks me"
        where = relative_direction(target[0] - self.player[0], target[1] - self.player[1])
        return f"the {room.name(room.target)} is {where} of me, {near}."

    def key_cells(self) -> list[Cell]:
        """The player and the target object."""
        return [tuple(self.player), self.target_cell()]

    def state_key(self) -> Cell:
        """The player's cell: the room never changes (the player has no heading here). Like the turn index, the
        steps taken are left out, as GiGPO's anchor states leave out the time left."""
        return tuple(self.player)

    def state_objects(self) -> list[tuple[str, Cell]]:
        """("player", cell) first, then every object as ("green ball", cell) in legend order; walls are not listed."""
        room = self._require_room()
        return [("player", tuple(self.player))] + [(room.name(i), cell) for i, (_, _, cell) in enumerate(room.objects)]
