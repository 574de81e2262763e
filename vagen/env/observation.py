"""What an environment shows the policy: text with one placeholder per attached image."""

from __future__ import annotations

from dataclasses import dataclass, field

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
