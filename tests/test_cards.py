"""Cards (EZPoints / Points24): every deal is solvable, answers are judged exactly, the image is exact."""

import numpy as np
import pytest

from envs_text.arithmetic import evaluate
from envs_text.cards import Card, CardsTextEnv, card_value, parse_card, solve
from envs_visual.cards import CardsEnv, render_cards
from vagen.env import make_env
from vagen.env.checker import check_env
from vagen.env.policies import solver_policy

CONFIGS = [
    {},  # EZPoints: 2 cards, target 12
    {"num_cards": 4, "target": 24},  # Points24
    {"num_cards": 3, "target": 24, "face_value": "rank"},
]


def answer(text: str) -> str:
    return f"<think>t</think><answer>{text}</answer>"


@pytest.mark.parametrize("mode", ["text", "image", "text+image"])
def test_passes_the_env_checker(mode):
    check_env("vagen/Cards-v0", seed=3, cross_process=False, observation=mode)
    check_env("vagen/Cards-v0", seed=5, cross_process=False, observation=mode, num_cards=4, target=24, max_turns=3)


@pytest.mark.parametrize("kwargs", CONFIGS, ids=["ezpoints", "points24", "rank_faces"])
def test_every_deal_is_solvable_and_the_solver_succeeds(kwargs):
    env = CardsTextEnv(**kwargs)
    for seed in range(200):
        env.reset(seed=seed)
        (formula,) = env.solver_actions()
        value, literals = evaluate(formula)
        assert value == env.target and sorted(literals) == sorted(env.values), (seed, formula)
        _, reward, terminated, truncated, info = env.step(answer(formula))
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True), (seed, formula)


def test_solver_is_exact_and_exhaustive():
    assert evaluate(solve([3, 3, 8, 8], 24))[0] == 24  # needs a fraction: 8 / (3 - 8 / 3)
    assert evaluate(solve([1, 5, 5, 5], 24))[0] == 24  # (5 - 1 / 5) * 5
    assert solve([1, 1, 1, 1], 24) is None
    assert solve([2, 3], 12) is None  # 2*3, 2+3, 3-2, 3/2, ... never 12
    assert solve([], 12) is None
    rng = np.random.default_rng(0)
    for values, target in zip(rng.integers(1, 14, (60, 4)).tolist(), rng.integers(1, 50, 60).tolist(), strict=True):
        formula = solve(values, target)
        if formula is not None:  # any formula found is right: exact value, each number once
            value, literals = evaluate(formula)
            assert value == target and sorted(literals) == sorted(values), (values, target, formula)


def test_card_values_and_names():
    values = {rank: card_value(Card(rank, "♠")) for rank in ("A", "2", "9", "10", "J", "Q", "K")}
    assert values == {"A": 1, "2": 2, "9": 9, "10": 10, "J": 10, "Q": 10, "K": 10}
    assert [card_value(Card(rank, "♥"), "rank") for rank in ("J", "Q", "K")] == [11, 12, 13]
    assert parse_card("QS") == parse_card("q♠") == Card("Q", "♠") and parse_card("10h").name == "10♥"
    with pytest.raises(ValueError, match="suit"):
        parse_card("11X")


def test_observation_names_cards_values_and_target():
    env = CardsTextEnv()
    obs, _ = env.reset(seed=0, options={"cards": ["2H", "QS"]})
    assert "Cards: 2♥ (2), Q♠ (10)\nTarget: 12" in obs.text
    assert "J = 10, Q = 10, K = 10" in obs.text
    assert "J = 11, Q = 12, K = 13" in CardsTextEnv(face_value="rank").reset(seed=0)[0].text
    assert env.demo_reasoning().startswith("The cards are worth 2, 10; I need 12:")
    assert env.describe_state() == "Cards: 2 of hearts (2), queen of spades (10); target 12."
    with pytest.raises(ValueError, match="another deal"):
        env.reset(seed=0, options={"cards": ["5H", "QS"]})  # 5 and 10 cannot make 12


def test_same_seed_same_deal_and_seeds_differ():
    a, b = CardsTextEnv(num_cards=4, target=24), CardsTextEnv(num_cards=4, target=24)
    deals = set()
    for seed in range(20):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert a.cards == b.cards and obs_a.text == obs_b.text and a.solver_actions() == b.solver_actions()
        assert len(set(a.cards)) == 4  # dealt from one deck: no card twice
        deals.add(tuple(a.cards))
    assert len(deals) == 20


