"""Navigation: procedural rooms, blocking, success next to the named object, text, image and oracle agree."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_visual import decode_grid  # the tile decoder of the visual tests

from envs_text.navigation import ACTIONS, FLOOR, PLAYER, WALL, NavigationTextEnv, Room, bfs_parents, object_code
from envs_visual.navigation import NavigationEnv, navigation_atlas
from vagen.env import IMAGE_PLACEHOLDER, make_env
from vagen.env.checker import HOSTILE_RESPONSES, check_env
from vagen.env.policies import POLICIES

ROOT = Path(__file__).resolve().parents[1]
LEGEND = re.compile(r"(\d) = (\w+ \w+) at \((\d+), (\d+)\)")


def answer(*actions: str) -> str:
    return f"<think>plan</think><answer>{' || '.join(actions)}</answer>"


def fixed_room(rows: list[str], names: list[str], target: int = 0) -> Room:
    """A Room from a drawing: '#' wall, 'P' player start, digit i an object named names[i - 1]."""
    walls = np.array([[char == "#" for char in row] for row in rows])
    cells = {char: (r, c) for r, row in enumerate(rows) for c, char in enumerate(row) if char not in "#."}
    objects = tuple((*names[i].split(), cells[str(i + 1)]) for i in range(len(names)))
    return Room(walls, objects, target, cells["P"])


def env_in(rows: list[str], names: list[str], target: int = 0, **kwargs) -> NavigationTextEnv:
    env = NavigationTextEnv(**kwargs)
    env.reset(seed=0)
    env.room = fixed_room(rows, names, target)
    env.player = env.room.start
    return env


CORRIDOR = ["######", "#P.#.#", "#.1..#", "#...2#", "######"]


def parse_state(text: str) -> tuple[list[str], list[tuple[str, str, tuple[int, int]]]]:
    """The grid rows and the legend's (digit, name, cell) triples of a text state."""
    lines = text.rsplit("Current state:", 1)[1].strip().splitlines()
    legend = [(d, name, (int(r), int(c))) for d, name, r, c in LEGEND.findall(lines[-1])]
    return lines[:-1], legend


@pytest.mark.parametrize("mode", ["text", "image", "text+image"])
def test_passes_the_shared_checker(mode):
    check_env("vagen/Navigation-v0", seed=3, cross_process=False, observation=mode)


def test_solver_policy_succeeds_within_the_default_budget():
    env = NavigationTextEnv()
    solver = POLICIES.get("solver")
    for seed in range(200):
        env.reset(seed=seed)
        rewards, done = [], False
        while not done:
            _, reward, terminated, truncated, info = env.step(solver(env, np.random.default_rng(seed)))
            rewards.append(reward)
            done = terminated or truncated
        assert info["success"] and terminated and sum(rewards) == 1.0, f"seed {seed}"
        assert env.solver_actions() == []


def test_same_seed_same_room_and_seeds_vary():
    first, second = NavigationEnv(observation="text+image"), NavigationEnv(observation="text+image")
    rooms = set()
    for seed in range(10):
        obs_a, _ = first.reset(seed=seed)
        obs_b, _ = second.reset(seed=seed)
        assert obs_a.text == obs_b.text and obs_a.images[0].tobytes() == obs_b.images[0].tobytes()
        assert first.room.objects == second.room.objects and first.room.target == second.room.target
        rooms.add((first._state_text(), first.instruction))
    assert len(rooms) == 10


@pytest.mark.parametrize("kwargs", [{}, {"size": 5, "num_objects": 2, "num_walls": 2}, {"size": 9, "num_walls": 12}])
def test_rooms_are_playable(kwargs):
    env = NavigationTextEnv(**kwargs)
    for seed in range(100):
        env.reset(seed=seed)
        room, size = env.room, env.size
        assert room.walls[[0, -1], :].all() and room.walls[:, [0, -1]].all()
        assert room.walls.sum() == 4 * (size - 1) + env.num_walls
        kinds = [(colour, kind) for colour, kind, _ in room.objects]
        assert len(set(kinds)) == len(kinds) == env.num_objects
        reachable = bfs_parents(room.blocked(), room.start)
        for _, _, (row, col) in room.objects:
            assert {(row - 1, col), (row + 1, col), (row, col - 1), (row, col + 1)} & set(reachable)
        assert not env.at_target() and env.solver_actions()


def test_blocked_moves_are_not_effective():
    env = env_in(CORRIDOR, ["green ball", "red key"], target=1, max_turns=10)
    _, reward, _, _, info = env.step(answer("Up", "Left"))  # border walls
    assert env.player == (1, 1) and not info["action_is_effective"] and reward == 0.0
    assert info["actions"] == ["Up", "Left"] and info["error"] is None
    env.step(answer("Right", "Right"))  # the second move hits the interior wall at (1, 3)
    assert env.player == (1, 2)
    env.step(answer("Down"))  # the green ball at (2, 2) blocks
    _, _, _, _, info = env.step(answer("Down"))
    assert env.player == (1, 2) and not info["action_is_effective"]


