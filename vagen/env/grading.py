"""Exact, judge-free grades for the `<observation>` and `<prediction>` of the grounding and
worldmodeling response formats.

VAGEN rewards a VLM agent for describing what it sees and predicting what its actions will do; it
graded the descriptions with an LLM judge. On grid games the true state is known exactly, so the
grade here is a deterministic comparison of the facts a description states with the facts of the
state (`LanguageEnv.state_objects()`: `[("player", (r, c)), ("box", (r, c)), ...]`).

Which facts are read from free text (lower-cased, any order, any wording around them):
- absolute: a kind word followed by cells, in the same clause: "boxes at (2, 3) and (4, 1)",
  "player: row 2, col 3". Each cell `(r, c)` / `row r col c` belongs to the nearest kind word
  before it in its clause (clauses end at `;`, `.`, a newline, or `,` outside a cell); a clause of
  bare cells continues the kind of the clause before it in the sentence ("boxes at (2, 1), (3, 3)").
- relative: a kind word and a direction word in the same clause, "the box is up-left of me",
  "target down-right": that kind lies in that direction from the player (the words of
  `relative_direction`, plus above/below/same cell/here).
- a clause that negates ("no hole next to me", "not") states nothing, so it can neither earn nor lose.

The score is the F1 of precision and recall over those facts, in [0, 1]:
- precision = correct claims / claims: a claim is correct when an object of that kind is in that
  cell (absolute) or in that direction from the player (relative). Contradictions (a box where
  there is none) therefore lower the score; repeating a correct fact does not raise it.
- recall = covered objects / objects to describe: an object is covered by a correct absolute
  claim of its cell, or a correct relative claim of its direction. In a purely relative
  description the player is the frame of reference and counts as covered. Kinds a game lists in
  `nearby_only` are required only within one step of the player (FrozenLake's far holes), but
  claims about them are still checked.
- no claim at all scores 0; an absent or malformed block scores 0.

Pure functions of strings and lists: no environment, no model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

Cell = tuple[int, int]
StateObjects = Sequence[tuple[str, Cell]]

PLAYER = "player"
PLAYER_WORDS = ("player", "agent", "me", "i", "you", "myself")
_CELL = re.compile(r"\(\s*(\d{1,3})\s*,\s*(\d{1,3})\s*\)|\brow\s*(\d{1,3})\s*,?\s*(?:and\s+)?col(?:umn)?\s*(\d{1,3})")
_DIRECTIONS = {
    "up-left": "up-left", "up left": "up-left", "upper left": "up-left", "above-left": "up-left",
    "up-right": "up-right", "up right": "up-right", "upper right": "up-right", "above-right": "up-right",
    "down-left": "down-left", "down left": "down-left", "lower left": "down-left", "below-left": "down-left",
    "down-right": "down-right", "down right": "down-right", "lower right": "down-right", "below-right": "down-right",
    "up": "up", "above": "up", "down": "down", "below": "down", "left": "left", "right": "right",
    "here": "here", "same cell": "here",
}  # fmt: skip
_DIRECTION = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _DIRECTIONS), key=len, reverse=True)) + r")\b")
_NEGATION = re.compile(r"\b(no|not|none|nothing|without)\b")
_MAX_CHARS = 4_000  # a description longer than this is cut: grading stays O(1) on hostile 100 kB text


@dataclass(frozen=True)
class Claims:
    """The facts a description states: absolute (kind, cell) and relative (kind, direction from player)."""

    absolute: frozenset[tuple[str, Cell]]
    relative: frozenset[tuple[str, str]]


def relative_direction(delta_row: int, delta_col: int) -> str:
    """'up-left', 'down', … for a (row, col) offset on a grid drawn top row first; 'here' for none.

    Relative words because a small vision model without absolute position embeddings can compute "the box is
    up-left of me" from an image, but not "(row 2, col 3)".
    """
    vertical = "up" if delta_row < 0 else "down" if delta_row > 0 else ""
    horizontal = "left" if delta_col < 0 else "right" if delta_col > 0 else ""
    return "-".join(part for part in (vertical, horizontal) if part) or "here"


# The four neighbours of a cell as (row, col) steps, in the order the games' readings list them ("holes up left").
SIDES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
RELATIVE_DIRECTIONS = ("here", "up", "down", "left", "right", "up-left", "up-right", "down-left", "down-right")


def side_neighbours(mask: np.ndarray, off_board: bool) -> np.ndarray:
    """(H, W, 4) bool: for every cell of an (H, W) bool `mask`, whether its neighbour on each of `SIDES` (up, down,
    left, right) is set; a neighbour off the board counts as `off_board`."""
    padded = np.pad(mask, 1, constant_values=off_board)
    height, width = mask.shape
    return np.stack([padded[1 + dr : 1 + dr + height, 1 + dc : 1 + dc + width] for dr, dc in SIDES.values()], -1)


def direction_from(player: Cell, cell: Cell) -> str:
    """Where `cell` lies from `player`, in `relative_direction`'s words."""
    return relative_direction(cell[0] - player[0], cell[1] - player[1])


def _kind_pattern(kinds: Iterable[str]) -> re.Pattern[str]:
    """Kind names and player words, longest first, with an optional plural 's'/'es'."""
    words = sorted({*kinds, *PLAYER_WORDS}, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(re.escape(word) for word in words) + r")(?:e?s)?\b")


