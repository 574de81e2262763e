"""Pictures of runs: episode GIFs (frames of states with the agent's reasoning and actions)."""

from vagen.viz.gif import (
    EpisodeRecord,
    compose_frames,
    episode_gif,
    play_episode,
    recorded_episode,
    save_episode_gif,
    text_frame,
)

__all__ = [
    "EpisodeRecord",
    "compose_frames",
    "episode_gif",
    "play_episode",
    "recorded_episode",
    "save_episode_gif",
    "text_frame",
]
