"""Procedurally drawn sprite atlases and the vectorised grid renderer.

A grid game's image is `atlas[grid]` laid out tile by tile: one fancy-indexing gather and one
reshape, no per-tile Python loop, so a 6×6 render costs microseconds. Each atlas is drawn once
per (game, tile_px) with PIL shapes (no image files) and cached.

Sprites are designed in unit coordinates (0..1 of a tile) and drawn at `SUPERSAMPLE`× the tile
size, then box-filtered down to exactly `tile_px`: that anti-aliases the edges of the sprite
itself. The rendered observation is never resized: its size is always grid shape × tile_px.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from envs_text.limits import check_fits, memory_budget

SUPERSAMPLE = 4
MIN_TILE_PX = 8
DEFAULT_TILE_PX = 28  # one 28-pixel tile = one merged 2x2 patch of Qwen2.5-VL's 14-pixel grid: one image token per cell

# Code order is the text games' `grid()` contract: row i of an atlas is the sprite for code i.
SOKOBAN_CODES = ("wall", "floor", "target", "box_on_target", "box", "player", "player_on_target")
FROZENLAKE_CODES = ("frozen", "hole", "goal", "player", "player_in_hole", "player_on_goal")

RGB = tuple[int, int, int]


class Pen:
    """Draws on a square canvas in unit coordinates (0..1 of its side), so one sprite design
    serves every tile size."""

    def __init__(self, size_px: int, background: RGB = (0, 0, 0)) -> None:
        self.size = size_px
        self.image = Image.new("RGB", (size_px, size_px), background)
        self.draw = ImageDraw.Draw(self.image)

    def px(self, value: float) -> int:
        return round(value * self.size)

    def _box(self, x0: float, y0: float, x1: float, y1: float) -> list[int]:
        return [self.px(x0), self.px(y0), self.px(x1) - 1, self.px(y1) - 1]

    def _width(self, width: float) -> int:
        return max(1, self.px(width))

    def rect(self, x0, y0, x1, y1, fill=None, outline=None, width=0.0, radius=0.0) -> None:
        self.draw.rounded_rectangle(
            self._box(x0, y0, x1, y1),
            radius=self.px(radius),
            fill=fill,
            outline=outline,
            width=self._width(width) if outline else 0,
        )

    def ellipse(self, x0, y0, x1, y1, fill=None, outline=None, width=0.0) -> None:
        self.draw.ellipse(
            self._box(x0, y0, x1, y1), fill=fill, outline=outline, width=self._width(width) if outline else 0
        )

    def chord(self, x0, y0, x1, y1, start: float, end: float, fill=None) -> None:
        self.draw.chord(self._box(x0, y0, x1, y1), start, end, fill=fill)

    def line(self, points: Sequence[tuple[float, float]], fill: RGB, width: float) -> None:
        self.draw.line(
            [(self.px(x), self.px(y)) for x, y in points], fill=fill, width=self._width(width), joint="curve"
        )

    def polygon(self, points: Sequence[tuple[float, float]], fill=None, outline=None) -> None:
        self.draw.polygon([(self.px(x), self.px(y)) for x, y in points], fill=fill, outline=outline)


Painter = Callable[[Pen], None]


def check_tile_px(tile_px: int) -> int:
    if not isinstance(tile_px, (int, np.integer)) or isinstance(tile_px, bool) or tile_px < MIN_TILE_PX:
        raise ValueError(
            f"tile_px must be an integer >= {MIN_TILE_PX} (sprites are illegible below that), "
            f"got {tile_px!r}; try 16, 24 or 32."
        )
    return int(tile_px)


# An observation pixel: the gathered tiles and their contiguous copy (3 + 3 bytes), PIL's RGB image (4), and the
# processor's float32 rescaled and normalised copies (2 x 12); a drawing canvas holds 4 bytes per pixel.
BYTES_PER_PIXEL = 34
CANVAS_BYTES_PER_PIXEL = 4


def check_image_fits(width: int, height: int, what: str, fix: str, supersample: int = 1) -> int:
    """Refuse an observation image of width × height pixels (drawn on a `supersample`× canvas) that cannot fit in
    memory, before anything is drawn; `what` and `fix` name the option in the message. Returns its pixel count, which
    visual envs keep as `image_pixels` so that a trainer can plan a batch of images before the first one is drawn."""
    need = width * height * (BYTES_PER_PIXEL + CANVAS_BYTES_PER_PIXEL * supersample**2)
    check_fits(need, f"{what} draws a {width}x{height} image", fix)
    return width * height


def check_grid_image(rows: int, cols: int, tile_px: int) -> int:
    """Refuse a `tile_px` whose image of a rows × cols grid (and its supersampled sprites) cannot fit in memory;
    returns the image's pixel count."""
    per_tile = rows * cols * BYTES_PER_PIXEL + CANVAS_BYTES_PER_PIXEL * SUPERSAMPLE**2
    budget = memory_budget()
    largest = int((budget / per_tile) ** 0.5) if budget else tile_px
    fix = f"lower tile_px (at most {largest} fits; 28 px is one Qwen2.5-VL token per cell)"
    if tile_px > largest:
        check_image_fits(cols * tile_px, rows * tile_px, f"tile_px={tile_px}", fix)
    return rows * cols * tile_px**2


