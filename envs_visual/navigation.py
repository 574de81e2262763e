"""Navigation with an image: the room from above, drawn from a procedurally drawn sprite atlas."""

from __future__ import annotations

from functools import lru_cache
from itertools import pairwise
from typing import Any

import numpy as np
from PIL import Image

from envs_text import navigation as text_game
from envs_text.navigation import COLOURS, OBJECT_TYPES, NavigationTextEnv, object_code
from envs_visual.tiles import (
    DEFAULT_TILE_PX,
    RGB,
    Painter,
    Pen,
    build_atlas,
    check_grid_image,
    check_tile_px,
    figure,
    render_grid,
)

FLOOR_FILL, FLOOR_LINE = (228, 226, 218), (206, 203, 192)
STONE, STONE_LIGHT, STONE_GAP = (88, 94, 108), (112, 119, 134), (52, 56, 66)
PLAYER_SHIRT = (236, 120, 30)  # orange: none of the object colours, so the player never reads as an object
OBJECT_RGB: dict[str, RGB] = {
    "red": (214, 48, 49),
    "green": (46, 160, 67),
    "blue": (40, 100, 220),
    "yellow": (245, 200, 30),
    "purple": (142, 68, 173),
}


def _shade(colour: RGB, factor: float) -> RGB:
    """`colour` darkened (factor < 1) or lightened towards white (factor > 1)."""
    if factor <= 1:
        return tuple(round(c * factor) for c in colour)
    return tuple(round(c + (255 - c) * (factor - 1)) for c in colour)


def _floor(pen: Pen) -> None:
    pen.rect(0, 0, 1, 1, fill=FLOOR_FILL, outline=FLOOR_LINE, width=0.03)


def _wall(pen: Pen) -> None:
    """Two courses of staggered stone blocks: reads as a wall from above, distinct from any object."""
    pen.rect(0, 0, 1, 1, fill=STONE_GAP)
    for row, blocks in enumerate(((0.0, 0.5, 1.0), (-0.25, 0.25, 0.75, 1.25))):
        y0, y1 = row * 0.5 + 0.03, row * 0.5 + 0.47
        for x0, x1 in pairwise(blocks):
            x0, x1 = max(x0 + 0.03, 0.0), min(x1 - 0.03, 1.0)
            pen.rect(x0, y0, x1, y1, fill=STONE, radius=0.04)
            pen.rect(x0, y0, x1, y0 + 0.07, fill=STONE_LIGHT, radius=0.03)


def _ball(colour: RGB) -> Painter:
    def paint(pen: Pen) -> None:
        pen.ellipse(0.16, 0.78, 0.84, 0.92, fill=FLOOR_LINE)  # shadow
        pen.ellipse(0.14, 0.12, 0.86, 0.84, fill=colour, outline=_shade(colour, 0.55), width=0.05)
        pen.ellipse(0.28, 0.24, 0.46, 0.42, fill=_shade(colour, 1.55))  # glint: a sphere, not a disc

    return paint


def _key(colour: RGB) -> Painter:
    """A key lying diagonally: ring at the top-left, shaft and two teeth towards the bottom-right."""

    def paint(pen: Pen) -> None:
        dark = _shade(colour, 0.55)
        for ink, extra in ((dark, 0.05), (colour, 0.0)):  # dark pass first: an outline around the metal
            pen.line([(0.38, 0.38), (0.84, 0.84)], fill=ink, width=0.13 + extra)
            pen.line([(0.66, 0.66), (0.80, 0.52)], fill=ink, width=0.11 + extra)
            pen.line([(0.76, 0.76), (0.90, 0.62)], fill=ink, width=0.11 + extra)
        pen.ellipse(0.08, 0.08, 0.50, 0.50, fill=colour, outline=dark, width=0.04)
        pen.ellipse(0.20, 0.20, 0.38, 0.38, fill=FLOOR_FILL, outline=dark, width=0.03)  # the hole in the ring

    return paint


def _box(colour: RGB) -> Painter:
    def paint(pen: Pen) -> None:
        dark, light = _shade(colour, 0.55), _shade(colour, 1.35)
        pen.rect(0.12, 0.12, 0.88, 0.88, fill=colour, outline=dark, width=0.06, radius=0.04)
        pen.rect(0.24, 0.24, 0.76, 0.76, outline=dark, width=0.04)
        pen.line([(0.26, 0.26), (0.74, 0.74)], fill=dark, width=0.06)
        pen.line([(0.26, 0.74), (0.74, 0.26)], fill=light, width=0.05)

    return paint


_OBJECT_PAINTERS = {"ball": _ball, "key": _key, "box": _box}


@lru_cache(maxsize=16)
def navigation_atlas(tile_px: int = DEFAULT_TILE_PX) -> np.ndarray:
    """Navigation sprites indexed by the text game's grid codes: (NUM_CODES, tile_px, tile_px, 3) uint8, read-only."""
    layers: list[list[Painter]] = [[] for _ in range(text_game.NUM_CODES)]
    layers[text_game.FLOOR] = [_floor]
    layers[text_game.WALL] = [_wall]
    layers[text_game.PLAYER] = [_floor, lambda pen: figure(pen, PLAYER_SHIRT)]
    for colour in COLOURS:
        for kind in OBJECT_TYPES:
            layers[object_code(colour, kind)] = [_floor, _OBJECT_PAINTERS[kind](OBJECT_RGB[colour])]
    return build_atlas(layers, tile_px)


def render_navigation(grid: np.ndarray, tile_px: int = DEFAULT_TILE_PX) -> Image.Image:
    """An (H, W) Navigation code grid as an RGB image of exactly (W·tile_px) × (H·tile_px) pixels."""
    return render_grid(grid, navigation_atlas(tile_px))


class NavigationEnv(NavigationTextEnv):
    """`NavigationTextEnv` plus an image of the room seen from above.

    `tile_px` is the side of one cell in pixels (default 28): a 7×7 room is a 196×196 image, never
    rescaled. Floor is pale stone, walls grey blocks, the player a figure in an orange shirt; balls
    are shaded spheres, keys diagonal keys, boxes crates, each in its colour. The instruction stays
    text (in the first observation). All other keyword arguments are `NavigationTextEnv`'s.
    """

    def __init__(self, *, tile_px: int = DEFAULT_TILE_PX, **kwargs: Any) -> None:
        self.tile_px = check_tile_px(tile_px)
        super().__init__(**kwargs)
        self.image_pixels = check_grid_image(self.size, self.size, self.tile_px)

    def _render_image(self) -> Image.Image:
        return render_navigation(self.grid(), self.tile_px)

    def _legend_text(self) -> str:
        picture = (
            "The image shows the room from above: you are the person in the orange shirt, grey blocks are "
            "walls, and each object is a coloured ball, key or box."
        )
        if self.observation_mode == "image":
            return picture
        if self.observation_mode == "text+image":
            return f"{picture}\n{super()._legend_text()}"
        return super()._legend_text()

    def describe_state(self) -> str:
        """One line naming where things are, in (row, col) from the top-left (scripted reasoning, captions)."""
        room = self._require_room()
        objects = ", ".join(f"{room.name(i)} at {cell}" for i, (_, _, cell) in enumerate(room.objects))
        return f"Player at {self.player}; target {room.name(room.target)} at {self.target_cell()}; objects: {objects}."
