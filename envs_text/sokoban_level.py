"""Sokoban's board: tile codes, their symbols, the action offsets and the level type.

The one module every Sokoban piece builds on (the text env, its solver, the Boxoban loader, the visual
variant), so none of them has to import another to get the board: no import cycles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
SYMBOLS: dict[int, str] = {
    WALL: "#",
    FLOOR: "_",
    TARGET: "O",
    BOX_ON_TARGET: "√",
    BOX: "X",
    PLAYER: "P",
    PLAYER_ON_TARGET: "S",
}
TILE_NAMES: dict[int, str] = {
    WALL: "wall",
    FLOOR: "floor",
    TARGET: "target",
    BOX_ON_TARGET: "box on target",
    BOX: "box",
    PLAYER: "player",
    PLAYER_ON_TARGET: "player on target",
}
_CODES_BY_SYMBOL = {symbol: code for code, symbol in SYMBOLS.items()}
_SYMBOL_BY_CODE = tuple(SYMBOLS[code] for code in range(len(SYMBOLS)))

ACTIONS = ("Up", "Down", "Left", "Right")


def action_offsets(width: int) -> dict[str, int]:
    """Flat-index offset of each action on a row-major grid `width` cells wide."""
    return {"Up": -width, "Down": width, "Left": -1, "Right": 1}


def render_text(grid: np.ndarray, separator: str = "") -> str:
    """Tile-code grid (H, W) → one line of symbols per row, top row first, `separator` between cells."""
    return "\n".join(separator.join([_SYMBOL_BY_CODE[code] for code in row]) for row in grid.tolist())


@dataclass(frozen=True, eq=False)
class SokobanLevel:
    """One Sokoban position.

    `layout` (H, W) uint8 holds the fixed tiles only (WALL, FLOOR, TARGET); `boxes` are the sorted
    (row, col) cells of the boxes and `player` the player's (row, col). The border must be walls,
    which lets the dynamics and the solver move on flat indices without bounds checks.
    """

    layout: np.ndarray
    boxes: tuple[tuple[int, int], ...]
    player: tuple[int, int]

    @property
    def num_boxes(self) -> int:
        return len(self.boxes)

    def grid(self) -> np.ndarray:
        """The full tile-code grid (H, W) uint8, boxes and player included."""
        grid = self.layout.copy()
        for row, col in self.boxes:
            grid[row, col] = BOX_ON_TARGET if grid[row, col] == TARGET else BOX
        row, col = self.player
        grid[row, col] = PLAYER_ON_TARGET if grid[row, col] == TARGET else PLAYER
        return grid

    def text(self) -> str:
        return render_text(self.grid())

    def is_solved(self) -> bool:
        return all(self.layout[row, col] == TARGET for row, col in self.boxes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SokobanLevel):
            return NotImplemented
        return self.boxes == other.boxes and self.player == other.player and np.array_equal(self.layout, other.layout)

    __hash__ = None  # type: ignore[assignment]  # mutable numpy field: equal levels need not hash alike

    def validate(self) -> None:
        """Raise ValueError if the level breaks an invariant the dynamics rely on."""
        layout = self.layout
        if layout.ndim != 2 or layout.shape[0] < 3 or layout.shape[1] < 3:
            raise ValueError(f"A level layout must be a 2-D grid of at least 3x3 tiles, got shape {layout.shape}.")
        if not np.isin(layout, (WALL, FLOOR, TARGET)).all():
            raise ValueError(
                "The layout may hold only WALL, FLOOR and TARGET; put boxes and player in `boxes`/`player`."
            )
        border = np.concatenate([layout[0], layout[-1], layout[:, 0], layout[:, -1]])
        if (border != WALL).any():
            raise ValueError("The level's border must be all walls; surround the level with a row/column of '#'.")
        cells = [*self.boxes, self.player]
        if any(layout[row, col] == WALL for row, col in cells):
            raise ValueError("A box or the player stands on a wall; place them on floor or target tiles.")
        if len(set(cells)) != len(cells):
            raise ValueError("Two boxes, or a box and the player, share a cell; give each its own cell.")
        num_targets = int((layout == TARGET).sum())
        if not self.boxes or num_targets != len(self.boxes):
            raise ValueError(f"A level needs as many targets as boxes (>= 1); got {num_targets} and {len(self.boxes)}.")

    @classmethod
    def from_grid(cls, grid: np.ndarray) -> SokobanLevel:
        """Build (and validate) a level from a full tile-code grid (H, W)."""
        grid = np.asarray(grid)
        layout = np.where(np.isin(grid, (WALL, FLOOR)), grid, FLOOR).astype(np.uint8)
        layout[np.isin(grid, (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET))] = TARGET
        boxes = tuple(sorted(map(tuple, np.argwhere(np.isin(grid, (BOX, BOX_ON_TARGET))).tolist())))
        players = np.argwhere(np.isin(grid, (PLAYER, PLAYER_ON_TARGET))).tolist()
        if len(players) != 1:
            raise ValueError(f"A level needs exactly one player tile, found {len(players)}.")
        level = cls(layout, boxes, tuple(players[0]))
        level.validate()
        return level

    @classmethod
    def from_text(cls, text: str) -> SokobanLevel:
        """Build a level from rows of `SYMBOLS` characters (as `text()` writes them)."""
        rows = [row for row in text.strip().splitlines() if row.strip()]
        if len({len(row) for row in rows}) != 1:
            raise ValueError("Every row of a level's text must have the same length.")
        unknown = {char for row in rows for char in row} - set(_CODES_BY_SYMBOL)
        if unknown:
            raise ValueError(f"Unknown level symbols {sorted(unknown)}; use {SYMBOLS}.")
        return cls.from_grid(np.array([[_CODES_BY_SYMBOL[char] for char in row] for row in rows], dtype=np.uint8))
