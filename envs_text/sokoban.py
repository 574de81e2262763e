"""Sokoban with text observations: the reverse-play level generator and the env (the board: `sokoban_level`).

Every generated level is solvable by construction: it is made by starting from the solved state
(all boxes on their targets) and playing random *pulls* backwards; reversing those moves is a
forward solution. The tile codes and `SYMBOLS` are shared with the visual variant and the solver.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs_text.boxoban import load_level_set
from envs_text.limits import check_grid
from envs_text.sokoban_level import (  # re-exported: the board is part of this module's public surface
    ACTIONS,
    BOX,
    BOX_ON_TARGET,
    FLOOR,
    PLAYER,
    PLAYER_ON_TARGET,
    SYMBOLS,
    TARGET,
    TILE_NAMES,
    WALL,
    SokobanLevel,
    action_offsets,
    render_text,
)
from envs_text.sokoban_solver import solve
from vagen.env.base import ActionResult, LanguageEnv
from vagen.env.grading import side_neighbours
from vagen.env.observation import check_cell_separator, check_list_positions, positions_line
from vagen.env.policies import SIDES, relative_direction

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
SUCCESS_REWARD = 10.0


# ---- generation by reverse play ---------------------------------------------------------------
_TURN_PROBABILITY = 0.35  # of the carving walk changing direction at a step
_PULL_PROBABILITY = 0.8  # of dragging the box behind the player along during reverse play
_MIN_DISPLACEMENT = 2  # total box distance from the targets a level must have
_CARVE_STEPS_PER_SIDE = 4.0  # carving-walk length per cell of room height + width: ~60% of the inside becomes floor


def _carve_room(rng: np.random.Generator, height: int, width: int) -> list[int]:
    """Flat row-major list of WALL/FLOOR: a random walk inside the border that widens now and then."""
    cells = [WALL] * (height * width)
    inner_h, inner_w = height - 2, width - 2
    num_steps = int(_CARVE_STEPS_PER_SIDE * (inner_h + inner_w))
    draws = rng.random((num_steps + 1, 2)).tolist()
    row, col = 1 + int(draws[0][0] * inner_h), 1 + int(draws[0][1] * inner_w)
    d_row, d_col = (0, 1)
    for turn, brush in draws[1:]:
        cells[row * width + col] = FLOOR
        # Carving a neighbour too (a quarter of the time each way) makes 2-wide areas where boxes can turn.
        if brush < 0.25 and col + 1 <= inner_w:
            cells[row * width + col + 1] = FLOOR
        elif brush > 0.75 and row + 1 <= inner_h:
            cells[(row + 1) * width + col] = FLOOR
        if turn < _TURN_PROBABILITY:
            d_row, d_col = ((-1, 0), (1, 0), (0, -1), (0, 1))[int(turn / _TURN_PROBABILITY * 4)]
        if 1 <= row + d_row <= inner_h and 1 <= col + d_col <= inner_w:
            row, col = row + d_row, col + d_col
    return cells


def _reverse_play(
    cells: list[int], width: int, targets: list[int], player: int, draws: list[float]
) -> tuple[tuple[int, ...], int] | None:
    """Random walk backwards from the solved state (boxes on `targets`), pulling boxes.

    Returns the hardest-looking state seen (most boxes off target, then the largest total box
    displacement) as (flat box cells, flat player cell), or None if no state reached
    `_MIN_DISPLACEMENT` (a level one push away from solved teaches nothing).
    """
    offsets = (-width, width, -1, 1)
    box_at = {cell: cell for cell in targets}  # current cell → the target the box started on
    best_score, best = (0, 0), None
    for draw in draws:
        scaled = draw * 4
        step = offsets[int(scaled)]
        ahead = player + step
        if cells[ahead] == WALL or ahead in box_at:
            continue
        behind = player - step
        pulled = behind in box_at and scaled - int(scaled) < _PULL_PROBABILITY
        if pulled:
            box_at[player] = box_at.pop(behind)
        player = ahead
        if not pulled:
            continue
        off_target = sum(cells[cell] != TARGET for cell in box_at)
        displacement = 0
        for cell, home in box_at.items():
            (row, col), (home_row, home_col) = divmod(cell, width), divmod(home, width)
            displacement += abs(row - home_row) + abs(col - home_col)
        if displacement >= _MIN_DISPLACEMENT and (off_target, displacement) > best_score:
            best_score, best = (off_target, displacement), (tuple(box_at), player)
    return best


def _walkable_region(cells: list[int], width: int, start: int, boxes: set[int]) -> list[int]:
    """Cells the player reaches from `start` without moving a box, in a deterministic order."""
    seen, stack = {start}, [start]
    while stack:
        cell = stack.pop()
        for neighbour in (cell - width, cell + width, cell - 1, cell + 1):
            if neighbour not in seen and cells[neighbour] != WALL and neighbour not in boxes:
                seen.add(neighbour)
                stack.append(neighbour)
    return sorted(seen)


def generate_level(
    rng: np.random.Generator,
    dim_room: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    *,
    reverse_steps: int | None = None,
    max_attempts: int = 1000,
) -> SokobanLevel:
    """A random solvable level (H, W) = `dim_room` with `num_boxes` boxes, using only `rng`.

    Carves a room, puts boxes on random targets and the player on a random floor cell, then plays
    `reverse_steps` random backward moves (default 12·(H+W)) and keeps the hardest state seen; the
    player then starts on a random cell it can walk to from there. Rooms too small for the boxes,
    and walks that never move the boxes `_MIN_DISPLACEMENT` cells in total, are retried.
    """
    height, width = dim_room
    if height < 5 or width < 5:
        raise ValueError(f"dim_room must be at least (5, 5) (walls + a 3x3 inside), got {dim_room}.")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}.")
    reverse_steps = 12 * (height + width) if reverse_steps is None else reverse_steps
    for _ in range(max_attempts):
        cells = _carve_room(rng, height, width)
        floor = [index for index, tile in enumerate(cells) if tile == FLOOR]
        if len(floor) < 2 * num_boxes + 2:
            continue
        picks = rng.choice(len(floor), size=num_boxes + 1, replace=False).tolist()
        targets = [floor[pick] for pick in picks[:num_boxes]]
        for cell in targets:
            cells[cell] = TARGET
        found = _reverse_play(cells, width, targets, floor[picks[-1]], rng.random(reverse_steps).tolist())
        if found is None:
            continue
        boxes, player = found
        # Any cell the player can walk to from there is an equally solvable start, and most need walking.
        reachable = _walkable_region(cells, width, player, set(boxes))
        player = reachable[int(rng.integers(len(reachable)))]
        layout = np.array(cells, dtype=np.uint8).reshape(height, width)
        return SokobanLevel(layout, tuple(sorted(divmod(cell, width) for cell in boxes)), divmod(player, width))
    raise RuntimeError(
        f"Could not generate a {dim_room} level with {num_boxes} boxes in {max_attempts} attempts; "
        "use a larger dim_room or fewer boxes."
    )


# ---- the environment --------------------------------------------------------------------------
class SokobanTextEnv(LanguageEnv):
    """Sokoban played by writing actions, seeing the grid as text.

    Description:
        Push every box onto a target. Levels are generated by reverse play (solvable by
        construction) with `dim_room` and `num_boxes`, or taken from a Boxoban file with
        `level_set` ("boxoban_test", "boxoban_hard", or a path), optionally only its first `num_levels`,
        where `reset(seed=i)` plays level i mod the number of levels (so the evaluator's seeds
        1e9 + k play levels k, k+1, ... of a 100- or 1000-level panel in file order).
        `reset(options={"level": SokobanLevel})` plays a given level.
    Actions:
        "Up", "Down", "Left", "Right", several per turn (see `LanguageEnv`).
    Observations:
        The grid as rows of `SYMBOLS`, derived from `grid()` (the visual variant renders `grid()` too), with
        `cell_separator` between the cells of a row (see `check_cell_separator`). With `list_positions`, a line
        under the grid also lists the (row, col) of the player, every box and every target (`state_objects`), so
        a text model need not find a symbol's column in a BPE-merged row (for SmolLM2's 60-step warm start it made
        no measurable change: README, text default). With `reading_walls`, `demo_reasoning` (the warm starts'
        `<think>`) also names the walls next to the box it is about, and (`wall_labels`) the vision pre-training
        learns every tile's wall neighbours (`tile_facts`). With `reading_push`, it also names the direction of the
        solver plan's first push ("..., push box left first.").
    Rewards:
        `step_penalty` per executed action (-0.1, gym-sokoban's), +1 for a box onto a target, -1 for a box off
        a target, +10 when all boxes are on targets. A push into a wall or a second box does nothing but still
        costs the step penalty. With `step_penalty_on_solve`, the step penalties of all the episode's actions are
        charged together at the solving action and a failed episode pays none: solutions are still ranked by
        length, while failed attempts are not ranked by how little they moved.
        With `distance_shaping` = c > 0, each action also earns c · (d before − d after), where d is the
        solver's fewest-moves distance to the solution (`2 · (height + width)` from a dead end): a
        potential-based shaping (Ng, Harada & Russell 1999) that keeps the optimal policies and gives a
        failed episode a graded return (how close it got) instead of only step costs.
    Episode end:
        terminated when all boxes are on targets; truncated after `max_steps` actions or `max_turns` turns.
    """

    action_names = ACTIONS
    example_answer = "Left || Up"
    solver_max_states = 1_000_000

    def __init__(
        self,
        *,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 100,
        level_set: str | None = None,
        num_levels: int | None = None,
        distance_shaping: float = 0.0,
        step_penalty: float = STEP_PENALTY,
        step_penalty_on_solve: bool = False,
        cell_separator: str = "",
        list_positions: bool = False,
        reading_walls: bool = False,
        wall_labels: bool = True,
        reading_push: bool = False,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(**base_kwargs)
        for name, value in (
            ("reading_walls", reading_walls),
            ("wall_labels", wall_labels),
            ("reading_push", reading_push),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}.")
        self.reading_walls, self.wall_labels, self.reading_push = reading_walls, wall_labels, reading_push
        if not step_penalty <= 0:
            raise ValueError(f"step_penalty must be <= 0 (a cost per action; 0 = none), got {step_penalty}.")
        self.step_penalty = float(step_penalty)
        if not isinstance(step_penalty_on_solve, bool):
            raise ValueError(f"step_penalty_on_solve must be true or false, got {step_penalty_on_solve!r}.")
        self.step_penalty_on_solve = step_penalty_on_solve
        if not distance_shaping >= 0:
            raise ValueError(f"distance_shaping must be >= 0 (0 = off), got {distance_shaping}.")
        self.distance_shaping = float(distance_shaping)
        self.cell_separator = check_cell_separator(cell_separator)
        self.list_positions = check_list_positions(list_positions)
        if len(dim_room) != 2 or min(dim_room) < 5:
            raise ValueError(f"dim_room must be (height, width) with both >= 5, got {dim_room!r}.")
        check_grid(dim_room[0], dim_room[1], "dim_room", list(dim_room))
        if num_boxes < 1:
            raise ValueError(f"num_boxes must be >= 1, got {num_boxes}.")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}.")
        self.dim_room = (int(dim_room[0]), int(dim_room[1]))
        self.num_boxes = int(num_boxes)
        self.max_steps = int(max_steps)
        self.level_set = level_set
        self._levels: tuple[SokobanLevel, ...] | None = None
        if level_set is not None:
            self._levels = load_level_set(level_set)
            if num_levels is not None:
                if not 1 <= num_levels <= len(self._levels):
                    raise ValueError(f"num_levels must be in 1..{len(self._levels)} ({level_set!r}), got {num_levels}.")
                self._levels = self._levels[:num_levels]
        elif num_levels is not None:
            raise ValueError("num_levels picks the first levels of a level_set; set level_set or num_levels=null.")
        self._seed_for_level: int | None = None
        self._layout: np.ndarray | None = None  # set by reset()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._seed_for_level = seed
        return super().reset(seed=seed, options=options)

    def _reset_game(self, options: dict[str, Any] | None) -> None:
        if options and "level" in options:
            level = options["level"]
            if not isinstance(level, SokobanLevel):
                raise TypeError(f"options['level'] must be a SokobanLevel, got {type(level).__name__}.")
            level.validate()
        elif self._levels is not None:
            index = self._seed_for_level
            if index is None:
                index = int(self.np_random.integers(len(self._levels)))
            index %= len(self._levels)
            level = self._levels[index]
        else:
            level = generate_level(self.np_random, self.dim_room, self.num_boxes)
        self._load(level)

    def _load(self, level: SokobanLevel) -> None:
        """Hold the state as flat indices and a set of box cells: what makes `_apply` a few dict lookups."""
        self._layout = level.layout
        self._width = level.layout.shape[1]
        self._fixed = level.layout.reshape(-1).tolist()
        self._offsets = action_offsets(self._width)
        self._boxes = {row * self._width + col for row, col in level.boxes}
        self._player = level.player[0] * self._width + level.player[1]
        self._boxes_on_target = sum(self._fixed[cell] == TARGET for cell in self._boxes)
        self._steps = 0
        self._distance = self._solution_distance() if self.distance_shaping else 0

    def _apply(self, action: str) -> ActionResult:
        if self._steps >= self.max_steps:
            return ActionResult(reward=0.0, effective=False, truncated=True)
        self._steps += 1
        fixed, boxes, step = self._fixed, self._boxes, self._offsets[action]
        reward, effective = (0.0 if self.step_penalty_on_solve else self.step_penalty), False
        ahead = self._player + step
        if fixed[ahead] != WALL:
            if ahead not in boxes:
                self._player, effective = ahead, True
            elif fixed[ahead + step] != WALL and ahead + step not in boxes:
                boxes.remove(ahead)
                boxes.add(ahead + step)
                if fixed[ahead] == TARGET:
                    reward += BOX_OFF_TARGET_PENALTY
                    self._boxes_on_target -= 1
                if fixed[ahead + step] == TARGET:
                    reward += BOX_ON_TARGET_REWARD
                    self._boxes_on_target += 1
                self._player, effective = ahead, True
        if self.distance_shaping and effective:
            distance, self._distance = self._distance, self._solution_distance()
            reward += self.distance_shaping * (distance - self._distance)
        success = self._boxes_on_target == len(boxes)
        if success:
            reward += SUCCESS_REWARD + (self.step_penalty * self._steps if self.step_penalty_on_solve else 0.0)
        out_of_steps = not success and self._steps >= self.max_steps
        return ActionResult(
            reward=reward, effective=effective, terminated=success, truncated=out_of_steps, success=success
        )

    def _solution_distance(self) -> int:
        """Fewest moves to solve from here; 0 when solved, `2 · (height + width)` from a dead end."""
        if self._boxes_on_target == len(self._boxes):
            return 0
        plan = self.solver_actions()
        return len(plan) if plan else 2 * sum(self._layout.shape)

    def _key_objects(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(row, col) of the player, of the first unplaced box and of the first free target (None when all placed)."""
        grid = self.grid()
        player = np.argwhere(np.isin(grid, (PLAYER, PLAYER_ON_TARGET)))[0]
        boxes = np.argwhere(grid == BOX)
        targets = np.argwhere(np.isin(grid, (TARGET, PLAYER_ON_TARGET)))
        return player, (boxes[0] if len(boxes) else None), (targets[0] if len(targets) else None)

    def demo_reasoning(self) -> str:
        """Where the first unplaced box is from the player and where a free target is from the box, in relative
        words: "box is up-left of me, target is down of box." With `reading_walls`, also the sides of that box that
        are walls, where a push can never go: "..., walls up left of box." or "..., no wall next to box." """
        player, box, target = self._key_objects()
        if box is None or target is None:
            return "all boxes are on targets."
        box_from_me, target_from_box = relative_direction(*(box - player)), relative_direction(*(target - box))
        reading = f"box is {box_from_me} of me, target is {target_from_box} of box"
        if self.reading_walls:
            walls = [side for side, wall in zip(SIDES, self._wall_neighbours()[tuple(box)], strict=True) if wall]
            reading += f", walls {' '.join(walls)} of box" if walls else ", no wall next to box"
        push = self._first_push() if self.reading_push else None
        if push is not None:
            reading += f", push box {push.lower()} first"
        return reading + "."

    def _first_push(self) -> str | None:
        """The action of the first push in the solver's plan from here (None without a plan)."""
        grid = self.grid()
        width = grid.shape[1]
        player = int(np.flatnonzero(np.isin(grid, (PLAYER, PLAYER_ON_TARGET)))[0])
        boxes = set(np.flatnonzero(np.isin(grid, (BOX, BOX_ON_TARGET))).tolist())
        offsets = action_offsets(width)
        for action in self.solver_actions():
            player += offsets[action]
            if player in boxes:
                return action
        return None

    def key_cells(self) -> list[tuple[int, int]]:
        """Player, the box `demo_reasoning` names (a placed one when all are placed) and its target (or the box)."""
        player, box, target = self._key_objects()
        if box is None:
            box = np.argwhere(self.grid() == BOX_ON_TARGET)[0]
        target = box if target is None else target
        return [tuple(int(v) for v in cell) for cell in (player, box, target)]

    def tile_facts(self) -> np.ndarray | None:
        """With `reading_walls` and `wall_labels`: for every tile, whether its up, down, left and right neighbours are
        walls (1) or not (0), off the board counting as wall; so that the box's own image token carries the walls its
        reading names."""
        if not (self.reading_walls and self.wall_labels):
            return None
        return self._wall_neighbours().reshape(-1, len(SIDES)).astype(np.int64)

    def _wall_neighbours(self) -> np.ndarray:
        """(H, W, 4) bool: whether each cell's up, down, left and right neighbours are walls (off the board: yes)."""
        return side_neighbours(self._layout == WALL, off_board=True)

    def state_key(self) -> tuple[int, tuple[int, ...]]:
        """The player's cell and the sorted box cells (flat indices): the level's walls and targets never move."""
        return self._player, tuple(sorted(self._boxes))

    def state_objects(self) -> list[tuple[str, tuple[int, int]]]:
        """Player, every box and every target (a box on a target is listed as both), in (row, col)."""
        grid = self.grid()
        kinds = {
            "player": (PLAYER, PLAYER_ON_TARGET),
            "box": (BOX, BOX_ON_TARGET),
            "target": (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET),
        }
        return [(kind, (int(r), int(c))) for kind, codes in kinds.items() for r, c in np.argwhere(np.isin(grid, codes))]

    def current_level(self) -> SokobanLevel:
        """The current position as a level (fixed layout, box cells, player cell)."""
        boxes = tuple(sorted(divmod(cell, self._width) for cell in self._boxes))
        return SokobanLevel(self._layout, boxes, divmod(self._player, self._width))

    def grid(self) -> np.ndarray:
        """The current tile-code grid (H, W) uint8; the text and the image are both drawn from it."""
        if self._layout is None:
            raise RuntimeError("SokobanTextEnv has no level yet; call reset() first.")
        grid = self._layout.copy()
        flat = grid.reshape(-1)
        for cell in self._boxes:
            flat[cell] = BOX_ON_TARGET if flat[cell] == TARGET else BOX
        flat[self._player] = PLAYER_ON_TARGET if flat[self._player] == TARGET else PLAYER
        return grid

    def _state_text(self) -> str:
        grid_text = render_text(self.grid(), self.cell_separator)
        return f"{grid_text}\n{positions_line(self.state_objects())}" if self.list_positions else grid_text

    def _rules_text(self) -> str:
        legend = ", ".join(f"{SYMBOLS[code]} {TILE_NAMES[code]}" for code in SYMBOLS)
        return (
            "You are playing Sokoban. You are the player; push every box onto a target to win. You push a box by "
            "walking into it; boxes cannot be pulled, and a box cannot be pushed into a wall or another box.\n"
            f"Symbols: {legend}. The first row is the top of the grid.\n"
            f"Actions: {', '.join(ACTIONS)}.\n"
            "Rewards: -0.1 per action, +1 for a box onto a target, -1 for a box off a target, "
            "+10 when all boxes are on targets."
        )

    def solver_actions(self) -> list[str]:
        """A fewest-moves plan from the current state; [] if solved, unsolvable or too big for the solver."""
        return solve(self.current_level(), max_states=self.solver_max_states) or []
