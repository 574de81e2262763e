"""Judge-free grades of <observation>/<prediction> against the true state, and the turn rewards built on them."""

from __future__ import annotations

import numpy as np
import pytest

from vagen.bootstrap.demos import demo_response
from vagen.env import make_env
from vagen.env.checker import HOSTILE_RESPONSES
from vagen.env.grading import canonical_description, extract_claims, grade_description
from vagen.env.policies import solver_policy

STATE = [("player", (1, 3)), ("box", (3, 3)), ("box", (2, 1)), ("target", (1, 4)), ("target", (4, 4))]


def game_states(env_id: str, seeds: range) -> list[list]:
    states = []
    for seed in seeds:
        env = make_env(env_id, observation="text")
        env.reset(seed=seed)
        states.append(env.unwrapped.state_objects())
    return states


def test_the_canonical_description_scores_one():
    assert grade_description(canonical_description(STATE), STATE) == 1.0
    for env_id in ("vagen/Sokoban-v0", "vagen/FrozenLake-v0"):
        nearby_only = make_env(env_id).unwrapped.graded_nearby_only
        for objects in game_states(env_id, range(30)):
            assert grade_description(canonical_description(objects, nearby_only), objects, nearby_only) == 1.0


@pytest.mark.parametrize(
    "paraphrase",
    [
        "Targets at (4, 4) and (1, 4). I am at (1, 3). Boxes: (2, 1), (3, 3).",
        "the player stands in row 1, column 3; a box sits at (3,3) and another box at (2,1); targets (1,4) (4,4)",
        "BOX (2, 1)\nBOX (3, 3)\nTARGET (4, 4)\nTARGET (1, 4)\nPLAYER (1, 3)",
        # Purely relative: the player is the frame of reference.
        "a box is down of me, a box is down-left of me; the target is right of me, a target is down-right of me.",
    ],
)
def test_paraphrases_and_reordered_facts_score_one(paraphrase):
    assert grade_description(paraphrase, STATE) == 1.0


def test_contradictions_and_omissions_lower_the_score():
    complete = canonical_description(STATE)
    with_wrong_box = complete + " Another box at (4, 1)."
    without_targets = "player at (1, 3); boxes at (3, 3) and (2, 1)."
    assert 0.5 < grade_description(with_wrong_box, STATE) < 1.0  # precision 5/6
    assert 0.5 < grade_description(without_targets, STATE) < 1.0  # recall 3/5
    assert grade_description("the box is up of me", STATE) == 0.0  # one claim, wrong
    # A negated clause states nothing: it neither earns nor loses.
    assert grade_description(complete + " There is no box at (4, 1).", STATE) == 1.0


@pytest.mark.parametrize("env_id", ["vagen/Sokoban-v0", "vagen/FrozenLake-v0"])
def test_a_description_of_another_state_scores_low(env_id):
    nearby_only = make_env(env_id).unwrapped.graded_nearby_only
    states = game_states(env_id, range(40))
    crossed = [
        grade_description(canonical_description(states[i - 1], nearby_only), states[i], nearby_only)
        for i in range(len(states))
    ]
    assert np.mean(crossed) < 0.35, np.mean(crossed)


def test_far_holes_need_not_be_named_but_wrong_ones_cost():
    lake = [("player", (0, 0)), ("goal", (3, 3)), ("hole", (0, 1)), ("hole", (2, 2))]
    near = "player at (0, 0); goal at (3, 3); hole at (0, 1)."
    assert grade_description(near, lake, nearby_only=("hole",)) == 1.0
    assert grade_description(near + " hole at (2, 2).", lake, nearby_only=("hole",)) == 1.0
    assert grade_description(near + " hole at (1, 1).", lake, nearby_only=("hole",)) < 1.0


@pytest.mark.parametrize(
    "text",
    [
        *HOSTILE_RESPONSES,
        None,
        "(99999999, 3) (3,",
        "row 1 col",
        "box at (1, 2)" * 10_000,
        "\x00 3 \x00 box \x00",
        "box \x007\x00 \x000\x00",
        "player player player , , ; ; (1,3)",
    ],
)
def test_hostile_descriptions_never_raise(text):
    score = grade_description(text, STATE)
    assert 0.0 <= score <= 1.0


def test_claims_are_read_per_clause():
    claims = extract_claims("box at (2, 1), target is up-right of me; player at row 1 col 3", {"box", "target"})
    assert claims.absolute == {("box", (2, 1)), ("player", (1, 3))}
    assert claims.relative == {("target", "up-right")}