@pytest.mark.parametrize(
    ("text", "expected_reward"),
    [
        ("10 - 2", 0.1),  # the right cards, the wrong value
        ("10 * 2 - 8", 0.0),  # an extra number
        ("10 + 2 / 2", 0.0),  # a card used twice
        ("12", 0.0),  # no cards at all
        ("10 / (2 - 2)", None),  # division by zero: unparsable, the format penalty
        ("__import__('os').system('ls')", None),
        ("2 ** 10", None),
        ("1e3", None),
        ("Q + 2", None),
        ("9" * 500, None),
    ],
)
def test_wrong_and_hostile_answers_never_raise_nor_succeed(text, expected_reward):
    env = CardsTextEnv()
    env.reset(seed=0, options={"cards": ["2H", "QS"]})  # 2 + 10 is the answer
    _, reward, terminated, truncated, info = env.step(answer(text))
    assert not info["success"] and (terminated or truncated)
    if expected_reward is None:
        assert reward == pytest.approx(env.format_penalty) and not info["action_is_valid"] and info["error"]
    else:
        assert reward == pytest.approx(expected_reward) and terminated and info["error"] is None


def test_retries_get_feedback_and_partial_credit_only_at_the_end():
    env = CardsTextEnv(num_cards=4, target=24, max_turns=3)
    env.reset(seed=0, options={"cards": ["3H", "3S", "8D", "8C"]})
    obs, reward, terminated, truncated, _ = env.step(answer("3 + 3 + 8 + 8"))
    assert (reward, terminated, truncated) == (0.0, False, False)  # 0.1 only for the final answer
    assert "Your answer 3 + 3 + 8 + 8: it equals 22, not 24." in obs.text
    obs, reward, *_ = env.step(answer("3 * 8 + 3"))
    assert reward == 0.0 and "must use each of 3, 3, 8, 8 exactly once" in obs.text
    _, reward, terminated, _, info = env.step(answer("8 / (3 - 8 / 3)"))
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_bad_options_raise_with_the_fix():
    with pytest.raises(ValueError, match="2, 3 or 4"):
        CardsTextEnv(num_cards=5)
    with pytest.raises(ValueError, match="face_value"):
        CardsTextEnv(face_value="eleven")
    with pytest.raises(ValueError, match="target"):
        CardsTextEnv(target=12.5)
    with pytest.raises(RuntimeError, match="choose a target"):
        CardsTextEnv(target=10_000).reset(seed=0)
    with pytest.raises(ValueError, match="too small"):
        CardsEnv(image_size=(64, 64))


@pytest.mark.parametrize(("num_cards", "size"), [(2, (320, 192)), (4, (320, 192)), (3, (200, 120)), (4, (640, 360))])
def test_image_is_exactly_sized_and_shows_red_and_black(num_cards, size):
    env = CardsEnv(observation="text+image", num_cards=num_cards, target=24 if num_cards > 2 else 12, image_size=size)
    obs, _ = env.reset(seed=1)
    image = obs.images[0]
    assert image.size == size and image.mode == "RGB"
    pixels = np.asarray(image).astype(int)
    red = ((pixels[..., 0] > 150) & (pixels[..., 1] < 80) & (pixels[..., 2] < 90)).any()
    black = (pixels.max(axis=-1) < 60).any()
    assert red == any(card.is_red for card in env.cards) and black == any(not c.is_red for c in env.cards)
    assert np.array_equal(np.asarray(env.reset(seed=1)[0].images[0]), np.asarray(image))  # deterministic


def test_image_differs_by_card_and_shows_the_last_answer():
    cards = [parse_card("5H"), parse_card("QS")]
    base = np.asarray(render_cards(cards, 12))
    assert not np.array_equal(base, np.asarray(render_cards([parse_card("5D"), parse_card("QS")], 12)))
    assert not np.array_equal(base, np.asarray(render_cards([parse_card("6H"), parse_card("QS")], 12)))
    assert not np.array_equal(base, np.asarray(render_cards(cards, 12, last_answer="5 + 10")))
    with pytest.raises(ValueError, match="reset"):
        render_cards([], 12)


def test_solver_policy_plays_the_visual_env():
    env = make_env("vagen/Cards-v0", observation="image", num_cards=4, target=24)
    rng = np.random.default_rng(0)
    for seed in range(5):
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step(solver_policy(env, rng))
        assert info["success"] and reward == 1.0 and terminated
