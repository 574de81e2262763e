"""Episode GIFs, the built-in policies, and scripts/viz.py mode=gif."""

from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image
from test_trainer import repo_module

from envs_text.sokoban import SokobanTextEnv
from vagen.env import RESPONSE_FORMATS, make_env, parse_response
from vagen.env.policies import POLICIES, format_response
from vagen.eval.runner import result_gif_episode
from vagen.rollout.chat import play_chat_episodes, policy_responder
from vagen.viz import EpisodeRecord, compose_frames, episode_gif, recorded_episode, save_episode_gif

ROOT = Path(__file__).resolve().parents[1]


def play_episode(make, policy, seed):
    """One episode of a built-in policy through the evaluator's chat loop, drawn as a GIF episode."""
    (result,) = play_chat_episodes(make, [seed], policy_responder(policy), None)
    return result_gif_episode(result)


@pytest.mark.parametrize("seed", range(5))
def test_solver_policy_solves_sokoban_through_the_public_api(seed):
    make = lambda: make_env("vagen/Sokoban-v0", observation="image", dim_room=(6, 6), num_boxes=1, max_turns=10)
    record = play_episode(make, "solver", seed=seed)
    assert record.success
    assert len(record.frames) == len(record.responses) + 1
    assert record.rewards[-1] >= 10.0  # the solving turn carries the +10 bonus
    assert all(actions for actions in record.actions)
    assert all(frame.size == (168, 168) for frame in record.frames)


def test_episode_gif_has_one_frame_per_state_and_reopens(tmp_path):
    record = play_episode(lambda: make_env("vagen/Sokoban-v0", observation="image"), "solver", seed=0)
    path = save_episode_gif(record, tmp_path / "sub" / "episode.gif", seconds_per_frame=0.5)
    assert path.exists()
    with Image.open(path) as gif:
        assert gif.format == "GIF"
        assert gif.n_frames == len(record.frames) == len(record.rewards) + 1
        assert gif.info["duration"] == 500
        first_size = gif.size
        assert first_size[0] >= 2 * 168 and first_size[1] > 2 * 168  # the scaled frame plus a caption panel


def test_frames_keep_the_state_pixels_and_add_a_caption_panel():
    frames = [Image.new("RGB", (10, 8), (255, 0, 0)), Image.new("RGB", (10, 8), (0, 0, 255))]
    composed = compose_frames(frames, ["first", "second caption " * 30], scale=3, min_width=100, max_lines=4)
    assert composed[0].size == composed[1].size
    width, height = composed[0].size
    assert width == 100 and height > 24
    left = (width - 30) // 2
    top_region = np.asarray(composed[0])[0:24, left : left + 30]
    assert (top_region == [255, 0, 0]).all()  # the state, enlarged 3x by nearest neighbour, unaltered
    with pytest.raises(ValueError, match="caption"):
        compose_frames(frames, ["only one"])


def test_captions_carry_reasoning_actions_and_reward():
    record = EpisodeRecord(
        seed=0,
        frames=[Image.new("RGB", (4, 4))] * 2,
        responses=["r"],
        thinks=["go left " * 80],
        actions=[["Left", "Up"]],
        rewards=[-0.2],
        success=False,
    )
    first, last = record.captions(max_think_chars=60)
    assert first.startswith("Turn 1.") and "Left, Up" in first and "-0.20" in first and len(first) < 140
    assert "not solved" in last and "-0.20" in last


def test_text_only_env_still_gets_a_gif(tmp_path):
    record = play_episode(lambda: SokobanTextEnv(observation="text", max_turns=2), "random", seed=3)
    assert len(record.frames) == 3 and len(record.responses) == 2
    path = episode_gif(record.frames, record.captions(), tmp_path / "text.gif")
    with Image.open(path) as gif:
        assert gif.n_frames == 3


def test_text_boards_draw_every_symbol_of_the_text_games():
    """No board symbol comes out as the font's missing-glyph box (PIL's default font has no `√`)."""
    from envs_text.frozenlake import SYMBOLS as FROZENLAKE
    from envs_text.navigation import SYMBOLS as NAVIGATION
    from envs_text.sokoban_level import SYMBOLS as SOKOBAN
    from vagen.viz.gif import grid_font, text_frame

    missing = grid_font(16).getmask("\ue000")  # a private-use code point: no font draws it
    for symbol in {*SOKOBAN.values(), *FROZENLAKE.values(), *NAVIGATION.values()}:
        mask = grid_font(16).getmask(symbol)
        assert (mask.size, bytes(mask)) != (missing.size, bytes(missing)), symbol
    assert np.asarray(text_frame("√")).min() < 128  # the symbol is drawn in ink


@pytest.mark.parametrize("observation", ["image", "text"])
def test_an_episode_drawn_from_its_record_is_the_episode_played(observation):
    """GIFs of training rollouts and evaluation records are drawn from what was recorded (each turn's observation and
    the state the episode ended in), stepping no env: for image observations, the same frames as playing it live."""
    make = lambda: make_env("vagen/Sokoban-v0", observation=observation, max_turns=3)
    (played,) = play_chat_episodes(make, [5], policy_responder("random"), None)
    assert played.final_observation is not None and len(played.turns) == 3
    states = [(t.observation, t.images) for t in played.turns] + [(played.final_observation, played.final_images)]
    drawn = result_gif_episode(played)
    env = make()  # the same episode stepped again by hand: what the drawing must show
    state, _ = env.reset(seed=5)
    live_states, live_rewards = [state], []
    for response in drawn.responses:
        state, reward, *_ = env.step(response)
        live_states.append(state)
        live_rewards.append(reward)
    assert drawn.rewards == live_rewards and len(drawn.frames) == len(live_states) == 4
    assert drawn.thinks == [parse_response(r).think for r in drawn.responses]
    if observation == "image":
        live_frames = [state.images[0].convert("RGB") for state in live_states]
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(drawn.frames, live_frames, strict=True))
    with pytest.raises(ValueError, match="turns \\+ 1"):
        recorded_episode(5, states[:-1], drawn.responses, drawn.actions, drawn.rewards, False)


@pytest.mark.parametrize("response_format", RESPONSE_FORMATS)
@pytest.mark.parametrize("policy", ["solver", "random"])
def test_policies_write_well_formed_responses(policy, response_format):
    for env_id in ("vagen/Sokoban-v0", "vagen/Countdown-v0"):
        env = make_env(env_id, observation="text", response_format=response_format)
        env.reset(seed=2)
        response = POLICIES.get(policy)(env, np.random.default_rng(0))
        game = env.unwrapped
        parsed = parse_response(
            response,
            response_format=response_format,
            action_separator=game.action_separator,
            max_actions=game.max_actions_per_turn,
        )
        assert parsed.format_ok, (response, parsed.error)
        _, _, _, _, info = env.step(response)
        assert info["format_ok"]
        if policy == "solver" or game.action_names:
            assert info["action_is_valid"], info


def test_format_response_rejects_unknown_formats():
    assert format_response("no_think", ["Up", "Left"], "||", "x") == "<answer>Up || Left</answer>"
    with pytest.raises(ValueError, match="response_format"):
        format_response("poem", ["Up"], "||", "x")


def test_viz_gif_mode_writes_a_solved_episode(tmp_path, capsys):
    script = repo_module("scripts/viz.py")
    out = tmp_path / "demo.gif"
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("viz", overrides=["mode=gif", "env=sokoban_visual", "policy=solver", f"out={out}"])
    script.main(cfg)
    printed = capsys.readouterr().out
    assert out.exists() and str(out) in printed
    assert "success: True" in printed
