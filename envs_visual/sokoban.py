"""Sokoban with an image: the grid drawn from a procedurally drawn sprite atlas."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from envs_text import sokoban as text_game
from envs_text.sokoban import SokobanTextEnv
from envs_visual.tiles import (
    DEFAULT_TILE_PX,
    SOKOBAN_CODES,
    cells_text,
    check_grid_image,
    check_tile_px,
    render_grid,
    sokoban_atlas,
)

# The atlas row for a cell is its grid() code: fail at import if the text game ever renumbers them.
assert [getattr(text_game, name.upper()) for name in SOKOBAN_CODES] == list(range(len(SOKOBAN_CODES)))


def render_sokoban(grid: np.ndarray, tile_px: int = DEFAULT_TILE_PX) -> Image.Image:
    """An (H, W) Sokoban code grid as an RGB image of exactly (W·tile_px) × (H·tile_px) pixels."""
    return render_grid(grid, sokoban_atlas(tile_px))


class SokobanEnv(SokobanTextEnv):
    """`SokobanTextEnv` plus an image of the room.

    `tile_px` is the side of one cell in pixels (default 28, one image token of Qwen2.5-VL per cell): a 6×6 room is a
    168×168 image, a 10×10 room 280×280. The image is never rescaled; pick `tile_px` for the model's vision input.
    Walls are bricks, targets red squares, boxes wooden crates (green once on a target), the player
    a figure in blue. All other keyword arguments are `SokobanTextEnv`'s.
    """

    def __init__(self, *, tile_px: int = DEFAULT_TILE_PX, **kwargs: Any) -> None:
        self.tile_px = check_tile_px(tile_px)
        super().__init__(**kwargs)
        shapes = [level.layout.shape for level in self._levels] if self._levels else [self.dim_room]
        self.image_pixels = check_grid_image(
            max(rows for rows, _ in shapes), max(cols for _, cols in shapes), self.tile_px
        )

    def _render_image(self) -> Image.Image:
        return render_sokoban(self.grid(), self.tile_px)

    def describe_state(self) -> str:
        """One line naming where things are, in (row, col) from the top-left (scripted reasoning, captions)."""
        grid, g = self.grid(), text_game
        on_target = int(np.count_nonzero(grid == g.BOX_ON_TARGET))
        boxes = int(np.count_nonzero(np.isin(grid, (g.BOX, g.BOX_ON_TARGET))))
        return (
            f"Player at {cells_text(grid, (g.PLAYER, g.PLAYER_ON_TARGET))}; boxes at "
            f"{cells_text(grid, (g.BOX, g.BOX_ON_TARGET))}; targets at "
            f"{cells_text(grid, (g.TARGET, g.BOX_ON_TARGET, g.PLAYER_ON_TARGET))}; {on_target}/{boxes} boxes placed."
        )
