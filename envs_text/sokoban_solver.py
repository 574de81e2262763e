"""Move-optimal Sokoban solver: breadth-first search over (player cell, box cells) states.

Each BFS edge is one player move (a walk or a push), so the first solved state found is reached
with the fewest moves. A state is one Python int, `box_bitmask * num_cells + player_cell`, which
keeps hashing cheap and memory small. Two prunings never lose a solution: a box is never pushed
onto a *dead* cell (no target can be reached from it by pushing, even in an empty room), and a
push that closes a 2x2 block of walls/boxes holding a box off target is dropped (none of those
boxes can ever move again).
"""

from __future__ import annotations

from collections import deque

from envs_text.sokoban_level import TARGET, WALL, SokobanLevel, action_offsets

DEFAULT_MAX_STATES = 1_000_000


def _live_cells(cells: list[int], width: int) -> list[bool]:
    """Cells from which a lone box could be pushed onto some target (found by pulling back from targets)."""
    live = [tile == TARGET for tile in cells]
    queue = deque(index for index, tile in enumerate(live) if tile)
    while queue:
        box = queue.popleft()
        for step in (-width, width, -1, 1):
            # Pulling the box one cell along `step` needs that cell and the one after it free of walls.
            to, player_after = box + step, box + 2 * step
            if not live[to] and cells[to] != WALL and 0 <= player_after < len(cells) and cells[player_after] != WALL:
                live[to] = True
                queue.append(to)
    return live


def _block_squares(cells: list[int], width: int) -> list[tuple[int, ...]]:
    """For each cell, bitmasks of the 2x2 squares that contain it (within the grid)."""
    height = len(cells) // width
    squares: list[tuple[int, ...]] = []
    for index in range(len(cells)):
        row, col = divmod(index, width)
        masks = []
        for top in (row - 1, row):
            for left in (col - 1, col):
                if 0 <= top < height - 1 and 0 <= left < width - 1:
                    corner = top * width + left
                    masks.append((1 << corner) | (1 << corner + 1) | (1 << corner + width) | (1 << corner + width + 1))
        squares.append(tuple(masks))
    return squares


def _plan(parent: dict[int, int], state: int, num_cells: int, width: int) -> list[str]:
    """Walk the parent links back from `state` and name each player move."""
    name_of_offset = {offset: name for name, offset in action_offsets(width).items()}
    moves: list[str] = []
    while parent[state] >= 0:
        previous = parent[state]
        moves.append(name_of_offset[state % num_cells - previous % num_cells])
        state = previous
    return moves[::-1]


def solve(level: SokobanLevel, max_states: int = DEFAULT_MAX_STATES) -> list[str] | None:
    """A fewest-moves list of actions ("Up", "Down", "Left", "Right") that solves `level`.

    Returns [] when the level is already solved, and None when it cannot be solved or when more
    than `max_states` states were visited (Boxoban 10x10 levels with 4 boxes can need millions).
    """
    height, width = level.layout.shape
    num_cells = height * width
    cells = level.layout.reshape(-1).tolist()
    walls = [tile == WALL for tile in cells]
    wall_mask = sum(1 << index for index, is_wall in enumerate(walls) if is_wall)
    target_mask = sum(1 << index for index, tile in enumerate(cells) if tile == TARGET)
    live, squares = _live_cells(cells, width), _block_squares(cells, width)
    boxes = sum(1 << (row * width + col) for row, col in level.boxes)
    if boxes == target_mask:
        return []
    start = boxes * num_cells + level.player[0] * width + level.player[1]
    parent = {start: -1}
    frontier = [start]
    offsets = (-width, width, -1, 1)
    while frontier:
        next_frontier = []
        for state in frontier:
            boxes, player = divmod(state, num_cells)
            for step in offsets:
                ahead = player + step
                if walls[ahead]:
                    continue
                new_boxes = boxes
                if boxes >> ahead & 1:
                    beyond = ahead + step
                    if walls[beyond] or boxes >> beyond & 1 or not live[beyond]:
                        continue
                    new_boxes = boxes ^ (1 << ahead) ^ (1 << beyond)
                    occupied = wall_mask | new_boxes
                    if any(occupied & sq == sq and new_boxes & sq & ~target_mask for sq in squares[beyond]):
                        continue
                child = new_boxes * num_cells + ahead
                if child in parent:
                    continue
                parent[child] = state
                if new_boxes == target_mask:
                    return _plan(parent, child, num_cells, width)
                next_frontier.append(child)
            if len(parent) > max_states:
                return None
        frontier = next_frontier
    return None
