"""Bandit and Countdown: reward laws, one-turn episodes, and a parser that model output cannot escape."""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs_text.arithmetic import MAX_EXPRESSION_CHARS, MAX_NESTING_DEPTH, ArithmeticParseError, evaluate
from envs_text.bandit import BanditTextEnv
from envs_text.countdown import CountdownTextEnv, generate_instance, score_answer


def answer(text: str) -> str:
    return f"<think>thinking</think><answer>{text}</answer>"


# ---- Bandit -------------------------------------------------------------------------------
def test_bandit_reward_law():
    env = BanditTextEnv()
    risky_rewards, safe_rewards = [], []
    for seed in range(2000):
        env.reset(seed=seed)
        risky_rewards.append(env.step(answer("Dragon"))[1])
        env.reset(seed=seed)
        safe_rewards.append(env.step(answer("Phoenix"))[1])
    assert set(risky_rewards) == {0.0, 1.0}
    wins = sum(risky_rewards) / len(risky_rewards)
    assert abs(wins - 0.25) < 0.04  # about 4 standard errors at n=2000
    assert set(safe_rewards) == {0.1}


def test_bandit_custom_payoffs():
    env = BanditTextEnv(low_risk_reward=0.3, high_risk_reward=5.0, high_risk_prob=1.0)
    env.reset(seed=0)
    assert env.step(answer("Dragon"))[1] == 5.0
    env.reset(seed=0)
    assert env.step(answer("Phoenix"))[1] == pytest.approx(0.3)


@pytest.mark.parametrize(("choice", "success"), [("Dragon", True), ("dRaGoN", True), ("phoenix", False)])
def test_bandit_success_is_the_risky_arm_case_insensitively(choice, success):
    env = BanditTextEnv()
    env.reset(seed=3)
    _, _, terminated, truncated, info = env.step(answer(choice))
    assert (terminated, truncated) == (True, False)
    assert info["success"] is success and info["action_is_valid"]


def test_bandit_invalid_answer_still_ends_the_episode():
    env = BanditTextEnv()
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(answer("Unicorn"))
    assert terminated or truncated
    assert reward == pytest.approx(-0.1) and not info["action_is_valid"] and not info["success"]
    with pytest.raises(RuntimeError):
        env.step(answer("Dragon"))
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("no tags at all")
    assert (terminated or truncated) and not info["format_ok"]


def test_bandit_presentation_order_is_drawn_per_seed_and_deterministic():
    env = BanditTextEnv(low_risk_name="Teddy", high_risk_name="Tiger")
    orders = []
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        first, second = env.arm_names_in_order()
        assert obs.text.endswith(f"Arms: {first}, {second}")
        assert obs.text.index(first) < obs.text.index(second)
        orders.append(env.arm_names_in_order())
        env.reset(seed=seed)
        assert env.arm_names_in_order() == orders[-1]
    assert set(orders) == {("Teddy", "Tiger"), ("Tiger", "Teddy")}
    assert env.solver_actions() == ["Tiger"]
    assert env.action_names == ("Teddy", "Tiger")


def test_bandit_rejects_bad_names():
    with pytest.raises(ValueError, match="differ"):
        BanditTextEnv(low_risk_name="Dragon", high_risk_name="dragon")
    with pytest.raises(ValueError, match="separator"):
        BanditTextEnv(low_risk_name="A||B")


# ---- Countdown ----------------------------------------------------------------------------
def test_countdown_instances_are_solved_by_their_solver():
    for num_numbers, seeds in ((3, 100), (4, 200)):
        env = CountdownTextEnv(num_numbers=num_numbers)
        for seed in range(seeds):
            obs, _ = env.reset(seed=seed)
            assert len(env.numbers) == num_numbers and all(1 <= n <= 99 for n in env.numbers)
            assert 1 <= env.target <= 999 and f"Target: {env.target}" in obs.text
            _, reward, terminated, truncated, info = env.step(answer(env.solver_actions()[0]))
            assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True), (seed, env.numbers)


def test_countdown_generator_uses_every_number_once():
    rng = np.random.default_rng(0)
    for _ in range(50):
        numbers, target, expression = generate_instance(rng, 4, 20, 999)
        value, literals = evaluate(expression)
        assert value == target and sorted(literals) == sorted(numbers)


def test_countdown_partial_credit_and_failures():
    numbers, target = [2, 3, 4], 14  # 2 + 3 * 4
    assert score_answer("2 + 3 * 4", numbers, target) == (1.0, True)
    assert score_answer("(4 * 3) + 2", numbers, target) == (1.0, True)
    assert score_answer("(2 + 3) * 4", numbers, target) == (0.1, False)  # right numbers, wrong value
    assert score_answer("2 + 3 * 4 + 0", numbers, target) == (0.0, False)  # an extra number
    assert score_answer("2 * 7", numbers, target) == (0.0, False)  # wrong numbers
    assert score_answer("3 * 4 + 2 = 14", numbers, target) == (0.0, False)  # unparsable
    assert score_answer("12 / (3 - 3) + 2", [12, 3, 3, 2], 14) == (0.0, False)  # division by zero


