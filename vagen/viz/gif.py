"""Episode GIFs: each state's image with what the agent thought, did and earned underneath.

`recorded_episode` draws an episode that was already played (a training rollout, an evaluation record, a
scripted policy's episode) from its recorded observations, stepping no env; `episode_gif` turns frames plus
captions into an animated GIF. Frames are shown at an explicit integer `scale` (nearest neighbour, so pixels
stay crisp); nothing else resizes.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

PANEL_BACKGROUND, PANEL_INK, STATE_MARKER = (250, 250, 247), (25, 25, 35), "Current state:"
THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)  # the captions' reasoning, whatever the response format


@lru_cache(maxsize=8)
def _font(size_px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size_px)


@lru_cache(maxsize=8)
def grid_font(size_px: int) -> ImageFont.FreeTypeFont:
    """DejaVu Sans Mono, which matplotlib ships: it draws every symbol of the text games' boards (Sokoban's and
    FrozenLake's `√` among them), where PIL's default font draws `√` as its missing-glyph box."""
    import matplotlib  # lazily: only text boards need it

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSansMono.ttf"), size_px)


@dataclass
class EpisodeRecord:
    """One played episode. `frames` has one image per state (the initial state and the state after
    each turn), so len(frames) == len(responses) + 1; the per-turn lists are aligned by turn."""

    seed: int
    frames: list[Image.Image] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    thinks: list[str] = field(default_factory=list)
    actions: list[list[str]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    success: bool = False

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))

    def captions(self, max_think_chars: int = 160) -> list[str]:
        """One caption per frame: the turn played from that state, then a summary under the last."""
        lines = []
        for turn, (think, actions, reward) in enumerate(zip(self.thinks, self.actions, self.rewards, strict=True)):
            thought = textwrap.shorten(" ".join(think.split()), max_think_chars, placeholder=" …") or "(no reasoning)"
            lines.append(
                f"Turn {turn + 1}. Think: {thought}\nActions: {', '.join(actions) or 'none'}  |  reward {reward:+.2f}"
            )
        verdict = "solved" if self.success else "not solved"
        lines.append(f"Final state after {len(self.rewards)} turn(s): {verdict}, return {self.total_reward:+.2f}.")
        return lines


def text_frame(text: str, font_px: int = 16) -> Image.Image:
    """Render state text (e.g. a text-only grid) on a fixed character cell so grid columns align."""
    font = grid_font(font_px)
    rows = text.splitlines() or [""]
    cell_w, cell_h = max(1, round(font.getlength("M"))), round(font_px * 1.3)
    image = Image.new("RGB", (cell_w * max(map(len, rows)) + 2 * cell_w, cell_h * len(rows) + cell_h), "white")
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(rows):
        for col, char in enumerate(line):  # per character: a proportional font would skew the grid
            draw.text((cell_w * (col + 1.5), cell_h * (row + 1)), char, fill=PANEL_INK, font=font, anchor="mm")
    return image


def recorded_frame(text: str, images: Sequence[Image.Image]) -> Image.Image:
    """The picture of a recorded observation: its first image, else its state text drawn as an image."""
    if images:
        return images[0].convert("RGB")
    return text_frame(text.rsplit(STATE_MARKER, 1)[-1].strip())


def recorded_episode(
    seed: int,
    observations: Sequence[tuple[str, Sequence[Image.Image]]],
    responses: Sequence[str],
    actions: Sequence[Sequence[str]],
    rewards: Sequence[float],
    success: bool,
) -> EpisodeRecord:
    """An episode drawn from what was recorded while it was played, with no env stepped again: `observations` are
    (text, images) of each turn's state and then of the state it ended in, one more than `responses`."""
    if len(observations) != len(responses) + 1:
        raise ValueError(f"{len(observations)} recorded states for {len(responses)} turns; a GIF needs turns + 1.")
    return EpisodeRecord(
        seed=seed,
        frames=[recorded_frame(text, images) for text, images in observations],
        responses=list(responses),
        thinks=[match.group(1).strip() if (match := THINK.search(r)) else "" for r in responses],
        actions=[list(a) for a in actions],
        rewards=[float(r) for r in rewards],
        success=success,
    )


