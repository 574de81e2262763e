"""Environment throughput: resets/s, steps/s with text and with image observations, render time,
and 6×6 Sokoban level generation; gym-sokoban beside it when it is installed.

    python benchmarks/bench_envs.py [seconds=1.0]

    seconds   wall time per measured cell (1.0: about 1 s per cell; seconds=3 gives steadier numbers)

A "step" is one `env.step(response)` with a single action, so rates compare with gym-sokoban's
one-action steps. Single process, wall clock, no warm-up beyond one untimed call.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import types
from collections.abc import Callable

import numpy as np

from envs_text.sokoban import generate_level
from vagen.cli import script_options
from vagen.env import make_env
from vagen.env.policies import format_response

ENVS = [
    ("vagen/Sokoban-v0", {}),
    ("vagen/Sokoban-v0", {"tile_px": 16}),
    ("vagen/FrozenLake-v0", {}),
    ("vagen/Bandit-v0", {}),
    ("vagen/Countdown-v0", {}),
    ("vagen/Navigation-v0", {}),
    ("vagen/Sudoku-v0", {}),
    ("vagen/Sudoku-v0", {"size": 9}),
    ("vagen/Cards-v0", {}),
    ("vagen/Cards-v0", {"num_cards": 4, "target": 24}),
]


def calls_per_second(call: Callable[[], object], seconds: float) -> float:
    """Call repeatedly for about `seconds` of wall time (at least 3 calls) and return calls/s."""
    call()  # untimed: first-use costs (atlas drawing, font loading, imports)
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < seconds:
        call()
        count += 1
    return count / (time.perf_counter() - start)


def one_action_response(env, rng: np.random.Generator) -> str:
    game = env.unwrapped
    action = rng.choice(game.action_names) if game.action_names else game.solver_actions()[0]
    return format_response(game.response_format, [str(action)], game.action_separator, "bench")


def steps_per_second(env, seconds: float) -> float:
    """Time `env.step` alone; resets between episodes and response writing are not counted."""
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    stepped, busy, seed = 0, 0.0, 0
    while stepped < 3 or busy < seconds:
        response = one_action_response(env, rng)
        start = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(response)
        busy += time.perf_counter() - start
        stepped += 1
        if terminated or truncated:
            seed += 1
            env.reset(seed=seed)
    return stepped / busy


def bench_vagen(seconds: float) -> list[tuple[str, float, float, float, float]]:
    rows = []
    for env_id, extra in ENVS:
        text_env = make_env(env_id, observation="text", **extra)
        image_env = make_env(env_id, observation="image", **extra)
        seeds = iter(range(10**9))
        reset_rate = calls_per_second(lambda env=text_env, seeds=seeds: env.reset(seed=next(seeds)), seconds)
        image_env.reset(seed=0)
        render_rate = calls_per_second(image_env.unwrapped._render_image, seconds)
        label = env_id + "".join(f" {key}={value}" for key, value in extra.items())
        rows.append(
            (
                label,
                reset_rate,
                steps_per_second(text_env, seconds),
                steps_per_second(image_env, seconds),
                1000.0 / render_rate,
            )
        )
    return rows


def import_gym_sokoban():
    """gym-sokoban's env module, or None when it is not installed.

    gym-sokoban 0.0.6 calls `pkg_resources.resource_filename` (gone from recent setuptools) only to
    find its own files; a one-function stand-in lets the unmodified package run.
    """
    if importlib.util.find_spec("gym_sokoban") is None:
        return None
    if importlib.util.find_spec("pkg_resources") is None:
        shim = types.ModuleType("pkg_resources")
        shim.resource_filename = lambda module, relative: os.path.join(
            os.path.dirname(sys.modules[module].__file__), relative
        )
        sys.modules["pkg_resources"] = shim
    try:
        from gym_sokoban.envs import room_utils, sokoban_env
    except Exception as error:  # an optional comparison must never stop the benchmark
        print(f"(gym-sokoban is installed but does not import: {error!r}; its rows are skipped)")
        return None
    return sokoban_env, room_utils


def bench_gym_sokoban(modules, seconds: float) -> tuple[str, float, float, float, float]:
    sokoban_env, _ = modules
    np.random.seed(0)  # gym-sokoban draws levels from numpy's global RNG
    env = sokoban_env.SokobanEnv(dim_room=(6, 6), num_boxes=1, max_steps=100)
    reset_rate = calls_per_second(env.reset, seconds)
    render_rate = calls_per_second(lambda: env.render(mode="rgb_array"), seconds)
    stepped, busy = 0, 0.0
    env.reset()
    while stepped < 3 or busy < seconds:
        action = int(np.random.randint(1, 5))  # 1..4 = push up/down/left/right
        start = time.perf_counter()
        _, _, done, _ = env.step(action)  # always renders its 16-px RGB observation
        busy += time.perf_counter() - start
        stepped += 1
        if done:
            env.reset()
    return ("gym-sokoban 6x6 (16 px tiles)", reset_rate, float("nan"), stepped / busy, 1000.0 / render_rate)


def generation_rates(seconds: float, gym_modules) -> list[tuple[str, float, float]]:
    """6×6 levels per second for 1 and 3 boxes: ours, and gym-sokoban's (failed tries count as time)."""
    rows = []
    for boxes in (1, 3):
        rng = np.random.default_rng(0)
        ours = calls_per_second(lambda b=boxes, rng=rng: generate_level(rng, (6, 6), b), seconds)
        theirs = float("nan")
        if gym_modules is not None:
            room_utils = gym_modules[1]
            made, start = 0, time.perf_counter()
            while (made < 3 and time.perf_counter() - start < 10 * seconds) or time.perf_counter() - start < seconds:
                try:
                    room_utils.generate_room(dim=(6, 6), num_steps=int(1.7 * 12), num_boxes=boxes)
                    made += 1
                except (RuntimeError, RuntimeWarning, ValueError):  # it gives up on some rooms; its env retries
                    pass
            theirs = made / (time.perf_counter() - start)
        rows.append((f"6x6, {boxes} box{'es' if boxes > 1 else ''}", ours, theirs))
    return rows


def main() -> None:
    options, _ = script_options(sys.argv[1:], {"seconds": 1.0}, overrides=False)
    gym_modules = import_gym_sokoban()
    rows = bench_vagen(options.seconds)
    if gym_modules is not None:
        rows.append(bench_gym_sokoban(gym_modules, options.seconds))
    else:
        print("(gym-sokoban not installed: `pip install gym-sokoban` adds a comparison row)")
    print(f"{'environment':<36}{'reset/s':>10}{'step/s text':>13}{'step/s image':>14}{'render ms':>11}")
    for label, resets, text_steps, image_steps, render_ms in rows:
        print(f"{label:<36}{resets:>10.0f}{text_steps:>13.0f}{image_steps:>14.0f}{render_ms:>11.3f}")
    print(f"\n{'Sokoban generation (levels/s)':<36}{'vagen':>10}{'gym-sokoban':>13}{'ratio':>8}")
    for label, ours, theirs in generation_rates(options.seconds, gym_modules):
        print(f"{label:<36}{ours:>10.0f}{theirs:>13.1f}{ours / theirs:>7.0f}x")


if __name__ == "__main__":
    main()