@pytest.mark.parametrize("env_id", ["vagen/Sokoban-v0", "vagen/FrozenLake-v0"])
def test_solver_demonstrations_describe_and_predict_exactly(env_id):
    """The solver writes the canonical description now and after its actions: both grade 1, every turn,
    and each grade is paid through the turn reward with its coefficient."""
    rng = np.random.default_rng(0)
    for seed in range(10):
        env = make_env(env_id, response_format="worldmodeling", grounding_coef=0.5, worldmodel_coef=0.25)
        plain = make_env(env_id, response_format="worldmodeling")
        env.reset(seed=seed)
        plain.reset(seed=seed)
        done = False
        while not done:
            response = solver_policy(env, rng)
            _, reward, terminated, truncated, info = env.step(response)
            _, plain_reward, *_ = plain.step(response)
            assert info["grounding_score"] == 1.0 and info["prediction_score"] == 1.0
            assert reward == pytest.approx(plain_reward + 0.75)
            done = terminated or truncated


def test_a_missing_block_grades_zero_and_free_think_is_not_graded():
    env = make_env("vagen/Sokoban-v0", response_format="grounding", grounding_coef=1.0)
    env.reset(seed=0)
    _, _, _, _, info = env.step("<think>no observation here</think><answer>Up</answer>")
    assert info["grounding_score"] == 0.0 and info["prediction_score"] is None and not info["format_ok"]
    free = make_env("vagen/Sokoban-v0")
    _, info = free.reset(seed=0)
    assert info["grounding_score"] is None
    _, _, _, _, info = free.step("<think>x</think><answer>Up</answer>")
    assert info["grounding_score"] is None and info["prediction_score"] is None


@pytest.mark.parametrize("env_id", ["vagen/Sokoban-v0", "vagen/FrozenLake-v0"])
def test_the_reasoning_reward_pays_the_share_of_right_readings_once_per_episode(env_id):
    """reasoning_coef pays at the episode's last turn coef × the share of its turns whose <think> is the
    demonstration's for the state the turn started from: the demonstrations earn all of it, however many turns."""
    for seed in range(5):
        env, plain = make_env(env_id, reasoning_coef=0.25), make_env(env_id)
        _, info = env.reset(seed=seed)
        plain.reset(seed=seed)
        assert info["reasoning_match"] is None
        done = False
        while not done:
            actions = env.unwrapped.solver_actions()[: env.unwrapped.max_actions_per_turn]
            response = demo_response(env, actions)
            _, reward, terminated, truncated, info = env.step(response)
            _, plain_reward, _, _, plain_info = plain.step(response)
            done = terminated or truncated
            assert info["reasoning_match"] is True and plain_info["reasoning_match"] is None
            assert reward == pytest.approx(plain_reward + (0.25 if done else 0.0))


def test_the_reasoning_reward_worked_example():
    """FrozenLake, one move a turn, 4 turns to the goal: right reading; right reading but two moves (an error, so
    it counts as wrong); right reading; wrong reading, which solves. Paid at the end: 1 + 0.3 × 2/4."""
    env = make_env("vagen/FrozenLake-v0", desc=["SFF", "FHF", "FFG"], reasoning_coef=0.3, max_actions_per_turn=1)
    env.reset(seed=0)
    game = env.unwrapped
    steps = []
    for think, answer in [(None, "Right"), (None, "Right || Right"), (None, "Down"), ("wrong", "Down")]:
        response = f"<think>{think or game.demo_reasoning()}</think><answer>{answer}</answer>"
        _, reward, terminated, _, info = env.step(response)
        steps.append((reward, info["reasoning_match"], terminated))
    assert [match for _, match, _ in steps] == [True, False, True, False]
    assert [reward for reward, _, _ in steps[:3]] == [0.0, -0.1, 0.0]  # the extra move is priced as a format error
    assert steps[3][2] and info["success"] and steps[3][0] == pytest.approx(1.0 + 0.3 * 2 / 4)


