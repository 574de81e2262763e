"""Countdown with an image: the target above a row of number tiles."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PIL import Image, ImageDraw

from envs_text.countdown import CountdownTextEnv
from envs_visual.tiles import check_image_fits, check_image_size, draw_centered_text

DEFAULT_IMAGE_SIZE = (320, 192)
_SCALE = 2  # drawn at 2× and box-filtered down: smooth edges, final size exactly image_size
BACKGROUND, INK, TARGET_FILL, TARGET_EDGE = (24, 40, 72), (20, 24, 36), (250, 200, 60), (150, 100, 10)
TILE_FILL, TILE_EDGE, LABEL = (245, 245, 240), (120, 130, 150), (220, 228, 240)


def render_countdown(
    numbers: Sequence[int], target: int, image_size: Sequence[int] = DEFAULT_IMAGE_SIZE
) -> Image.Image:
    """The target in a gold panel on top, the numbers as tiles below, in the text's order.

    Returns an RGB image of exactly `image_size` = (width, height) pixels (default 320×192).
    """
    width, height = check_image_size(image_size, minimum=(128, 80))
    if not numbers:
        raise ValueError("Countdown needs at least one number to draw; call reset() before rendering.")
    canvas = Image.new("RGB", (width * _SCALE, height * _SCALE), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    w, h = width * _SCALE, height * _SCALE
    line = max(1, round(0.012 * h))
    draw_centered_text(draw, (w * 0.5, h * 0.09), "TARGET", round(0.08 * h), LABEL)
    draw.rounded_rectangle(
        [w * 0.30, h * 0.16, w * 0.70, h * 0.46], radius=h * 0.05, fill=TARGET_FILL, outline=TARGET_EDGE, width=2 * line
    )
    draw_centered_text(draw, (w * 0.5, h * 0.31), str(target), round(0.22 * h), INK, max_width=w * 0.36)
    draw_centered_text(draw, (w * 0.5, h * 0.56), "NUMBERS (use each once)", round(0.07 * h), LABEL)
    slot = w / len(numbers)
    side = min(slot * 0.8, h * 0.30)
    for index, number in enumerate(numbers):
        cx, cy = slot * (index + 0.5), h * 0.80
        draw.rounded_rectangle(
            [cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2],
            radius=side * 0.15,
            fill=TILE_FILL,
            outline=TILE_EDGE,
            width=line,
        )
        draw_centered_text(draw, (cx, cy), str(number), round(side * 0.5), INK, max_width=side * 0.85)
    return canvas.reduce(_SCALE)


class CountdownEnv(CountdownTextEnv):
    """`CountdownTextEnv` plus an image of the numbers and the target (see `render_countdown`).

    `image_size` = (width, height) of the observation image, default (320, 192). All other
    keyword arguments are `CountdownTextEnv`'s.
    """

    def __init__(self, *, image_size: Sequence[int] = DEFAULT_IMAGE_SIZE, **kwargs: Any) -> None:
        self.image_size = check_image_size(image_size, minimum=(128, 80))
        self.image_pixels = check_image_fits(
            *self.image_size, f"image_size={list(self.image_size)}", "lower image_size", _SCALE
        )
        super().__init__(**kwargs)

    def _render_image(self) -> Image.Image:
        return render_countdown(self.numbers, self.target, self.image_size)

    def describe_state(self) -> str:
        """One line for scripted reasoning and captions."""
        return f"Numbers {', '.join(map(str, self.numbers))}; target {self.target}."
