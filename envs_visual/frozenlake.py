"""FrozenLake with an image: the lake drawn from a procedurally drawn sprite atlas."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from envs_text import frozenlake as text_game
from envs_text.frozenlake import FrozenLakeTextEnv
from envs_visual.tiles import (
    DEFAULT_TILE_PX,
    FROZENLAKE_CODES,
    cells_text,
    check_grid_image,
    check_tile_px,
    frozenlake_atlas,
    render_grid,
)

# The atlas row for a cell is its grid() code: fail at import if the text game ever renumbers them.
assert [getattr(text_game, name.upper()) for name in FROZENLAKE_CODES] == list(range(len(FROZENLAKE_CODES)))


def render_frozenlake(grid: np.ndarray, tile_px: int = DEFAULT_TILE_PX) -> Image.Image:
    """An (H, W) FrozenLake code grid as an RGB image of exactly (W·tile_px) × (H·tile_px) pixels."""
    return render_grid(grid, frozenlake_atlas(tile_px))


class FrozenLakeEnv(FrozenLakeTextEnv):
    """`FrozenLakeTextEnv` plus an image of the lake.

    `tile_px` is the side of one cell in pixels (default 28, one image token of Qwen2.5-VL per cell): a 4×4 lake is a
    112×112 image. The image is never rescaled. Ice is pale blue, holes dark water, the goal a red flag in a gold
    frame, the player a figure in red (sinking, in grey, when in a hole). All other keyword arguments are
    `FrozenLakeTextEnv`'s.
    """

    def __init__(self, *, tile_px: int = DEFAULT_TILE_PX, **kwargs: Any) -> None:
        self.tile_px = check_tile_px(tile_px)
        super().__init__(**kwargs)
        rows, cols = (len(self.fixed_desc), len(self.fixed_desc[0])) if self.fixed_desc else (self.size, self.size)
        self.image_pixels = check_grid_image(rows, cols, self.tile_px)

    def _render_image(self) -> Image.Image:
        return render_frozenlake(self.grid(), self.tile_px)

    def describe_state(self) -> str:
        """One line naming where things are, in (row, col) from the top-left (scripted reasoning, captions)."""
        grid, g = self.grid(), text_game
        return (
            f"Player at {cells_text(grid, (g.PLAYER, g.PLAYER_IN_HOLE, g.PLAYER_ON_GOAL))}; goal at "
            f"{cells_text(grid, (g.GOAL, g.PLAYER_ON_GOAL))}; holes at {cells_text(grid, (g.HOLE, g.PLAYER_IN_HOLE))}."
        )
