"""Sudoku with an image: the grid as printed in a newspaper, with the player's digits in blue."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from envs_text.sudoku import SudokuTextEnv, cell_name
from envs_visual.tiles import check_image_fits, draw_centered_text

DEFAULT_CELL_PX = 40
MIN_CELL_PX = 16
_SCALE = 4  # drawn at 4× and box-filtered down: smooth digits and lines, final size exact
PAPER, GIVEN_FILL = (255, 255, 255), (232, 235, 241)  # givens on a light grey so "fixed" reads at a glance
GIVEN_INK, PLAYER_INK, LABEL_INK = (20, 24, 36), (25, 95, 215), (105, 113, 130)
THIN_LINE, THICK_LINE = (165, 172, 185), (20, 24, 36)


def check_cell_px(cell_px: int) -> int:
    if not isinstance(cell_px, (int, np.integer)) or isinstance(cell_px, bool) or cell_px < MIN_CELL_PX:
        raise ValueError(f"cell_px must be an integer >= {MIN_CELL_PX} (digits are illegible below), got {cell_px!r}.")
    return int(cell_px)


def _layout(size: int, cell_px: int) -> tuple[int, int]:
    """(label margin, right/bottom pad) in final pixels: the margin holds the R1.. / C1.. labels,
    the pad keeps the outer thick line inside the image."""
    return round(0.7 * cell_px), max(2, math.ceil(cell_px / 24))


def image_side(size: int, cell_px: int = DEFAULT_CELL_PX) -> int:
    """Width = height of the rendered image: label margin + size·cell_px + pad (4×4 at 40 px: 190)."""
    margin, pad = _layout(size, cell_px)
    return margin + size * cell_px + pad


def render_sudoku(digits: np.ndarray, given: np.ndarray, cell_px: int = DEFAULT_CELL_PX) -> Image.Image:
    """The (size, size) grid `digits` (0 = blank) as an RGB image of exactly `image_side(size, cell_px)`
    pixels square: given cells shaded with dark digits, placed digits blue, blanks empty, thin lines
    between cells, thick lines around boxes, rows labelled R1.. on the left and columns C1.. on top."""
    cell_px = check_cell_px(cell_px)
    size = digits.shape[0]
    box = math.isqrt(size)
    if digits.shape != (size, size) or given.shape != digits.shape or box * box != size:
        raise ValueError(
            f"digits and given must be equal (n, n) arrays with n a square, got {digits.shape}, {given.shape}."
        )
    margin, _ = _layout(size, cell_px)
    side, s = image_side(size, cell_px) * _SCALE, _SCALE
    canvas = Image.new("RGB", (side, side), PAPER)
    draw = ImageDraw.Draw(canvas)
    cell, origin = cell_px * s, margin * s
    for (row, col), digit in np.ndenumerate(digits):
        x, y = origin + col * cell, origin + row * cell
        if given[row, col]:
            draw.rectangle([x, y, x + cell, y + cell], fill=GIVEN_FILL)
        if digit:
            ink = GIVEN_INK if given[row, col] else PLAYER_INK
            draw_centered_text(draw, (x + cell / 2, y + cell * 0.53), str(int(digit)), round(cell * 0.62), ink)
    thin, thick = max(s, round(cell / 32)), max(2 * s, round(cell / 14))
    end = origin + size * cell
    for line in range(size + 1):  # thin first so the thick box lines are drawn over them
        if line % box:
            at = origin + line * cell
            draw.line([(at, origin), (at, end)], fill=THIN_LINE, width=thin)
            draw.line([(origin, at), (end, at)], fill=THIN_LINE, width=thin)
    for line in range(0, size + 1, box):
        at = origin + line * cell
        draw.rectangle([at - thick / 2, origin - thick / 2, at + thick / 2, end + thick / 2], fill=THICK_LINE)
        draw.rectangle([origin - thick / 2, at - thick / 2, end + thick / 2, at + thick / 2], fill=THICK_LINE)
    label_px = round(cell * 0.3)
    for index in range(size):
        middle = origin + (index + 0.5) * cell
        draw_centered_text(draw, (middle, origin * 0.48), f"C{index + 1}", label_px, LABEL_INK)
        draw_centered_text(draw, (origin * 0.46, middle), f"R{index + 1}", label_px, LABEL_INK)
    return canvas.reduce(_SCALE)


class SudokuEnv(SudokuTextEnv):
    """`SudokuTextEnv` plus an image of the grid (see `render_sudoku`).

    `cell_px` is the side of one cell in pixels (default 40): the image is `image_side(size, cell_px)`
    pixels square, 190 for 4×4 and 390 for 9×9 at the default. All other keyword arguments are
    `SudokuTextEnv`'s.
    """

    def __init__(self, *, cell_px: int = DEFAULT_CELL_PX, **kwargs: Any) -> None:
        self.cell_px = check_cell_px(cell_px)
        super().__init__(**kwargs)
        side = image_side(self.size, self.cell_px)
        self.image_pixels = check_image_fits(side, side, f"cell_px={self.cell_px}", "lower cell_px", _SCALE)

    def _render_image(self) -> Image.Image:
        return render_sudoku(self.digits, self.given, self.cell_px)

    def describe_state(self) -> str:
        """One line for scripted reasoning and captions: size, blanks left, the first blank."""
        blanks = np.argwhere(self.digits == 0)
        if not len(blanks):
            return f"{self.size}x{self.size} Sudoku, complete."
        first = cell_name(int(blanks[0][0]), int(blanks[0][1]))
        return f"{self.size}x{self.size} Sudoku with {len(blanks)} blank cell(s) left; the first blank is {first}."