def build_atlas(layers_per_code: Sequence[Sequence[Painter]], tile_px: int) -> np.ndarray:
    """Draw one sprite per code, each the painters of its list applied in order (later on top).

    Returns a read-only (n_codes, tile_px, tile_px, 3) uint8 array.
    """
    tile_px = check_tile_px(tile_px)
    sprites = []
    for painters in layers_per_code:
        pen = Pen(tile_px * SUPERSAMPLE)
        for paint in painters:
            paint(pen)
        sprites.append(np.asarray(pen.image.reduce(SUPERSAMPLE), dtype=np.uint8))
    atlas = np.stack(sprites)  # (n_codes, t, t, 3)
    atlas.setflags(write=False)  # shared through the cache: nobody may edit it in place
    return atlas


def render_grid(grid: np.ndarray, atlas: np.ndarray) -> Image.Image:
    """Render an (H, W) integer grid of codes with an (n_codes, t, t, 3) atlas.

    Returns an RGB image of exactly W·t × H·t pixels (width × height).
    """
    grid = np.asarray(grid)
    if grid.ndim != 2 or not np.issubdtype(grid.dtype, np.integer):
        raise ValueError(f"grid must be a 2-D integer array, got shape {grid.shape} dtype {grid.dtype}.")
    if grid.size and (grid.min() < 0 or grid.max() >= len(atlas)):
        raise ValueError(f"grid codes must lie in [0, {len(atlas)}); got range [{grid.min()}, {grid.max()}].")
    height, width = grid.shape
    tile = atlas.shape[1]
    tiles = atlas[grid]  # (H, W, t, t, 3)
    pixels = tiles.transpose(0, 2, 1, 3, 4).reshape(height * tile, width * tile, 3)  # (H·t, W·t, 3)
    return Image.fromarray(np.ascontiguousarray(pixels))


# ---- shared pieces ---------------------------------------------------------------------------
SKIN, HAIR, TROUSERS = (241, 194, 125), (70, 45, 30), (45, 52, 72)


def figure(pen: Pen, shirt: RGB, dy: float = 0.0, arms_up: bool = False, legs: bool = True) -> None:
    """A simple standing person, centred; `dy` shifts it down (e.g. sinking into a hole)."""
    if legs:
        pen.rect(0.37, 0.70 + dy, 0.48, 0.90 + dy, fill=TROUSERS, radius=0.03)
        pen.rect(0.52, 0.70 + dy, 0.63, 0.90 + dy, fill=TROUSERS, radius=0.03)
    if arms_up:
        pen.line([(0.36, 0.50 + dy), (0.22, 0.30 + dy)], fill=shirt, width=0.08)
        pen.line([(0.64, 0.50 + dy), (0.78, 0.30 + dy)], fill=shirt, width=0.08)
    else:
        pen.line([(0.36, 0.46 + dy), (0.27, 0.68 + dy)], fill=shirt, width=0.08)
        pen.line([(0.64, 0.46 + dy), (0.73, 0.68 + dy)], fill=shirt, width=0.08)
    pen.rect(0.34, 0.40 + dy, 0.66, 0.74 + dy, fill=shirt, radius=0.08)  # torso
    pen.ellipse(0.37, 0.10 + dy, 0.63, 0.38 + dy, fill=SKIN, outline=(150, 110, 70), width=0.015)  # head
    pen.chord(0.36, 0.08 + dy, 0.64, 0.32 + dy, 180, 360, fill=HAIR)  # hair
    pen.ellipse(0.43, 0.24 + dy, 0.47, 0.28 + dy, fill=(30, 30, 30))  # eyes
    pen.ellipse(0.53, 0.24 + dy, 0.57, 0.28 + dy, fill=(30, 30, 30))


