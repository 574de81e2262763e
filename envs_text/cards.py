"""Cards: reach a target number with the values of dealt playing cards (gym_cards' EZPoints / Points24).

Each episode deals `num_cards` cards from a 52-card deck and re-deals until a formula exists; the
brute-force solver over exact `Fraction`s below finds one. Answers are checked by the safe parser
in `envs_text.arithmetic` and scored by Countdown's `score_answer`, so both games judge alike.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from envs_text.arithmetic import ArithmeticParseError, evaluate
from envs_text.countdown import score_answer
from vagen.env.base import ActionResult, LanguageEnv

RANKS = ("A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K")
SUITS = ("♠", "♥", "♦", "♣")
SUIT_LETTERS = {"S": "♠", "H": "♥", "D": "♦", "C": "♣"}  # so options and tests can type "QS" for Q♠
RED_SUITS = frozenset("♥♦")
SUIT_NAMES = {"♠": "spades", "♥": "hearts", "♦": "diamonds", "♣": "clubs"}
RANK_NAMES = {"A": "ace", "J": "jack", "Q": "queen", "K": "king"}
# J, Q, K count 10 in gym_cards' EZPoints and Points24; "rank" is the other common convention.
FACE_VALUES = {"ten": {"J": 10, "Q": 10, "K": 10}, "rank": {"J": 11, "Q": 12, "K": 13}}
MAX_DEALS = 1000  # re-deals before giving up: a solvable target is found in a handful


@dataclass(frozen=True)
class Card:
    """One playing card: `rank` in `RANKS`, `suit` in `SUITS`."""

    rank: str
    suit: str

    @property
    def name(self) -> str:
        return f"{self.rank}{self.suit}"

    @property
    def long_name(self) -> str:
        """'queen of spades': plain ASCII words, for captions drawn with a font that has no suit glyphs."""
        return f"{RANK_NAMES.get(self.rank, self.rank)} of {SUIT_NAMES[self.suit]}"

    @property
    def is_red(self) -> bool:
        return self.suit in RED_SUITS


def card_value(card: Card, face_value: str = "ten") -> int:
    """A = 1, number cards their number, J/Q/K 10 each (`face_value="ten"`) or 11/12/13 (`"rank"`)."""
    if card.rank in ("J", "Q", "K"):
        return FACE_VALUES[face_value][card.rank]
    return 1 if card.rank == "A" else int(card.rank)


def parse_card(name: str) -> Card:
    """'Q♠', 'QS', '10h' or 'a♦' → a `Card`; raises `ValueError` naming the accepted spellings."""
    text = name.strip().upper()
    rank, suit = text[:-1], SUIT_LETTERS.get(text[-1:], text[-1:])
    if rank not in RANKS or suit not in SUITS:
        raise ValueError(
            f"Unknown card {name!r}; write a rank in {RANKS} followed by a suit in {SUITS} or one of S H D C."
        )
    return Card(rank, suit)


def deal(rng: np.random.Generator, num_cards: int) -> list[Card]:
    """`num_cards` distinct cards drawn from a full deck, in the order they were drawn."""
    indices = rng.choice(len(RANKS) * len(SUITS), size=num_cards, replace=False)
    return [Card(RANKS[int(i) % len(RANKS)], SUITS[int(i) // len(RANKS)]) for i in indices]


# A search node: (value, formula, precedence of the formula's last operator: 1 for + -, 2 for * /, 3 for a number).
Node = tuple[Fraction, str, int]
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _join(left: Node, op: str, right: Node) -> Node:
    """`left op right` as a node, with only the parentheses the left-to-right parser needs."""
    level = _PRECEDENCE[op]
    left_text = left[1] if left[2] >= level else f"({left[1]})"
    # a - (b - c) and a / (b / c) keep theirs: - and / are not associative.
    right_bare = right[2] > level or (right[2] == level and op in "+*")
    right_text = right[1] if right_bare else f"({right[1]})"
    return _APPLY[op](left[0], right[0]), f"{left_text} {op} {right_text}", level


def _combinations(a: Node, b: Node) -> list[Node]:
    """Every node one operator makes from two nodes, in either order (no division by zero)."""
    pairs = [(a, "+", b), (a, "*", b), (a, "-", b), (b, "-", a), (a, "/", b), (b, "/", a)]
    return [_join(*pair) for pair in pairs if pair[1] != "/" or pair[2][0] != 0]


def _search(pool: list[Node], target: Fraction) -> str | None:
    """Depth-first: replace any two nodes by one of their combinations until one node is left."""
    if len(pool) == 1:
        return pool[0][1] if pool[0][0] == target else None
    for i in range(len(pool)):
        for j in range(i + 1, len(pool)):
            rest = pool[:i] + pool[i + 1 : j] + pool[j + 1 :]
            for node in _combinations(pool[i], pool[j]):
                found = _search([*rest, node], target)
                if found is not None:
                    return found
    return None


def solve(values: Sequence[int], target: int) -> str | None:
    """One formula that uses every value in `values` exactly once with + - * / and parentheses and equals
    `target` exactly (intermediate fractions and negatives allowed), or None when there is none.

    Exhaustive, so None is a proof; 4 values take at most a few milliseconds.
    """
    if not values:
        return None
    return _search([(Fraction(v), str(v), 3) for v in values], Fraction(target))


def explain_answer(answer: str, values: Sequence[int], target: int) -> str:
    """Why `answer` is right or wrong, in one sentence a model can act on."""
    try:
        value, literals = evaluate(answer)
    except ArithmeticParseError as error:
        return f"not an arithmetic expression ({error})"
    if Counter(literals) != Counter(values):
        used = ", ".join(map(str, literals)) or "nothing"
        return f"it uses {used} but must use each of {', '.join(map(str, values))} exactly once"
    if value == target:
        return f"it equals {target}, correct"
    return f"it equals {value}, not {target}"  # a Fraction prints as 7 or 7/2


class CardsTextEnv(LanguageEnv):
    """Cards (gym_cards' EZPoints / Points24) with text observations.

    ## Description
    `num_cards` (2..4) playing cards are dealt from a 52-card deck; write one formula that uses
    each card's value exactly once and equals `target`. A = 1, 2..10 their number, J/Q/K 10 each
    (`face_value="ten"`, as in gym_cards) or 11/12/13 (`face_value="rank"`). The deal is redrawn
    until a formula exists. Defaults are EZPoints (2 cards, target 12); `num_cards=4, target=24`
    is Points24.

    ## Actions
    The whole answer is one formula: integers, `+ - * /`, parentheses; division is exact
    (fractions allowed in between). No `=` and no card names.

    ## Observations
    The cards with their values, e.g. `Cards: 5♥ (5), Q♠ (10)`, and the target; after an answer
    also its verdict and why it is wrong (the feedback for retries when `max_turns` > 1).

    ## Rewards
    1.0 for a correct formula. A formula that uses exactly the card values but misses the target
    earns 0.1 on the episode's last turn only (so retries cannot farm it), otherwise 0.0; an
    unparsable answer costs `format_penalty`.

    ## Episode end
    Terminated by a correct formula, or by any well-formed formula on the last of `max_turns`
    turns (default 1); truncated when the last turn's response is malformed.
    """

    action_names = None
    example_answer = "(10 - 4) * 2"

    def __init__(self, *, num_cards: int = 2, target: int = 12, face_value: str = "ten", **base_kwargs: Any) -> None:
        if not 2 <= num_cards <= 4:
            raise ValueError(f"num_cards must be 2, 3 or 4 (the solver is exhaustive), got {num_cards}.")
        if face_value not in FACE_VALUES:
            raise ValueError(f"face_value must be one of {sorted(FACE_VALUES)}, got {face_value!r}.")
        if isinstance(target, bool) or not isinstance(target, (int, np.integer)):
            raise ValueError(f"target must be an integer (e.g. 12 or 24), got {target!r}.")
        base_kwargs.setdefault("max_turns", 1)
        super().__init__(**base_kwargs)
        self.num_cards, self.target, self.face_value = num_cards, int(target), face_value
        self.cards: list[Card] = []
        self._solution = ""
        self.last_answer = ""  # the latest well-formed formula (whitespace collapsed), "" before any
        self.last_correct = False

    @property
    def values(self) -> list[int]:
        """The dealt cards' values, in the order the cards are shown."""
        return [card_value(card, self.face_value) for card in self.cards]

    # ---- game hooks ----------------------------------------------------------------------
    def _reset_game(self, options: dict[str, Any] | None) -> None:
        """Deal until solvable; `options={"cards": ["5H", "QS"]}` sets the deal instead (it must be solvable)."""
        self.last_answer, self.last_correct = "", False
        if options and "cards" in options:
            self.cards = [parse_card(name) for name in options["cards"]]
            solution = solve(self.values, self.target)
            if solution is None:
                raise ValueError(f"No formula makes {self.target} from {self.values}; choose another deal.")
            self._solution = solution
            return
        for _ in range(MAX_DEALS):
            self.cards = deal(self.np_random, self.num_cards)
            solution = solve(self.values, self.target)
            if solution is not None:
                self._solution = solution
                return
        raise RuntimeError(
            f"No solvable deal of {self.num_cards} cards for target {self.target} in {MAX_DEALS} deals; "
            "choose a target the card values can reach (e.g. 12 for 2 cards, 24 for 4)."
        )

    def _apply(self, action: str) -> ActionResult:
        try:
            evaluate(action)
        except ArithmeticParseError as error:
            return ActionResult(reward=0.0, effective=False, error=f"not an arithmetic expression ({error})")
        reward, success = score_answer(action, self.values, self.target)
        last_turn = self._turn >= self.max_turns
        # Parsed, so short and only digits and operators: safe to echo in the observation.
        self.last_answer, self.last_correct = " ".join(action.split()), success
        return ActionResult(
            reward=reward if success or last_turn else 0.0,
            effective=True,
            terminated=success or last_turn,
            success=success,
        )

    def _cards_text(self) -> str:
        return ", ".join(f"{card.name} ({value})" for card, value in zip(self.cards, self.values, strict=True))

    def _state_text(self) -> str:
        lines = [f"Cards: {self._cards_text()}", f"Target: {self.target}"]
        if self.last_answer:
            verdict = explain_answer(self.last_answer, self.values, self.target)
            lines.append(f"Your answer {self.last_answer}: {verdict}.")
        return "\n".join(lines)

    def _rules_text(self) -> str:
        faces = FACE_VALUES[self.face_value]
        return (
            f"You are playing Cards. Write one arithmetic formula that uses the value of each dealt card exactly "
            f"once and equals {self.target}. Card values: A = 1, 2 to 10 their number, "
            f"J = {faces['J']}, Q = {faces['Q']}, K = {faces['K']}. Allowed: + - * / and parentheses. "
            "Write only the formula with the values (numbers, not card names), without '=' or the result.\n"
            "Rewards: 1 for a correct formula, 0.1 for a final formula that uses exactly the card values "
            "but misses the target, 0 otherwise."
        )

    def solver_actions(self) -> list[str]:
        """A formula found by the exhaustive solver when the cards were dealt."""
        return [self._solution]

    def demo_reasoning(self) -> str:
        values = ", ".join(map(str, self.values))
        return f"The cards are worth {values}; I need {self.target}: {self._solution} = {self.target}."

    def describe_state(self) -> str:
        """One line for scripted reasoning and GIF captions, e.g. 'Cards: 9 of diamonds (9), queen of
        spades (10); target 12.' (suit words, not symbols: the caption font has no suit glyphs)."""
        cards = ", ".join(f"{card.long_name} ({value})" for card, value in zip(self.cards, self.values, strict=True))
        return f"Cards: {cards}; target {self.target}."