def test_reading_facts_worked_example():
    """reasoning_credit=facts: five facts, the goal's direction and a hole or none on each side (off the board: none).
    The player at (0, 1) of this lake has a hole below it and the goal down-right."""
    env = make_env("vagen/FrozenLake-v0", desc=["SFF", "FHF", "FFG"], reasoning_coef=0.5, reasoning_credit="facts")
    env.reset(seed=0)
    env.step("<think>x</think><answer>Right</answer>")
    game = env.unwrapped
    assert game.demo_reasoning() == "goal is down-right of me, holes down."
    cases = {
        "goal is down-right of me, holes down.": 5,
        "holes down, and the goal is down-right of me": 5,  # order and other words aside
        "goal is down-right of me, no hole next to me.": 4,  # the hole below missed
        "goal is down of me, holes down left.": 3,  # goal wrong, a hole named where there is none
        "goal is down of me, holes up.": 2,  # the hole off the board is wrong too, the hole below missed
        "goal is down-right of me, holes down. no hole next to me": 1,  # both statements: the hole facts are wrong
        "goal is left of me. goal is down-right of me, holes down.": 4,  # only the first statement counts
        "": 0,
    }
    for think, right in cases.items():
        assert game.reading_facts(think) == pytest.approx(right / 5), think
    assert not game.reasoning_matches("goal is down-right of me, no hole next to me.")
    for text in HOSTILE_RESPONSES:  # model output never raises, and a credit stays a share
        assert 0.0 <= game.reading_facts(text) <= 1.0


def test_the_demonstration_reads_every_fact_right_and_facts_pay_their_share():
    """The demonstrations' readings are worth 1 in every state they visit; a solve whose turns read 1 and 0.8 of the
    facts, with one turn in between that has an error (credit 0), earns coef × (1 + 0 + 0.8) / 3 at its end."""
    for seed in range(20):
        env = make_env("vagen/FrozenLake-v0", reasoning_coef=0.5, reasoning_credit="facts")
        env.reset(seed=seed)
        done = False
        while not done:
            assert env.unwrapped.reading_facts(env.unwrapped.demo_reasoning()) == 1.0
            response = demo_response(env, env.unwrapped.solver_actions()[: env.unwrapped.max_actions_per_turn])
            _, _, terminated, truncated, info = env.step(response)
            assert info["reasoning_match"] == 1.0
            done = terminated or truncated
    env = make_env(
        "vagen/FrozenLake-v0",
        desc=["SFF", "FFF", "FFG"],
        reasoning_coef=0.5,
        reasoning_credit="facts",
        max_actions_per_turn=2,
    )
    env.reset(seed=0)
    game = env.unwrapped
    right = f"<think>{game.demo_reasoning()}</think><answer>Right || Right</answer>"
    _, _, _, _, first = env.step(right)
    _, _, _, _, second = env.step(f"<think>{game.demo_reasoning()}</think><answer>Jump</answer>")
    _, reward, terminated, _, third = env.step(
        "<think>goal is down of me, holes left.</think><answer>Down || Down</answer>"
    )
    assert (first["reasoning_match"], second["reasoning_match"], third["reasoning_match"]) == (1.0, 0.0, 0.8)
    assert terminated and third["success"] and reward == pytest.approx(1.0 + 0.5 * 1.8 / 3)


@pytest.mark.parametrize(
    ("env_id", "kwargs", "fix"),
    [
        ("vagen/Sokoban-v0", {"reasoning_coef": 0.5, "response_format": "no_think"}, "response_format=free_think"),
        ("vagen/Sokoban-v0", {"reasoning_coef": -0.5}, ">= 0"),
        ("vagen/Countdown-v0", {"reasoning_coef": 0.5}, "reasoning_coef=0"),
        ("vagen/Sokoban-v0", {"reasoning_coef": 0.5, "reasoning_credit": "facts"}, "reasoning_credit=exact"),
        ("vagen/FrozenLake-v0", {"reasoning_credit": "most"}, "Unknown reasoning_credit"),
        ("vagen/Sokoban-v0", {"grounding_coef": 0.5}, "response_format=grounding"),
        ("vagen/Sokoban-v0", {"response_format": "grounding", "worldmodel_coef": 0.5}, "response_format=worldmodeling"),
        ("vagen/Sokoban-v0", {"response_format": "grounding", "grounding_coef": -1.0}, ">= 0"),
        ("vagen/Countdown-v0", {"response_format": "grounding", "grounding_coef": 0.5}, "grounding_coef=0"),
    ],
)
def test_reasoning_rewards_that_could_never_pay_are_refused(env_id, kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        make_env(env_id, **kwargs)


def test_relative_descriptions_score_one_and_name_only_near_holes():
    lake = [("player", (1, 1)), ("goal", (3, 3)), ("hole", (1, 2)), ("hole", (3, 0))]
    relative = canonical_description(lake, nearby_only=("hole",), frame="relative")
    assert relative == "goal is down-right of me; hole is right of me."
    assert grade_description(relative, lake, nearby_only=("hole",)) == 1.0
    assert grade_description(canonical_description(STATE, frame="relative"), STATE) == 1.0