def test_success_next_to_the_target_only():
    env = env_in(CORRIDOR, ["green ball", "red key"], target=1)
    assert env.instruction == "go to the red key"
    _, reward, terminated, _, info = env.step(answer("Down"))  # next to the green ball: a distractor
    assert env.player == (2, 1) and (reward, terminated, info["success"]) == (0.0, False, False)
    _, reward, terminated, truncated, info = env.step(answer("Down", "Right", "Right"))
    assert env.player == (3, 3) and (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    with pytest.raises(RuntimeError):
        env.step(answer("Up"))


def test_stops_at_the_target_and_max_steps_truncates():
    env = env_in(CORRIDOR, ["green ball", "red key"], target=0)
    _, reward, terminated, _, info = env.step(answer("Right", "Left", "Left"))  # (1, 2) is above the ball
    assert info["actions"] == ["Right"] and reward == 1.0 and terminated
    env = env_in(CORRIDOR, ["green ball", "red key"], target=1, max_steps=2, max_turns=10)
    _, _, terminated, truncated, info = env.step(answer("Up", "Up", "Up"))
    assert (terminated, truncated, info["actions"]) == (False, True, ["Up", "Up"])


def test_solver_is_shortest_and_reasoning_names_the_target():
    env = env_in(CORRIDOR, ["green ball", "red key"], target=1)
    assert env.solver_actions() == ["Down", "Down", "Right", "Right"]
    assert env.demo_reasoning() == "the red key is down-right of me, blocked: up left."
    assert env.key_cells() == [(1, 1), (3, 4)]
    env.step(answer("Down", "Down"))
    assert env.demo_reasoning() == "the red key is right of me, blocked: down left."


def test_hostile_and_invalid_responses_never_raise():
    env = NavigationTextEnv()
    for response in (*HOSTILE_RESPONSES, answer("Up", "Jump", "Down"), answer(*["Up"] * 10), answer("north")):
        env.reset(seed=1)
        _, reward, _, _, info = env.step(response)
        assert info["error"] and reward - env.format_penalty in (pytest.approx(0.0), pytest.approx(1.0))
    env.reset(seed=1)
    _, _, _, _, info = env.step(answer("down", "RIGHT"))  # names match case-insensitively
    assert info["actions"] == ["Down", "Right"] and info["action_is_valid"]


def test_state_objects_match_the_text_state():
    env = NavigationTextEnv(render_mode="ansi")
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        rows, legend = parse_state(obs.text)
        objects = env.state_objects()
        assert objects[0] == ("player", env.player)
        player = [(r, c) for r, row in enumerate(rows) for c, char in enumerate(row) if char == "P"]
        assert player == [env.player]
        assert objects[1:] == [(name, cell) for _, name, cell in legend]
        for digit, _, (row, col) in legend:
            assert rows[row][col] == digit
        assert env.room.name(env.room.target) in obs.text.split("Current state:")[0]
        assert env.render() == obs.text.rsplit("Current state:\n", 1)[1]


@pytest.mark.parametrize(("size", "tile_px"), [(7, 28), (5, 16), (8, 9)])
def test_image_is_exactly_sized_and_shows_the_grid(size, tile_px):
    env = NavigationEnv(observation="image", size=size, tile_px=tile_px, num_walls=1)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=size)
    for _ in range(3):
        image = obs.images[0]
        assert image.mode == "RGB" and image.size == (size * tile_px, size * tile_px)
        assert np.array_equal(decode_grid(image, navigation_atlas(tile_px)), env.grid())
        obs, _, terminated, truncated, _ = env.step(POLICIES.get("random")(env, rng))
        if terminated or truncated:
            break


def test_atlas_sprites_are_distinct_and_codes_consistent():
    atlas = navigation_atlas(16)
    assert len(np.unique(atlas.reshape(len(atlas), -1), axis=0)) == len(atlas)
    assert (FLOOR, WALL, PLAYER) == (0, 1, 2) and object_code("red", "ball") == 3
    assert object_code("purple", "box") == len(atlas) - 1


def test_image_mode_rules_describe_the_picture_and_make_env_finds_it():
    env = make_env("vagen/Navigation-v0", observation="image")
    obs, _ = env.reset(seed=0)
    assert "go to the" in obs.text and "orange shirt" in obs.text and "# wall" not in obs.text
    assert obs.text.count(IMAGE_PLACEHOLDER) == 1 and all(name in obs.text for name in ACTIONS)
    assert "Player at" in env.unwrapped.describe_state()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 3}, "size must be >= 4"),
        ({"num_objects": 0}, "num_objects must be in"),
        ({"num_objects": 10}, "num_objects must be in"),
        ({"size": 4, "num_walls": 2}, "lower them or raise size"),
        ({"max_steps": 0}, "max_steps"),
    ],
)
def test_bad_parameters_raise_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NavigationTextEnv(**kwargs)


@pytest.mark.parametrize("name", ["navigation_text", "navigation_visual"])
def test_configs_build_the_documented_env(name):
    config = OmegaConf.load(ROOT / "configs" / "env" / f"{name}.yaml")
    env = make_env(config.id, **OmegaConf.to_container(config.kwargs))
    obs, _ = env.reset(seed=0)
    assert len(obs.images) == (1 if name.endswith("visual") else 0)
    assert env.unwrapped.max_turns == 5 and env.unwrapped.max_actions_per_turn == 3