def _wrap(text: str, font: ImageFont.FreeTypeFont | ImageFont.ImageFont, width_px: float) -> list[str]:
    """Greedy word wrap by rendered width; explicit newlines start new lines."""
    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        line = ""
        for word in paragraph.split(" "):
            candidate = f"{line} {word}" if line else word
            if line and font.getlength(candidate) > width_px:
                lines.append(line)
                line = word
            else:
                line = candidate
        lines.append(line)
    return lines


def compose_frames(
    frames: Sequence[Image.Image],
    captions: Sequence[str],
    scale: int = 2,
    font_px: int = 14,
    min_width: int = 384,
    max_lines: int = 7,
) -> list[Image.Image]:
    """Stack each frame (enlarged `scale`× by nearest neighbour) over a panel with its caption.

    All outputs share one size: the widest frame (at least `min_width` px) by the tallest frame
    plus the tallest caption (word-wrapped, at most `max_lines` lines, the rest cut with "…").
    """
    if len(frames) != len(captions) or not frames:
        raise ValueError(
            f"Need one caption per frame and at least one frame; got {len(frames)} frame(s) and "
            f"{len(captions)} caption(s)."
        )
    if scale < 1:
        raise ValueError(f"scale is an integer enlargement factor >= 1, got {scale}.")
    font = _font(font_px)
    big = [frame.convert("RGB").resize((frame.width * scale, frame.height * scale), Image.NEAREST) for frame in frames]
    width = max(min_width, *(frame.width for frame in big))
    margin, line_h = font_px // 2, round(font_px * 1.35)
    wrapped = [_wrap(caption, font, width - 2 * margin) for caption in captions]
    wrapped = [
        lines if len(lines) <= max_lines else [*lines[: max_lines - 1], lines[max_lines - 1] + " …"]
        for lines in wrapped
    ]
    frame_h = max(frame.height for frame in big)
    panel_h = line_h * max(len(lines) for lines in wrapped) + 2 * margin
    composed = []
    for frame, lines in zip(big, wrapped, strict=True):
        canvas = Image.new("RGB", (width, frame_h + panel_h), PANEL_BACKGROUND)
        canvas.paste(frame, ((width - frame.width) // 2, (frame_h - frame.height) // 2))
        draw = ImageDraw.Draw(canvas)
        draw.line([(0, frame_h), (width, frame_h)], fill=(200, 200, 195), width=1)
        for index, line in enumerate(lines):
            draw.text((margin, frame_h + margin + index * line_h), line, fill=PANEL_INK, font=font)
        composed.append(canvas)
    return composed


def episode_gif(
    frames: Sequence[Image.Image],
    captions: Sequence[str],
    path: str | Path,
    seconds_per_frame: float = 1.5,
    scale: int = 2,
    font_px: int = 14,
) -> Path:
    """Write an animated, looping GIF with one frame per state and its caption underneath.

    Captions must differ between consecutive frames (e.g. carry the turn number): GIF writers merge
    identical consecutive frames. Returns the path written; parent folders are created.
    """
    if seconds_per_frame <= 0:
        raise ValueError(f"seconds_per_frame must be > 0, got {seconds_per_frame}.")
    images = compose_frames(frames, captions, scale=scale, font_px=font_px)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(path, save_all=True, append_images=images[1:], duration=round(seconds_per_frame * 1000), loop=0)
    return path


def save_episode_gif(record: EpisodeRecord, path: str | Path, **gif_kwargs) -> Path:
    """`episode_gif` of a played episode with its standard captions."""
    return episode_gif(record.frames, record.captions(), path, **gif_kwargs)
