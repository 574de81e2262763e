"""Cards with an image: the target above the dealt playing cards, drawn side by side on a felt table.

Suits are drawn as shapes, not glyphs: PIL's bundled font has no ♠♥♦♣ (it draws a box for them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from PIL import Image, ImageDraw

from envs_text.cards import Card, CardsTextEnv
from envs_visual.tiles import check_image_fits, check_image_size, draw_centered_text, font

DEFAULT_IMAGE_SIZE = (320, 192)
MINIMUM_IMAGE_SIZE = (160, 96)
_SCALE = 4  # drawn at 4× and box-filtered down: smooth suit curves, final size exactly image_size
FELT, FELT_SHADOW, LABEL = (22, 98, 60), (12, 64, 38), (226, 240, 228)
TARGET_FILL, TARGET_EDGE, INK = (250, 200, 60), (150, 100, 10), (20, 24, 36)
CARD_FILL, CARD_EDGE, FACE_FILL = (253, 252, 247), (150, 150, 150), (252, 240, 204)
RED, BLACK = (200, 28, 44), (24, 24, 32)
RIGHT, WRONG = (150, 235, 150), (255, 170, 160)
CARD_ASPECT = 2.5 / 3.5  # width / height of a poker card

Box = tuple[float, float, float, float]


def _tangent_point(apex: tuple[float, float], center: tuple[float, float], radius: float, side: int):
    """Where a line from `apex` touches the circle (`side` ±1 picks which of the two tangents)."""
    dx, dy = center[0] - apex[0], center[1] - apex[1]
    distance = math.hypot(dx, dy)
    angle = math.atan2(dy, dx) + side * math.asin(radius / distance)
    length = math.sqrt(distance**2 - radius**2)
    return apex[0] + length * math.cos(angle), apex[1] + length * math.sin(angle)


def _lobes_and_point(upside_down: bool) -> tuple[list[tuple[float, float]], float, list[tuple[float, float]]]:
    """A heart in unit coordinates (two round lobes and a point); flipped it is a spade's blade.
    Returns (lobe centres, lobe radius, the polygon joining the lobes to the point along their tangents)."""
    radius, top, apex_y = 0.25, 0.30, 0.95
    flip = (lambda y: 0.85 - y) if upside_down else (lambda y: y)  # the spade blade leaves room for a stem
    centers = [(0.27, flip(top)), (0.73, flip(top))]
    apex = (0.5, flip(apex_y))
    sign = 1 if upside_down else -1
    left, right = _tangent_point(apex, centers[0], radius, sign), _tangent_point(apex, centers[1], radius, -sign)
    return centers, radius, [left, apex, right, (0.5, flip(top))]


def draw_suit(draw: ImageDraw.ImageDraw, suit: str, box: Box, fill: tuple[int, int, int]) -> None:
    """Draw the pip of `suit` (one of ♠♥♦♣) filling the square-ish `box` = (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    to_px = lambda x, y: (x0 + x * (x1 - x0), y0 + y * (y1 - y0))  # unit square → box

    def disc(cx: float, cy: float, r: float) -> None:
        (ax, ay), (bx, by) = to_px(cx - r, cy - r), to_px(cx + r, cy + r)
        draw.ellipse([ax, ay, bx, by], fill=fill)

    def polygon(points: Sequence[tuple[float, float]]) -> None:
        draw.polygon([to_px(x, y) for x, y in points], fill=fill)

    stem = [(0.5, 0.55), (0.33, 1.0), (0.67, 1.0)]
    if suit == "♦":
        polygon([(0.5, 0.0), (0.86, 0.5), (0.5, 1.0), (0.14, 0.5)])
    elif suit in ("♥", "♠"):
        centers, radius, join = _lobes_and_point(upside_down=suit == "♠")
        for cx, cy in centers:
            disc(cx, cy, radius)
        polygon(join)
        if suit == "♠":
            polygon(stem)
    elif suit == "♣":
        for cx, cy in ((0.5, 0.25), (0.26, 0.58), (0.74, 0.58)):
            disc(cx, cy, 0.23)
        disc(0.5, 0.5, 0.12)  # fills the gap between the three leaves
        polygon(stem)
    else:
        raise ValueError(f"Unknown suit {suit!r}; expected one of ♠ ♥ ♦ ♣.")


def _bold_text(draw: ImageDraw.ImageDraw, center: tuple[float, float], text: str, size: int, color, max_width: float):
    """Centred text thickened by a stroke in its own colour: the bundled font has no bold face, and
    thin strokes of a rank vanish when a small vision model's image is downscaled."""
    while size > 8 and draw.textlength(text, font=font(size)) > max_width:
        size -= 1
    stroke = max(1, round(size * 0.05))
    draw.text(center, text, fill=color, font=font(size), anchor="mm", stroke_width=stroke, stroke_fill=color)


def _corner_index(card_image: Image.Image, card: Card, color: tuple[int, int, int]) -> None:
    """Rank over a small suit pip in the top-left corner of a card image."""
    draw = ImageDraw.Draw(card_image)
    width, height = card_image.size
    cx = width * 0.16
    _bold_text(draw, (cx, height * 0.115), card.rank, round(height * 0.17), color, max_width=width * 0.27)
    pip = width * 0.11
    draw_suit(draw, card.suit, (cx - pip, height * 0.22, cx + pip, height * 0.22 + 2 * pip), color)


def _card_center(card_image: Image.Image, card: Card, color: tuple[int, int, int]) -> None:
    """A big pip for A and number cards; a framed letter between two pips for J, Q and K."""
    draw = ImageDraw.Draw(card_image)
    width, height = card_image.size
    cx, cy = width / 2, height / 2
    if card.rank not in ("J", "Q", "K"):
        half = width * (0.27 if card.rank == "A" else 0.22)
        draw_suit(draw, card.suit, (cx - half, cy - half, cx + half, cy + half), color)
        return
    frame = [width * 0.32, height * 0.16, width * 0.68, height * 0.84]
    draw.rounded_rectangle(frame, radius=width * 0.05, fill=FACE_FILL, outline=color, width=max(1, round(width * 0.02)))
    _bold_text(draw, (cx, cy), card.rank, round(height * 0.28), color, max_width=width * 0.30)
    pip = width * 0.07
    for py in (height * 0.25, height * 0.75):
        draw_suit(draw, card.suit, (cx - pip, py - pip, cx + pip, py + pip), color)


def draw_card(card: Card, width: int, height: int) -> Image.Image:
    """One card as an RGBA image of `width`×`height` pixels, transparent outside its rounded corners."""
    image = Image.new("RGBA", (width, height), (0, 0, 0, 0))
    outline = max(1, round(width * 0.012))
    ImageDraw.Draw(image).rounded_rectangle(
        [0, 0, width - 1, height - 1], radius=width * 0.08, fill=CARD_FILL, outline=CARD_EDGE, width=outline
    )
    color = RED if card.is_red else BLACK
    _corner_index(image, card, color)
    image = image.rotate(180)  # the same index, upside down in the opposite corner, as on real cards
    _corner_index(image, card, color)
    image = image.rotate(180)
    _card_center(image, card, color)
    return image


def render_cards(
    cards: Sequence[Card],
    target: int,
    image_size: Sequence[int] = DEFAULT_IMAGE_SIZE,
    last_answer: str = "",
    last_correct: bool = False,
) -> Image.Image:
    """The target in a gold panel on top, the cards below in the text's order, and the last answer
    (green if correct, red if not) along the bottom when there is one.

    Returns an RGB image of exactly `image_size` = (width, height) pixels (default 320×192).
    """
    width, height = check_image_size(image_size, minimum=MINIMUM_IMAGE_SIZE)
    if not cards:
        raise ValueError("Cards needs dealt cards to draw; call reset() before rendering.")
    w, h = width * _SCALE, height * _SCALE
    canvas = Image.new("RGB", (w, h), FELT)
    draw = ImageDraw.Draw(canvas)
    panel = [w * 0.30, h * 0.04, w * 0.70, h * 0.22]
    draw.rounded_rectangle(panel, radius=h * 0.05, fill=TARGET_FILL, outline=TARGET_EDGE, width=round(h * 0.012))
    draw_centered_text(draw, (w * 0.5, h * 0.13), f"TARGET {target}", round(0.12 * h), INK, max_width=w * 0.36)
    top, bottom = h * 0.28, h * 0.86  # the strip below stays free for the answer: cards never jump between frames
    card_h = bottom - top
    gap = card_h * CARD_ASPECT * 0.14
    card_w = min(card_h * CARD_ASPECT, (w * 0.96 - gap * (len(cards) - 1)) / len(cards))
    card_h = min(card_h, card_w / CARD_ASPECT)
    left = (w - len(cards) * card_w - (len(cards) - 1) * gap) / 2
    shadow = card_w * 0.035  # a drop shadow lifts the white cards off the felt
    for index, card in enumerate(cards):
        x, y = round(left + index * (card_w + gap)), round(top + (bottom - top - card_h) / 2)
        sprite = draw_card(card, round(card_w), round(card_h))
        draw.rounded_rectangle(
            [x + shadow, y + shadow, x + card_w + shadow, y + card_h + shadow], radius=card_w * 0.08, fill=FELT_SHADOW
        )
        canvas.paste(sprite, (x, y), sprite)
    if last_answer:
        verdict = "correct" if last_correct else "wrong"
        draw_centered_text(
            draw, (w * 0.5, h * 0.93), f"Answer: {last_answer}  ({verdict})", round(0.08 * h),
            RIGHT if last_correct else WRONG, max_width=w * 0.94,
        )  # fmt: skip
    return canvas.reduce(_SCALE)


class CardsEnv(CardsTextEnv):
    """`CardsTextEnv` plus an image of the dealt cards and the target (see `render_cards`).

    `image_size` = (width, height) of the observation image, default (320, 192), at least 160×96.
    All other keyword arguments are `CardsTextEnv`'s.
    """

    def __init__(self, *, image_size: Sequence[int] = DEFAULT_IMAGE_SIZE, **kwargs: Any) -> None:
        self.image_size = check_image_size(image_size, minimum=MINIMUM_IMAGE_SIZE)
        self.image_pixels = check_image_fits(
            *self.image_size, f"image_size={list(self.image_size)}", "lower image_size", _SCALE
        )
        super().__init__(**kwargs)

    def _render_image(self) -> Image.Image:
        return render_cards(self.cards, self.target, self.image_size, self.last_answer, self.last_correct)
