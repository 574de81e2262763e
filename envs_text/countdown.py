"""Countdown: combine the given numbers with + - * / to hit a target, in one answer.

Every instance is generated from a random expression tree over the numbers, so it is solvable
by construction; answers are checked by the safe parser in `envs_text.arithmetic`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from envs_text.arithmetic import ArithmeticParseError, evaluate
from vagen.env.base import ActionResult, LanguageEnv

_OPERATORS = ("+", "-", "*", "/")


def _combine(left: tuple[int, str], right: tuple[int, str], rng: np.random.Generator) -> tuple[int, str]:
    """Join two (value, expression) nodes with a random operator whose result is a positive integer."""
    (a, a_text), (b, b_text) = (left, right) if left[0] >= right[0] else (right, left)
    options = ["+", "*"]
    if a > b:
        options.append("-")
    if a % b == 0:
        options.append("/")
    operator = options[int(rng.integers(len(options)))]
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[operator]
    return value, f"({a_text} {operator} {b_text})"


def generate_instance(
    rng: np.random.Generator, num_numbers: int, max_number: int, max_target: int, max_tries: int = 10_000
) -> tuple[list[int], int, str]:
    """Draw (numbers, target, a solution) such that the solution uses each number exactly once,
    every intermediate value is a positive integer and 1 <= target <= max_target."""
    for _ in range(max_tries):
        numbers = [int(n) for n in rng.integers(1, max_number + 1, size=num_numbers)]
        pool = [(n, str(n)) for n in numbers]
        while len(pool) > 1:
            first, second = (int(i) for i in rng.choice(len(pool), size=2, replace=False))
            node = _combine(pool[first], pool[second], rng)
            pool = [item for i, item in enumerate(pool) if i not in (first, second)] + [node]
        target, expression = pool[0]
        if 1 <= target <= max_target:
            return numbers, target, expression[1:-1]  # the outermost parentheses add nothing
    raise RuntimeError(f"No Countdown instance with target <= {max_target} in {max_tries} draws; raise max_target.")


def score_answer(answer: str, numbers: list[int], target: int) -> tuple[float, bool]:
    """(reward, success): 1.0 if `answer` uses each number exactly once and equals `target`,
    0.1 if it uses the right numbers but another value, 0.0 otherwise (including unparsable)."""
    try:
        value, literals = evaluate(answer)
    except ArithmeticParseError:
        return 0.0, False
    if Counter(literals) != Counter(numbers):
        return 0.0, False
    if value == target:
        return 1.0, True
    return 0.1, False


class CountdownTextEnv(LanguageEnv):
    """Countdown with text observations.

    ## Description
    Given `num_numbers` (3 or 4) numbers in 1..`max_number` and a target in 1..`max_target`,
    write one arithmetic expression that uses each number exactly once and equals the target.

    ## Actions
    The whole answer is one expression: integers, `+ - * /`, parentheses, unary minus; division
    is exact (fractions allowed in between). No `=` and no other text.

    ## Observations
    The numbers and the target.

    ## Rewards
    1.0 if correct; 0.1 if the expression uses exactly the given numbers but has another value;
    0.0 otherwise, including anything the parser rejects.

    ## Episode end
    After one turn (`max_turns=1` by default): a well-formed answer terminates it (success when
    correct), a malformed response ends it by truncation.
    """

    action_names = None
    example_answer = "(12 + 3) * 2 - 7"

    def __init__(
        self, *, num_numbers: int = 4, max_number: int = 99, max_target: int = 999, **base_kwargs: Any
    ) -> None:
        if num_numbers not in (3, 4):
            raise ValueError(f"num_numbers must be 3 or 4, got {num_numbers}.")
        if max_number < 2 or max_target < 1:
            raise ValueError(f"Need max_number >= 2 and max_target >= 1, got {max_number} and {max_target}.")
        base_kwargs.setdefault("max_turns", 1)
        super().__init__(**base_kwargs)
        self.num_numbers, self.max_number, self.max_target = num_numbers, max_number, max_target
        self.numbers: list[int] = []
        self.target = 0
        self._solution = ""

    # ---- game hooks ----------------------------------------------------------------------
    def _reset_game(self, options: dict[str, Any] | None) -> None:
        self.numbers, self.target, self._solution = generate_instance(
            self.np_random, self.num_numbers, self.max_number, self.max_target
        )

    def _apply(self, action: str) -> ActionResult:
        try:
            evaluate(action)
        except ArithmeticParseError as error:
            return ActionResult(reward=0.0, effective=False, error=f"not an arithmetic expression ({error})")
        reward, success = score_answer(action, self.numbers, self.target)
        return ActionResult(reward=reward, effective=True, terminated=True, success=success)

    def _state_text(self) -> str:
        return f"Numbers: {', '.join(map(str, self.numbers))}\nTarget: {self.target}"

    def _rules_text(self) -> str:
        return (
            "You are playing Countdown. Write one arithmetic expression that uses each of the given numbers "
            "exactly once and equals the target. Allowed: + - * / and parentheses. Write only the expression, "
            "without '=' or the result.\n"
            "Rewards: 1 for a correct expression, 0.1 if it uses exactly the given numbers but misses the target, "
            "0 otherwise."
        )

    def solver_actions(self) -> list[str]:
        """The expression the instance was generated from."""
        return [self._solution]