# ---- Sokoban -----------------------------------------------------------------------------------
FLOOR, FLOOR_LINE = (222, 214, 196), (200, 190, 170)
MORTAR, BRICK, BRICK_LIGHT = (92, 66, 56), (178, 84, 58), (200, 108, 78)
TARGET_RED = (205, 30, 40)
WOOD, WOOD_DARK, WOOD_LIGHT = (205, 140, 62), (112, 70, 28), (226, 170, 96)
GREEN, GREEN_DARK, GREEN_LIGHT = (76, 175, 80), (27, 94, 32), (139, 210, 120)
PLAYER_BLUE = (40, 96, 210)


def _floor(pen: Pen) -> None:
    pen.rect(0, 0, 1, 1, fill=FLOOR, outline=FLOOR_LINE, width=0.03)


def _brick_wall(pen: Pen) -> None:
    pen.rect(0, 0, 1, 1, fill=MORTAR)
    rows, gap = 4, 0.04
    for row in range(rows):
        y0, y1 = row / rows + gap / 2, (row + 1) / rows - gap / 2
        offset = 0.0 if row % 2 == 0 else -0.25  # staggered courses read as brick, not tiles
        for col in range(3):
            x0, x1 = max(offset + col * 0.5 + gap / 2, 0.0), min(offset + (col + 1) * 0.5 - gap / 2, 1.0)
            if x1 <= x0:
                continue
            pen.rect(x0, y0, x1, y1, fill=BRICK)
            pen.rect(x0, y0, x1, y0 + 0.05, fill=BRICK_LIGHT)


def _target(pen: Pen) -> None:
    pen.rect(0.14, 0.14, 0.86, 0.86, outline=TARGET_RED, width=0.10, radius=0.06)
    pen.ellipse(0.40, 0.40, 0.60, 0.60, fill=TARGET_RED)


def _crate(fill: RGB, dark: RGB, light: RGB) -> Painter:
    def paint(pen: Pen) -> None:
        pen.rect(0.08, 0.08, 0.92, 0.92, fill=fill, outline=dark, width=0.06, radius=0.04)
        pen.rect(0.20, 0.20, 0.80, 0.80, outline=dark, width=0.04)
        pen.line([(0.22, 0.22), (0.78, 0.78)], fill=dark, width=0.07)
        pen.line([(0.22, 0.78), (0.78, 0.22)], fill=light, width=0.05)

    return paint


def _player(pen: Pen) -> None:
    figure(pen, PLAYER_BLUE)


@lru_cache(maxsize=16)
def sokoban_atlas(tile_px: int = DEFAULT_TILE_PX) -> np.ndarray:
    """Sokoban sprites in `SOKOBAN_CODES` order: (7, tile_px, tile_px, 3) uint8, read-only."""
    crate, green_crate = _crate(WOOD, WOOD_DARK, WOOD_LIGHT), _crate(GREEN, GREEN_DARK, GREEN_LIGHT)
    layers = {
        "wall": [_brick_wall],
        "floor": [_floor],
        "target": [_floor, _target],
        "box_on_target": [_floor, green_crate],
        "box": [_floor, crate],
        "player": [_floor, _player],
        "player_on_target": [_floor, _target, _player],
    }
    return build_atlas([layers[name] for name in SOKOBAN_CODES], tile_px)


# ---- FrozenLake --------------------------------------------------------------------------------
ICE, ICE_LINE, ICE_SHINE = (205, 232, 246), (170, 205, 228), (250, 253, 255)
WATER, WATER_DEEP, WATER_RIPPLE, ICE_RIM = (38, 82, 140), (18, 40, 78), (90, 140, 200), (120, 160, 190)
POLE, FLAG_RED, GOLD = (90, 90, 96), (220, 40, 50), (250, 200, 60)
PLAYER_RED, PLAYER_GRAY = (200, 50, 60), (120, 130, 150)


def _ice(pen: Pen) -> None:
    pen.rect(0, 0, 1, 1, fill=ICE, outline=ICE_LINE, width=0.03)
    pen.line([(0.12, 0.30), (0.30, 0.14)], fill=ICE_SHINE, width=0.04)  # glints say "slippery ice"
    pen.line([(0.68, 0.88), (0.88, 0.68)], fill=ICE_SHINE, width=0.04)


