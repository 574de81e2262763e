"""The Qwen2.5-VL processor (tokenizer + image processor) built without torchvision.

transformers' `Qwen2_5_VLProcessor` insists on a video processor, and on CPU machines without
torchvision even the class check of a *missing* one fails (the video-processor registry is a
stub there). Our policies see images only, so `QwenVLProcessor` is the same processor with the
video slot removed. `ProcessorMixin.save_pretrained` expects every slot it knows about, so the
two parts are saved separately (`save_processor`) and `load_processor` rebuilds the processor.

Image sizing (Qwen's `smart_resize`): each side is rounded to a multiple of 28 (patch 14 ×
spatial merge 2), then scaled if the area falls outside [min_pixels, max_pixels]. An image whose
sides are multiples of 28 and whose area is inside the range is not resized at all, and gives
(h/28)·(w/28) image tokens: 168×168 → 36, 112×112 → 16.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from vagen.models.chat_template import IMAGE_PAD

PATCH_SIZE = 14
SPATIAL_MERGE_SIZE = 2
# One image token covers a (patch × merge)² pixel square.
PIXELS_PER_TOKEN_SIDE = PATCH_SIZE * SPATIAL_MERGE_SIZE
# 4 tokens at least (a 56×56 image) and 256 at most (448×448): enough for the games' renders,
# small enough that a tiny model's vision tower stays cheap. State them explicitly everywhere:
# transformers' own default max (12.8 M pixels) would let a large image cost thousands of tokens.
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 448 * 448


class QwenVLProcessor(Qwen2_5_VLProcessor):
    """`Qwen2_5_VLProcessor` for images and text only (no video processor, so no torchvision).

    `ProcessorMixin` derives its sub-processor slots from this `__init__` signature, so leaving
    `video_processor` out of it is what removes the slot (and its failing class check).
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


def make_image_processor(
    min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS
) -> Qwen2VLImageProcessorPil:
    """The PIL (torchvision-free) Qwen2-VL image processor with patch 14, merge 2 and the given pixel range."""
    if not 0 < min_pixels <= max_pixels:
        raise ValueError(f"Need 0 < min_pixels <= max_pixels, got min_pixels={min_pixels}, max_pixels={max_pixels}.")
    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=PATCH_SIZE,
        merge_size=SPATIAL_MERGE_SIZE,
        temporal_patch_size=2,
    )


def make_processor(
    tokenizer: PreTrainedTokenizerBase,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> QwenVLProcessor:
    """A Qwen2.5-VL processor around `tokenizer`; it uses the tokenizer's chat template."""
    if IMAGE_PAD not in tokenizer.get_vocab():
        raise ValueError(
            f"The tokenizer has no {IMAGE_PAD!r} token, so images cannot be placed in the text; use a Qwen2.5-VL "
            "tokenizer (vagen.bootstrap.tiny or vagen.models.qwen_tokenizer)."
        )
    image_processor = make_image_processor(min_pixels, max_pixels)
    return QwenVLProcessor(image_processor, tokenizer, chat_template=tokenizer.chat_template)


def save_processor(processor: QwenVLProcessor, folder: str | Path) -> None:
    """Write the tokenizer (with its chat template) and the image processor config into `folder`."""
    processor.tokenizer.save_pretrained(folder)
    processor.image_processor.save_pretrained(folder)


def load_processor(folder: str | Path) -> QwenVLProcessor:
    """Rebuild the processor that `save_processor` (or a tiny-model build) wrote into `folder`."""
    folder = Path(folder)
    for name in ("tokenizer.json", "preprocessor_config.json"):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{folder / name} is missing: {folder} does not hold a saved processor. Build one with "
                "vagen.bootstrap.tiny.build_tiny_vl() or save it with vagen.models.processor.save_processor()."
            )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(folder)
    return QwenVLProcessor(image_processor, tokenizer, chat_template=tokenizer.chat_template)


def image_token_count(
    height: int, width: int, min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS
) -> int:
    """How many `<|image_pad|>` tokens an image of this size becomes (after Qwen's resizing)."""
    resized_height, resized_width = smart_resize(
        height, width, factor=PIXELS_PER_TOKEN_SIDE, min_pixels=min_pixels, max_pixels=max_pixels
    )
    return (resized_height // PIXELS_PER_TOKEN_SIDE) * (resized_width // PIXELS_PER_TOKEN_SIDE)
