"""Boxoban level files (DeepMind, Apache-2.0): a standard external set of 10x10, 4-box Sokoban levels.

Format: each level is a `; N` header line followed by its rows: `#` wall, ` ` floor, `.` target,
`$` box, `@` player, `*` box on target, `+` player on target. Two files ship in `data/boxoban/`
(package data): the unfiltered test split and the hard split, 1000 levels each.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from envs_text.sokoban_level import BOX, BOX_ON_TARGET, FLOOR, PLAYER, PLAYER_ON_TARGET, TARGET, WALL, SokobanLevel

DATA_DIR = Path(__file__).parent / "data" / "boxoban"
LEVEL_SETS: dict[str, str] = {"boxoban_test": "unfiltered_test_000.txt", "boxoban_hard": "hard_000.txt"}
_CODE_BY_CHAR = {
    "#": WALL,
    " ": FLOOR,
    ".": TARGET,
    "$": BOX,
    "@": PLAYER,
    "*": BOX_ON_TARGET,
    "+": PLAYER_ON_TARGET,
}


def parse_level(rows: list[str]) -> SokobanLevel:
    """One level from its rows of Boxoban characters (shorter rows are padded with floor)."""
    width = max(len(row) for row in rows)
    unknown = {char for row in rows for char in row} - set(_CODE_BY_CHAR)
    if unknown:
        raise ValueError(f"Unknown Boxoban characters {sorted(unknown)}; expected one of {sorted(_CODE_BY_CHAR)}.")
    grid = np.array([[_CODE_BY_CHAR[char] for char in row.ljust(width)] for row in rows], dtype=np.uint8)
    return SokobanLevel.from_grid(grid)


def parse_levels(text: str) -> list[SokobanLevel]:
    """All levels of a Boxoban file's text, in file order."""
    levels, rows, header = [], [], None
    for line in [*text.splitlines(), ";"]:  # a final ';' flushes the last level
        if line.startswith(";"):
            if rows:
                try:
                    levels.append(parse_level(rows))
                except ValueError as error:
                    raise ValueError(f"Boxoban level {header!r} is malformed: {error}") from error
            rows, header = [], line
        elif line.strip():
            rows.append(line.rstrip("\n"))
    return levels


@functools.lru_cache(maxsize=8)
def load_level_set(name_or_path: str) -> tuple[SokobanLevel, ...]:
    """The levels of a named set (`LEVEL_SETS`) or of a Boxoban file at a path; cached per process."""
    if name_or_path in LEVEL_SETS:
        path = DATA_DIR / LEVEL_SETS[name_or_path]
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(
                f"Unknown level_set {name_or_path!r}: use one of {sorted(LEVEL_SETS)} or a Boxoban file path."
            )
    levels = tuple(parse_levels(path.read_text(encoding="utf-8")))
    if not levels:
        raise ValueError(f"No levels found in {path}; a Boxoban file has '; N' headers followed by rows of '#'.")
    return levels
