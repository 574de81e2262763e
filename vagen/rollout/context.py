"""Token ids of a multi-turn dialogue, built incrementally with the model's own chat template.

The rollout never re-tokenises what the model wrote: each turn appends (context ids, sampled ids,
closing template ids). Context ids come from rendering the chat template and taking the *delta*
that one new message adds, so the ids match what the template would produce for the whole
dialogue, without depending on how the sampled text would re-tokenise.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from vagen.env.observation import IMAGE_PLACEHOLDER, Observation

DEFAULT_SYSTEM_PROMPT = "You are an agent that plays a game turn by turn. Think briefly, then answer."
_RESPONSE_MARK = "\u2063RESPONSE\u2063"  # an invisible separator no template alters, to find the response slot


class DialogueFormatter:
    """Renders observations into token ids for one tokenizer (and, for VLMs, its image processor).

    `image_pad_token` is the token the chat template emits once per image; it is expanded to the
    number of vision tokens the image processor gives that image (grid_t·grid_h·grid_w / merge²),
    exactly as the model's processor would, so the engine receives ids that already agree with
    the images.
    """

    def __init__(
        self,
        tokenizer: Any,
        image_processor: Any | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        image_pad_token: str = "<|image_pad|>",
    ) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("The tokenizer has no chat_template; set one (e.g. the model's) before rolling out.")
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.system_prompt = system_prompt
        self.image_pad_token = image_pad_token
        self.image_pad_id = tokenizer.convert_tokens_to_ids(image_pad_token) if image_processor is not None else None
        self._close_text = self._assistant_close_text()
        # Every string the tokenizer would read as a control token (ChatML's <|im_end|>, <|image_pad|>, ...).
        self._special_strings = sorted(getattr(tokenizer, "added_tokens_encoder", {}), key=len, reverse=True)

    # ---- rendering helpers -----------------------------------------------------------------
    def _defuse(self, text: str) -> str:
        """Observation text as plain text: a special-token spelling in it (e.g. model text an env echoed) gets a
        zero-width space after its first character, so it can never become a chat-control or image token."""
        for special in self._special_strings:
            if special in text:
                text = text.replace(special, f"{special[0]}\u200b{special[1:]}")
        return text

    def _content(self, observation: Observation) -> str | list[dict[str, str]]:
        if not observation.images:
            return self._defuse(observation.text)
        if self.image_processor is None:
            raise ValueError(
                f"The observation has {len(observation.images)} image(s) but the policy is a text-only model; "
                "use a text observation (observation=text, e.g. env=sokoban_text) or a vision-language model."
            )
        parts: list[dict[str, str]] = []
        for index, piece in enumerate(observation.text.split(IMAGE_PLACEHOLDER)):
            if index:
                parts.append({"type": "image"})
            if piece:
                parts.append({"type": "text", "text": self._defuse(piece)})
        return parts

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _assistant_close_text(self) -> str:
        """What the template writes after an assistant message's content (ChatML: '<|im_end|>\\n')."""
        history = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        rendered = self._render([*history, {"role": "assistant", "content": _RESPONSE_MARK}], False)
        return rendered[rendered.rindex(_RESPONSE_MARK) + len(_RESPONSE_MARK) :]

    def _encode(self, text: str, images: list[Image.Image]) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if self.image_pad_id is None:
            return ids
        pads = [i for i, token in enumerate(ids) if token == self.image_pad_id]
        if len(pads) != len(images):
            raise ValueError(
                f"The chat template emitted {len(pads)} {self.image_pad_token!r} token(s) for {len(images)} image(s); "
                "the template and the observation disagree (check the template's image content handling)."
            )
        expanded: list[int] = []
        previous = 0
        for position, count in zip(pads, self.image_token_counts(images), strict=True):
            expanded.extend(ids[previous:position])
            expanded.extend([self.image_pad_id] * count)
            previous = position + 1
        expanded.extend(ids[previous:])
        return expanded

    def image_token_counts(self, images: list[Image.Image]) -> list[int]:
        """Vision tokens per image after the processor's patching and spatial merge."""
        if not images:
            return []
        merge = getattr(self.image_processor, "merge_size", 2)
        patches = getattr(self.image_processor, "get_number_of_image_patches", None)
        if patches is not None:  # the processor's own count from the image's size, without processing its pixels
            return [patches(image.height, image.width) // (merge * merge) for image in images]
        grids = self.image_processor(images=images, return_tensors="pt")["image_grid_thw"]
        return [int(grid.prod()) // (merge * merge) for grid in grids]

    # ---- the three segments of a turn ------------------------------------------------------
    def first_prompt(self, observation: Observation) -> list[int]:
        """System prompt + the first observation + the assistant generation prompt."""
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self._content(observation)},
        ]
        return self._encode(self._render(messages, True), observation.images)

    def next_prompt(self, observation: Observation) -> list[int]:
        """The ids a new user message adds after a closed assistant message."""
        history = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
        ]
        before = self._render(history, False)
        after = self._render([*history, {"role": "user", "content": self._content(observation)}], True)
        if not after.startswith(before):
            raise ValueError(
                "The chat template is not prefix-stable (adding a message rewrites earlier text); "
                "multi-turn token-in/token-out needs a template like ChatML that only appends."
            )
        return self._encode(after[len(before) :], observation.images)

    def close_ids(self, response_ids: list[int], finish_reason: str) -> list[int]:
        """Template ids that end the assistant message, minus the end token the engine already sampled."""
        close = self.tokenizer(self._close_text, add_special_tokens=False)["input_ids"]
        if finish_reason == "stop" and close and response_ids and response_ids[-1] == close[0]:
            return close[1:]
        return close

    def stop_token_ids(self) -> list[int]:
        """The end-of-message token(s) generation should stop at: the first token of the close text."""
        close = self.tokenizer(self._close_text, add_special_tokens=False)["input_ids"]
        stops = {close[0]} if close else set()
        if self.tokenizer.eos_token_id is not None:
            stops.add(self.tokenizer.eos_token_id)
        return sorted(stops)
