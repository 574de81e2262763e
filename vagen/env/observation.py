"""What an environment shows the policy: text with one placeholder per attached image."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
OBSERVATION_MODES = ("text", "image", "text+image")


@dataclass(frozen=True)
class Observation:
    """One environment message.

    `text` holds exactly one `IMAGE_PLACEHOLDER` per entry of `images`, in order: the rollout
    replaces each placeholder with the model's vision tokens, so a mismatch would silently
    shift every image by one. The check runs at construction so a broken env fails at once.
    """

    text: str
    images: list[Image.Image] = field(default_factory=list)

    def __post_init__(self) -> None:
        count = self.text.count(IMAGE_PLACEHOLDER)
        if count != len(self.images):
            raise ValueError(
                f"Observation text has {count} {IMAGE_PLACEHOLDER!r} placeholder(s) but "
                f"{len(self.images)} image(s) are attached; put exactly one placeholder per image."
            )
        for index, image in enumerate(self.images):
            if not isinstance(image, Image.Image):
                raise TypeError(f"Observation image {index} is {type(image).__name__}, expected a PIL image.")


def check_cell_separator(separator: Any) -> str:
    """The text a grid game writes between the cells of a row (`cell_separator`). "" is the compact grid; " "
    gives each cell its own token, where byte-pair tokenizers merge runs such as "___" or "####" into one token
    and hide which column a symbol is in. Rows end in newlines, so a separator may not hold one."""
    if not isinstance(separator, str) or "\n" in separator:
        raise ValueError(
            f"cell_separator must be a string without a newline (rows end in newlines), got {separator!r}; "
            "use '' for the compact grid or ' ' for one token per cell."
        )
    return separator


def check_list_positions(value: Any) -> bool:
    """`list_positions` of a grid game: whether a line under the grid lists the (row, col) of its objects."""
    if not isinstance(value, bool):
        raise ValueError(f"list_positions must be true or false, got {value!r}.")
    return value


def positions_line(objects: list[tuple[str, tuple[int, int]]]) -> str:
    """The line `list_positions` writes under a grid: every object of `state_objects()` with its (row, col).

    A causal LM with one-dimensional rotary positions cannot cheaply tell a cell's row and column from its offset
    in the token stream (an image patch gets both from its 2-D position ids); here they are digits it reads."""
    return (
        "Positions (row, col; row 0 is the top): " + "; ".join(f"{kind} ({r}, {c})" for kind, (r, c) in objects) + "."
    )
