"""The one response parser: worked examples and property tests with random and hostile strings."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vagen.env.parsing import RESPONSE_FORMATS, format_instructions, match_actions, parse_response

ACTIONS = ("Up", "Down", "Left", "Right")


def test_free_think_well_formed():
    parsed = parse_response("<think>box is left</think><answer>Left || Up</answer>")
    assert parsed.format_ok and parsed.error is None
    assert parsed.think == "box is left"
    assert parsed.actions == ["Left", "Up"]


def test_whitespace_around_and_between_blocks_is_fine():
    parsed = parse_response("\n  <think> a </think>\n\n<answer> Up ||Down|| </answer>  \n")
    assert parsed.format_ok
    assert parsed.actions == ["Up", "Down"]


def test_tags_are_case_insensitive():
    assert parse_response("<THINK>x</THINK><Answer>Up</Answer>").actions == ["Up"]


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("<answer>Up</answer>", "missing <think>"),
        ("<think>x</think>", "missing <answer>"),
        ("<think>x<answer>Up</answer>", "expected one <think>"),
        ("<think>a</think><think>b</think><answer>Up</answer>", "expected one <think>"),
        ("<think><think>x</think></think><answer>Up</answer>", "expected one <think>"),
        ("<think>x</think><answer>Up</answer> trailing", "text after </answer>"),
        ("hello <think>x</think><answer>Up</answer>", "text outside"),
        ("<think>x</think><answer><think>Up</think></answer>", "inside <answer>"),
        ("<think>x</think><answer> || </answer>", "empty <answer>"),
        ("</think>x<think><answer>Up</answer>", "comes before"),
    ],
)
def test_malformed_free_think(response, reason):
    parsed = parse_response(response)
    assert not parsed.format_ok
    assert reason in parsed.error
    assert parsed.actions == []


def test_no_think_format():
    assert parse_response("<answer>Up</answer>", response_format="no_think").actions == ["Up"]
    bad = parse_response("<think>x</think><answer>Up</answer>", response_format="no_think")
    assert not bad.format_ok and "no_think" in bad.error


def test_grounding_and_worldmodeling_need_their_inner_tags():
    grounded = "<think><observation>box left</observation><reasoning>push</reasoning></think><answer>Left</answer>"
    parsed = parse_response(grounded, response_format="grounding")
    assert parsed.format_ok and parsed.observation == "box left"
    assert not parse_response(grounded, response_format="worldmodeling").format_ok
    modelled = grounded.replace("</reasoning>", "</reasoning><prediction>box on target</prediction>")
    parsed = parse_response(modelled, response_format="worldmodeling")
    assert parsed.format_ok and parsed.prediction == "box on target"
    assert not parse_response("<think>x</think><answer>Left</answer>", response_format="grounding").format_ok


def test_max_actions_truncates_and_counts():
    parsed = parse_response("<think>x</think><answer>Up || Up || Left || Down</answer>", max_actions=2)
    assert parsed.format_ok
    assert parsed.actions == ["Up", "Up"]
    assert parsed.dropped_actions == 2


def test_custom_separator():
    parsed = parse_response("<think>x</think><answer>Up, Left</answer>", action_separator=",")
    assert parsed.actions == ["Up", "Left"]


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="response_format"):
        parse_response("x", response_format="json")
    with pytest.raises(ValueError, match="action_separator"):
        parse_response("x", action_separator="")
    with pytest.raises(ValueError, match="max_actions"):
        parse_response("x", max_actions=0)


def test_match_actions_is_case_insensitive_and_stops_at_first_invalid():
    assert match_actions(["up", "LEFT"], ACTIONS) == (["Up", "Left"], [])
    assert match_actions(["up", "jump", "left"], ACTIONS) == (["Up"], ["jump", "left"])
    assert match_actions([], ACTIONS) == ([], [])


@pytest.mark.parametrize("response_format", RESPONSE_FORMATS)
def test_format_instructions_example_parses(response_format):
    """The example the prompt shows the model must itself be well-formed."""
    text = format_instructions(response_format, "Left || Up", 3, "||")
    example = text.split("format: ", 1)[1].split(" You may", 1)[0]
    parsed = parse_response(example, response_format=response_format)
    assert parsed.format_ok, parsed.error
    assert parsed.actions == ["Left", "Up"]


HOSTILE_PIECES = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "<observation>",
        "</prediction>",
        "||",
        "Up",
        "\x00",
        "\u202e",
        "😀",
        "\n",
        " ",
        "<",
        ">",
        "/",
        "<<answer>>",
        "</ANSWER>",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(HOSTILE_PIECES, st.text(max_size=20)), max_size=30).map("".join),
    st.sampled_from(RESPONSE_FORMATS),
    st.integers(min_value=1, max_value=5),
)
def test_parser_never_raises_and_is_consistent(response, response_format, max_actions):
    parsed = parse_response(response, response_format=response_format, max_actions=max_actions)
    if parsed.format_ok:
        assert parsed.error is None
        assert 1 <= len(parsed.actions) <= max_actions
        assert all(action and action == action.strip() for action in parsed.actions)
        assert all("<answer>" not in action.lower() for action in parsed.actions)
    else:
        assert parsed.error
        assert parsed.actions == []


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_parser_accepts_any_think_text_without_tags(think):
    """Any reasoning text that contains no tag of ours is accepted verbatim (stripped)."""
    if "<" in think or ">" in think:
        think = think.replace("<", "").replace(">", "")
    parsed = parse_response(f"<think>{think}</think><answer>Up</answer>")
    assert parsed.format_ok
    assert parsed.think == think.strip()


def test_huge_response_is_handled():
    huge = "<think>" + "x" * 100_000 + "</think><answer>" + " || ".join(["Up"] * 10_000) + "</answer>"
    parsed = parse_response(huge, max_actions=3)
    assert parsed.format_ok and parsed.actions == ["Up", "Up", "Up"] and parsed.dropped_actions == 9_997
    unclosed = "<think>" * 50_000
    assert not parse_response(unclosed).format_ok


def test_non_string_response_is_a_format_error():
    assert not parse_response(None).format_ok  # type: ignore[arg-type]


def test_characters_whose_lowercase_is_longer_do_not_shift_the_answer():
    """'İ'.lower() has two characters; the answer must still be found in the original text."""
    parsed = parse_response("<think>İİİ İstanbul</think><answer>Left || Up</answer>")
    assert parsed.format_ok and parsed.actions == ["Left", "Up"] and parsed.think == "İİİ İstanbul"