def test_countdown_episode_is_one_turn_and_deterministic():
    env_a, env_b = CountdownTextEnv(), CountdownTextEnv()
    for seed in range(5):
        obs_a, _ = env_a.reset(seed=seed)
        obs_b, _ = env_b.reset(seed=seed)
        assert obs_a.text == obs_b.text and env_a.solver_actions() == env_b.solver_actions()
    env_a.reset(seed=1)
    wrong = " + ".join(map(str, env_a.numbers))
    _, reward, terminated, _, info = env_a.step(answer(wrong))
    expected = 1.0 if sum(env_a.numbers) == env_a.target else 0.1
    assert (reward, terminated, info["success"]) == (expected, True, expected == 1.0)
    env_a.reset(seed=1)
    _, reward, terminated, truncated, info = env_a.step(answer("__import__('os')"))
    # An unparsable expression is an invalid action: the format penalty, and the one turn is used up.
    assert reward == pytest.approx(env_a.format_penalty) and truncated and not terminated
    assert not info["action_is_valid"] and "arithmetic expression" in info["error"]
    env_a.reset(seed=1)
    _, reward, _, truncated, info = env_a.step("no answer")
    assert truncated and reward == pytest.approx(-0.1) and not info["format_ok"]


def test_countdown_rejects_bad_sizes():
    with pytest.raises(ValueError, match="3 or 4"):
        CountdownTextEnv(num_numbers=5)


# ---- the arithmetic parser ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value", "literals"),
    [
        ("1 + 2 * 3", 7, [1, 2, 3]),
        ("(1 + 2) * 3", 9, [1, 2, 3]),
        ("10 - 4 - 3", 3, [10, 4, 3]),  # left associative
        ("8 / 4 / 2", 1, [8, 4, 2]),
        ("7 / 2", Fraction(7, 2), [7, 2]),
        ("-3 + 5", 2, [3, 5]),
        ("2 * -(3 - 5)", 4, [2, 3, 5]),
        ("--4", 4, [4]),
        ("6 × 7 ÷ 2 − 1", 20, [6, 7, 2, 1]),
        ("  ( ( 42 ) )  ", 42, [42]),
        ("1/3 + 1/3 + 1/3", 1, [1, 3, 1, 3, 1, 3]),  # exact: no floating-point rounding
    ],
)
def test_parser_evaluates_exactly(text, value, literals):
    assert evaluate(text) == (Fraction(value), literals)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("__import__('os')", "unexpected character"),
        ("2 ** 3", "expected a number"),
        ("1.5 + 2", "unexpected character"),
        ("abs(3)", "unexpected character"),
        ("4 / (2 - 2)", "division by zero"),
        ("", "empty"),
        ("   ", "empty"),
        ("(1 + 2", "expected '\\)'"),
        ("1 + 2)", "unexpected"),
        ("1 2", "unexpected"),
        ("3 +", "end of input"),
        ("1" + " + 1" * 60, "limit"),
        ("(" * (MAX_NESTING_DEPTH + 1) + "1" + ")" * (MAX_NESTING_DEPTH + 1), "nesting"),
        ("-" * (MAX_NESTING_DEPTH + 1) + "1", "nesting"),
        ("٣ + 1", "unexpected character"),  # a non-ASCII digit
    ],
)
def test_parser_rejects_with_a_reason(text, message):
    with pytest.raises(ArithmeticParseError, match=message):
        evaluate(text)


def test_parser_rejects_non_strings():
    with pytest.raises(ArithmeticParseError, match="string"):
        evaluate(42)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=MAX_EXPRESSION_CHARS + 20))
def test_parser_never_raises_anything_else_on_random_text(text):
    try:
        value, literals = evaluate(text)
    except ArithmeticParseError:
        return
    assert isinstance(value, Fraction) and all(isinstance(n, int) and n >= 0 for n in literals)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/() ×÷−", max_size=MAX_EXPRESSION_CHARS))
def test_parser_never_raises_anything_else_on_arithmetic_looking_text(text):
    try:
        value, literals = evaluate(text)
    except ArithmeticParseError:
        return
    assert isinstance(value, Fraction) and literals == [int(run) for run in re.findall(r"[0-9]+", text)]


_integers = st.integers(min_value=0, max_value=10**6)
_expressions = st.recursive(
    _integers.map(lambda n: (str(n), Fraction(n))),
    lambda inner: st.tuples(inner, st.sampled_from("+-*"), inner).map(
        lambda t: (
            f"({t[0][0]} {t[1]} {t[2][0]})",
            {"+": t[0][1] + t[2][1], "-": t[0][1] - t[2][1], "*": t[0][1] * t[2][1]}[t[1]],
        )
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(_expressions)
def test_parser_agrees_with_fraction_arithmetic_on_generated_expressions(pair):
    text, expected = pair
    value, _ = evaluate(text)
    assert value == expected
