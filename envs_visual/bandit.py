"""The two-armed bandit with an image: two slot machines labelled with the arm names."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from PIL import Image, ImageDraw

from envs_text.bandit import BanditTextEnv
from envs_visual.tiles import check_image_fits, check_image_size, draw_centered_text

DEFAULT_IMAGE_SIZE = (320, 192)
_SCALE = 2  # drawn at 2× and box-filtered down: smooth edges, final size exactly image_size
BACKGROUND, BODY, BODY_DARK = (238, 234, 226), (200, 48, 56), (120, 24, 32)
MARQUEE, REEL, INK, PLATE = (250, 200, 60), (252, 252, 248), (30, 30, 40), (255, 255, 255)


def _slot_machine(draw: ImageDraw.ImageDraw, left: float, width: float, height: float, name: str) -> None:
    """One machine in the column [left, left + width), its name on a plate underneath.

    Both machines are drawn identically: the names are the only thing that differs, as in the text.
    """
    x = lambda u: left + u * width
    y = lambda v: v * height
    line = max(1, round(0.012 * height))
    draw.rounded_rectangle(
        [x(0.18), y(0.06), x(0.78), y(0.18)], radius=y(0.03), fill=MARQUEE, outline=BODY_DARK, width=line
    )
    draw_centered_text(draw, (x(0.48), y(0.12)), "SLOTS", round(0.08 * height), BODY_DARK)
    draw.rounded_rectangle(
        [x(0.14), y(0.18), x(0.82), y(0.70)], radius=y(0.04), fill=BODY, outline=BODY_DARK, width=line
    )
    for reel in range(3):
        x0 = 0.20 + reel * 0.2
        draw.rectangle([x(x0), y(0.27), x(x0 + 0.16), y(0.50)], fill=REEL, outline=BODY_DARK, width=line)
        draw_centered_text(draw, (x(x0 + 0.08), y(0.385)), "?", round(0.12 * height), INK)
    draw.rectangle([x(0.22), y(0.57), x(0.74), y(0.63)], fill=BODY_DARK)  # coin tray
    draw.line([x(0.82), y(0.50), x(0.92), y(0.50), x(0.92), y(0.24)], fill=(90, 90, 96), width=3 * line)  # lever
    draw.ellipse([x(0.88), y(0.16), x(0.96), y(0.16) + (x(0.96) - x(0.88))], fill=MARQUEE, outline=BODY_DARK)
    draw.rounded_rectangle([x(0.06), y(0.76), x(0.94), y(0.94)], radius=y(0.04), fill=PLATE, outline=INK, width=line)
    draw_centered_text(draw, (x(0.5), y(0.85)), name, round(0.11 * height), INK, max_width=x(0.90) - x(0.10))


def render_bandit(arm_names: Sequence[str], image_size: Sequence[int] = DEFAULT_IMAGE_SIZE) -> Image.Image:
    """Two slot machines, left to right in `arm_names` order, each with its name on a plate.

    Returns an RGB image of exactly `image_size` = (width, height) pixels (default 320×192).
    """
    width, height = check_image_size(image_size, minimum=(96, 64))
    # A bandit only ever shows its two orders: draw each once (~2 ms), hand out copies after.
    return _drawn_bandit(tuple(map(str, arm_names)), width, height).copy()


@lru_cache(maxsize=64)
def _drawn_bandit(arm_names: tuple[str, ...], width: int, height: int) -> Image.Image:
    canvas = Image.new("RGB", (width * _SCALE, height * _SCALE), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    column = width * _SCALE / len(arm_names)
    for index, name in enumerate(arm_names):
        _slot_machine(draw, index * column, column, height * _SCALE, name)
    return canvas.reduce(_SCALE)


class BanditEnv(BanditTextEnv):
    """`BanditTextEnv` plus an image of the two arms (see `render_bandit`).

    `image_size` = (width, height) of the observation image, default (320, 192). All other
    keyword arguments are `BanditTextEnv`'s.
    """

    def __init__(self, *, image_size: Sequence[int] = DEFAULT_IMAGE_SIZE, **kwargs: Any) -> None:
        self.image_size = check_image_size(image_size, minimum=(96, 64))
        self.image_pixels = check_image_fits(
            *self.image_size, f"image_size={list(self.image_size)}", "lower image_size", _SCALE
        )
        super().__init__(**kwargs)

    def _render_image(self) -> Image.Image:
        return render_bandit(self.arm_names_in_order(), self.image_size)

    def describe_state(self) -> str:
        """One line for scripted reasoning and captions."""
        left, right = self.arm_names_in_order()
        return f"Two slot machines: {left} on the left, {right} on the right."
