"""Pictures of runs: episode GIFs (frames of states with the agent's reasoning and actions)."""

from vagen.viz.gif import (
    EpisodeRecord,
    compose_frames,
    episode_gif,
    recorded_episode,
    save_episode_gif,
    text_frame,
)

__all__ = [
    "EpisodeRecord",
    "compose_frames",
    "episode_gif",
    "recorded_episode",
    "save_episode_gif",
    "text_frame",
]
