"""The one parser of model responses, shared by every environment.

A response looks like `<think>…</think><answer>Left || Up</answer>`. The parser never raises on
model output: whatever the model wrote, it returns a `ParsedResponse` whose `error` says what was
wrong, so the environment can charge the format penalty and go on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

RESPONSE_FORMATS = ("free_think", "no_think", "grounding", "worldmodeling")
_TAGS = ("think", "answer", "observation", "prediction", "reasoning")
_TAG_RE = re.compile(r"</?({})>".format("|".join(_TAGS)), re.IGNORECASE)


@dataclass(frozen=True)
class ParsedResponse:
    """What the parser read out of one response.

    `format_ok` is True when the response has the structure its format asks for; `error` is a
    short human-readable reason when it does not (or when the answer was empty). `actions` are
    the raw answer pieces split on the separator (at most `max_actions` of them); matching them
    to an environment's action names is `match_actions`'s job.
    """

    format_ok: bool
    think: str = ""
    answer: str = ""
    actions: list[str] = field(default_factory=list)
    observation: str | None = None
    prediction: str | None = None
    dropped_actions: int = 0
    error: str | None = None


def _single_block(text: str, tag: str) -> tuple[str | None, str | None]:
    """Content of the only `<tag>…</tag>` block in `text`, or (None, reason)."""
    opens = len(re.findall(f"<{tag}>", text, re.IGNORECASE))
    closes = len(re.findall(f"</{tag}>", text, re.IGNORECASE))
    if opens == 0 and closes == 0:
        return None, f"missing <{tag}>…</{tag}>"
    if opens != 1 or closes != 1:
        return None, f"expected one <{tag}> block, found {opens} opening and {closes} closing tags"
    match = re.search(f"<{tag}>(.*)</{tag}>", text, re.IGNORECASE | re.DOTALL)
    if match is None:
        return None, f"</{tag}> comes before <{tag}>"
    return match.group(1), None


def parse_response(
    response: str,
    *,
    response_format: str = "free_think",
    action_separator: str = "||",
    max_actions: int = 3,
) -> ParsedResponse:
    """Parse one model response.

    Rules (all formats): the response, stripped of surrounding whitespace, ends with exactly one
    `<answer>…</answer>` block; nothing but whitespace may follow it. `free_think`, `grounding`
    and `worldmodeling` need exactly one `<think>…</think>` block directly before the answer
    (whitespace between is fine) and nothing before it; `no_think` needs the answer alone.
    `grounding` needs an `<observation>…</observation>` inside the think, `worldmodeling` also a
    `<prediction>…</prediction>`. Tags are case-insensitive. An empty answer is a format error.
    Actions beyond `max_actions` are dropped and counted in `dropped_actions`.
    """
    if response_format not in RESPONSE_FORMATS:
        raise ValueError(f"Unknown response_format {response_format!r}; choose one of {RESPONSE_FORMATS}.")
    if not action_separator:
        raise ValueError("action_separator must be a non-empty string, e.g. '||'.")
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}.")
    text = response.strip() if isinstance(response, str) else ""
    answer, error = _single_block(text, "answer")
    if error:
        return ParsedResponse(format_ok=False, error=error)
    # Found in the original text, not in text.lower(): lowering can change the length ("İ" → "i̇").
    answer_start = re.search("<answer>", text, re.IGNORECASE).start()  # the only one (checked above)
    if not re.search(r"</answer>\Z", text, re.IGNORECASE):
        return ParsedResponse(format_ok=False, answer=answer.strip(), error="text after </answer>")
    head = text[:answer_start].strip()

    think, observation, prediction = "", None, None
    if response_format == "no_think":
        if head:
            return ParsedResponse(
                format_ok=False, answer=answer.strip(), error="text before <answer> in no_think format"
            )
    else:
        think, error = _single_block(head, "think")
        if error:
            return ParsedResponse(format_ok=False, answer=answer.strip(), error=error)
        if not (head.lower().startswith("<think>") and head.lower().endswith("</think>")):
            return ParsedResponse(format_ok=False, answer=answer.strip(), error="text outside <think> and <answer>")
        if response_format in ("grounding", "worldmodeling"):
            observation, error = _single_block(think, "observation")
            if error:
                return ParsedResponse(format_ok=False, think=think, answer=answer.strip(), error=error)
        if response_format == "worldmodeling":
            prediction, error = _single_block(think, "prediction")
            if error:
                return ParsedResponse(format_ok=False, think=think, answer=answer.strip(), error=error)

    nested = _TAG_RE.search(answer)
    if nested:
        return ParsedResponse(
            format_ok=False, think=think, answer=answer.strip(), error=f"tag {nested.group(0)} inside <answer>"
        )
    pieces = [piece.strip() for piece in answer.split(action_separator)]
    pieces = [piece for piece in pieces if piece]
    if not pieces:
        return ParsedResponse(format_ok=False, think=think, error="empty <answer>")
    return ParsedResponse(
        format_ok=True,
        think=think.strip(),
        answer=answer.strip(),
        actions=pieces[:max_actions],
        observation=observation.strip() if observation is not None else None,
        prediction=prediction.strip() if prediction is not None else None,
        dropped_actions=max(0, len(pieces) - max_actions),
    )


def match_actions(actions: Sequence[str], action_names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Map raw action strings to canonical names, case-insensitively.

    Returns (the canonical names of the leading valid actions, the raw actions from the first
    invalid one on). Execution stops at the first invalid action so that an agent is never
    credited for moves that come after a mistake it made in the same turn.
    """
    lookup = {name.lower(): name for name in action_names}
    matched: list[str] = []
    for index, action in enumerate(actions):
        canonical = lookup.get(action.strip().lower())
        if canonical is None:
            return matched, list(actions[index:])
        matched.append(canonical)
    return matched, []


_FORMAT_TEMPLATES = {
    "free_think": "<think>your reasoning</think><answer>{example}</answer>",
    "no_think": "<answer>{example}</answer>",
    "grounding": "<think><observation>what you see</observation><reasoning>your reasoning</reasoning></think>"
    "<answer>{example}</answer>",
    "worldmodeling": "<think><observation>what you see</observation><reasoning>your reasoning</reasoning>"
    "<prediction>the state after your actions</prediction></think><answer>{example}</answer>",
}


def format_instructions(response_format: str, example_answer: str, max_actions: int, action_separator: str) -> str:
    """The sentence that tells the model how to write its response, for the system prompt."""
    if response_format not in RESPONSE_FORMATS:
        raise ValueError(f"Unknown response_format {response_format!r}; choose one of {RESPONSE_FORMATS}.")
    template = _FORMAT_TEMPLATES[response_format].format(example=example_answer)
    limit = f" You may give up to {max_actions} actions, separated by '{action_separator}'." if max_actions > 1 else ""
    return f"Respond exactly in this format: {template}{limit}"