def _canonical_kind(word: str) -> str:
    return PLAYER if word in PLAYER_WORDS else word


def extract_claims(text: str, kinds: Iterable[str]) -> Claims:
    """The absolute and relative facts `text` states about objects of `kinds` (see the module doc)."""
    kind_pattern = _kind_pattern(kinds)
    absolute: set[tuple[str, Cell]] = set()
    relative: set[tuple[str, str]] = set()
    text = text[:_MAX_CHARS].lower().replace("\x00", " ")  # \x00 marks cells below
    # Cells first, so that the comma inside "(2, 3)" does not end a clause.
    cells: list[Cell] = []

    def cell_token(match: re.Match[str]) -> str:
        numbers = [int(group) for group in match.groups() if group is not None]
        cells.append((numbers[0], numbers[1]))
        return f" \x00{len(cells) - 1}\x00 "

    marked = _CELL.sub(cell_token, text)
    for sentence in re.split(r"[;.\n]", marked):
        last_kind = None  # "boxes at (2, 1), (3, 3)": a clause of bare cells continues the kind before it
        for clause in sentence.split(","):
            mentions = [(m.start(), _canonical_kind(m.group(1))) for m in kind_pattern.finditer(clause)]
            if _NEGATION.search(clause):
                last_kind = None
                continue
            for cell_match in re.finditer(r"\x00(\d+)\x00", clause):
                before = [kind for start, kind in mentions if start < cell_match.start()]
                kind = before[-1] if before else mentions[0][1] if mentions else last_kind
                if kind is not None:
                    absolute.add((kind, cells[int(cell_match.group(1))]))
            direction = _DIRECTION.search(clause)
            subjects = [kind for _, kind in mentions if kind != PLAYER]
            if direction and subjects and "\x00" not in clause:
                relative.add((subjects[0], _DIRECTIONS[direction.group(1)]))
            last_kind = mentions[-1][1] if mentions else last_kind
    return Claims(frozenset(absolute), frozenset(relative))


def grade_claims(claims: Claims, objects: StateObjects, nearby_only: Iterable[str] = ()) -> float:
    """F1 in [0, 1] of `claims` against the true `objects` (player first); see the module doc."""
    if not objects or objects[0][0] != PLAYER:
        raise ValueError("objects must list the player first, as ('player', (row, col)).")
    player = objects[0][1]
    truth = set(objects)
    directions = {(kind, direction_from(player, cell)) for kind, cell in objects[1:]}
    claim_count = len(claims.absolute) + len(claims.relative)
    if claim_count == 0:
        return 0.0
    correct = len(claims.absolute & truth) + len(claims.relative & directions)
    nearby_only = set(nearby_only)

    def required(kind: str, cell: Cell) -> bool:
        return kind not in nearby_only or abs(cell[0] - player[0]) + abs(cell[1] - player[1]) <= 1

    targets = [(kind, cell) for kind, cell in objects if required(kind, cell)]
    relative_only = not claims.absolute
    covered = sum(
        (kind, cell) in claims.absolute
        or (kind, direction_from(player, cell)) in claims.relative
        or (kind == PLAYER and relative_only)
        for kind, cell in targets
    )
    precision, recall = correct / claim_count, covered / len(targets)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def grade_description(text: str | None, objects: StateObjects, nearby_only: Iterable[str] = ()) -> float:
    """Score a free-text description of a state in [0, 1]; None or empty text scores 0. Never raises on text."""
    if not text:
        return 0.0
    kinds = {kind for kind, _ in objects if kind != PLAYER}
    return grade_claims(extract_claims(text, kinds), objects, nearby_only)


def _cells(cells: Sequence[Cell]) -> str:
    return " and ".join(f"({row}, {col})" for row, col in cells)


def canonical_description(objects: StateObjects, nearby_only: Iterable[str] = (), frame: str = "absolute") -> str:
    """A short description that scores 1, in one of two frames:
    - "absolute": "player at (1, 3); box at (3, 3); targets at (1, 4) and (4, 4)."
    - "relative": "box is down of me; target is right of me; target is down-right of me." — what a small
      vision model without absolute position embeddings can compute from an image (the warm-start demos).
    Kinds in `nearby_only` are named only next to the player."""
    if frame not in ("absolute", "relative"):
        raise ValueError(f"frame is 'absolute' or 'relative', got {frame!r}.")
    player = objects[0][1]
    nearby_only = set(nearby_only)
    by_kind: dict[str, list[Cell]] = {}
    for kind, cell in objects[1:]:
        if kind not in nearby_only or abs(cell[0] - player[0]) + abs(cell[1] - player[1]) <= 1:
            by_kind.setdefault(kind, []).append(cell)
    if frame == "relative":
        said = dict.fromkeys(f"{kind} is {direction_from(player, cell)} of me" for kind, cells in by_kind.items()
                             for cell in cells)  # fmt: skip
        return "; ".join(said) + "." if said else "nothing but me."
    parts = [f"{PLAYER} at {_cells([player])}"]
    parts += [f"{kind if len(cells) == 1 else kind + 's'} at {_cells(cells)}" for kind, cells in by_kind.items()]
    return "; ".join(parts) + "."