def _hole(pen: Pen) -> None:
    pen.ellipse(0.08, 0.22, 0.92, 0.88, fill=WATER, outline=ICE_RIM, width=0.05)
    pen.ellipse(0.22, 0.40, 0.78, 0.76, fill=WATER_DEEP)
    pen.line([(0.30, 0.34), (0.45, 0.32)], fill=WATER_RIPPLE, width=0.03)


def _flag(x: float = 0.0) -> Painter:
    def paint(pen: Pen) -> None:
        pen.ellipse(0.28 + x, 0.80, 0.72 + x, 0.92, fill=(150, 180, 200))  # snow mound
        pen.line([(0.42 + x, 0.86), (0.42 + x, 0.12)], fill=POLE, width=0.05)
        pen.polygon([(0.44 + x, 0.12), (0.82 + x, 0.24), (0.44 + x, 0.38)], fill=FLAG_RED, outline=(120, 20, 20))
        pen.ellipse(0.38 + x, 0.07, 0.47 + x, 0.16, fill=GOLD)

    return paint


def _sinking_player(pen: Pen) -> None:
    figure(pen, PLAYER_GRAY, dy=0.10, arms_up=True, legs=False)
    pen.chord(0.08, 0.50, 0.92, 0.88, 0, 180, fill=WATER)  # water in front hides the legs
    pen.line([(0.20, 0.72), (0.36, 0.74)], fill=WATER_RIPPLE, width=0.03)
    pen.line([(0.64, 0.74), (0.80, 0.72)], fill=WATER_RIPPLE, width=0.03)


def _goal_glow(pen: Pen) -> None:
    pen.rect(0.04, 0.04, 0.96, 0.96, outline=GOLD, width=0.07, radius=0.1)


def _player_with_flag(pen: Pen) -> None:
    _flag(x=0.24)(pen)
    figure(pen, PLAYER_RED, arms_up=True)


@lru_cache(maxsize=16)
def frozenlake_atlas(tile_px: int = DEFAULT_TILE_PX) -> np.ndarray:
    """FrozenLake sprites in `FROZENLAKE_CODES` order: (6, tile_px, tile_px, 3) uint8, read-only."""
    layers = {
        "frozen": [_ice],
        "hole": [_ice, _hole],
        "goal": [_ice, _goal_glow, _flag()],
        "player": [_ice, lambda pen: figure(pen, PLAYER_RED)],
        "player_in_hole": [_ice, _hole, _sinking_player],
        "player_on_goal": [_ice, _goal_glow, _player_with_flag],
    }
    return build_atlas([layers[name] for name in FROZENLAKE_CODES], tile_px)


# ---- text panels (Bandit, Countdown, GIF captions share the font helper) -----------------------
@lru_cache(maxsize=32)
def font(size_px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """PIL's bundled font at `size_px` (needs Pillow >= 10.1 with FreeType; no font files to ship)."""
    return ImageFont.load_default(size=size_px)


def check_image_size(image_size: Sequence[int], minimum: tuple[int, int]) -> tuple[int, int]:
    """Validate a (width, height) pair; the image is drawn at exactly this size."""
    if len(image_size) != 2 or any(int(side) != side for side in image_size):
        raise ValueError(f"image_size must be two integers (width, height), got {image_size!r}.")
    width, height = int(image_size[0]), int(image_size[1])
    if width < minimum[0] or height < minimum[1]:
        raise ValueError(
            f"image_size {width}x{height} is too small to draw legibly; use at least {minimum[0]}x{minimum[1]}."
        )
    return width, height


def draw_centered_text(
    draw: ImageDraw.ImageDraw,
    center: tuple[float, float],
    text: str,
    size_px: int,
    fill: RGB,
    max_width: float | None = None,
) -> None:
    """Draw `text` centred on `center`, shrinking the font until it fits `max_width` pixels."""
    while max_width is not None and size_px > 8 and draw.textlength(text, font=font(size_px)) > max_width:
        size_px -= 1
    draw.text(center, text, fill=fill, font=font(size_px), anchor="mm")


def cells_text(grid: np.ndarray, codes: Sequence[int]) -> str:
    """The (row, col) cells of `grid` holding any of `codes`, as text: "(1, 2), (3, 4)" or "none"."""
    rows, cols = np.nonzero(np.isin(grid, codes))
    return ", ".join(f"({row}, {col})" for row, col in zip(rows.tolist(), cols.tolist(), strict=True)) or "none"
