"""A safe evaluator for the arithmetic a model writes in Countdown answers.

Grammar (integers only, exact rational arithmetic):

    expression := term (("+" | "-") term)*
    term       := factor (("*" | "/") factor)*
    factor     := "-" factor | "(" expression ")" | INTEGER

`×`, `÷` and the Unicode minus `−` are read as `*`, `/` and `-` because models write them.
Anything else — names, `**`, decimals, empty input, division by zero, inputs longer than
`MAX_EXPRESSION_CHARS`, nesting deeper than `MAX_NESTING_DEPTH` — raises `ArithmeticParseError`.
Model output is never handed to `eval`, `exec` or `ast`: this module only ever builds
`Fraction`s from ASCII digit strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_NESTING_DEPTH = 32

_OPERATOR_ALIASES = {"×": "*", "÷": "/", "−": "-"}
_OPERATORS = frozenset("+-*/()")
_DIGITS = frozenset("0123456789")  # not str.isdigit: it accepts non-ASCII digits that int() would read


class ArithmeticParseError(ValueError):
    """The text is not an expression this parser accepts; the message says why."""


@dataclass(frozen=True)
class _Token:
    kind: str  # "int", one of "+-*/()", or "end"
    text: str
    position: int


def tokenize(expression: str) -> list[_Token]:
    """Split `expression` into integer and operator tokens, ending with an "end" token."""
    if not isinstance(expression, str):
        raise ArithmeticParseError(f"expected a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ArithmeticParseError(
            f"expression is {len(expression)} characters long; the limit is {MAX_EXPRESSION_CHARS}"
        )
    tokens: list[_Token] = []
    index = 0
    while index < len(expression):
        char = _OPERATOR_ALIASES.get(expression[index], expression[index])
        if char.isspace():
            index += 1
        elif char in _DIGITS:
            start = index
            while index < len(expression) and expression[index] in _DIGITS:
                index += 1
            tokens.append(_Token("int", expression[start:index], start))
        elif char in _OPERATORS:
            tokens.append(_Token(char, char, index))
            index += 1
        else:
            raise ArithmeticParseError(f"unexpected character {expression[index]!r} at position {index}")
    tokens.append(_Token("end", "", len(expression)))
    return tokens


class _Parser:
    """Recursive descent over the token list; every method returns an exact `Fraction`."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0
        self.literals: list[int] = []

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek().kind in ("+", "-"):
            operator = self.take().kind
            right = self.term()
            value = value + right if operator == "+" else value - right
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek().kind in ("*", "/"):
            operator_token = self.take()
            right = self.factor()
            if operator_token.kind == "*":
                value *= right
            elif right == 0:
                raise ArithmeticParseError(f"division by zero at position {operator_token.position}")
            else:
                value /= right
        return value

    def factor(self) -> Fraction:
        token = self.take()
        if token.kind == "int":
            self.literals.append(int(token.text))
            return Fraction(int(token.text))
        if token.kind not in ("-", "("):
            found = "end of input" if token.kind == "end" else repr(token.text)
            raise ArithmeticParseError(f"expected a number, '-' or '(' at position {token.position}, found {found}")
        # Unary minus and parentheses are the only ways to recurse, so bounding them bounds the stack.
        self.depth += 1
        if self.depth > MAX_NESTING_DEPTH:
            raise ArithmeticParseError(f"nesting deeper than {MAX_NESTING_DEPTH} levels")
        if token.kind == "-":
            value = -self.factor()
        else:
            value = self.expression()
            closing = self.take()
            if closing.kind != ")":
                raise ArithmeticParseError(
                    f"expected ')' at position {closing.position} to close '(' at {token.position}"
                )
        self.depth -= 1
        return value


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Evaluate an arithmetic expression exactly.

    Returns (its value as a `Fraction`, the integer literals it uses in order of appearance;
    a literal under unary minus is listed without the sign). Raises `ArithmeticParseError`
    for anything that is not a well-formed expression of the grammar in the module docstring.
    """
    parser = _Parser(tokenize(expression))
    if parser.peek().kind == "end":
        raise ArithmeticParseError("empty expression")
    value = parser.expression()
    trailing = parser.peek()
    if trailing.kind != "end":
        raise ArithmeticParseError(f"unexpected {trailing.text!r} at position {trailing.position}")
    return value, parser.literals
