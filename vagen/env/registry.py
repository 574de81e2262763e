"""One registry of environments, backed by Gymnasium's.

Games register themselves when their package is imported (the built-in `envs_visual` registers
every `vagen/…-v0` id). `vagen` itself never names a game package: on first use, `make_env` loads
every package advertised in the `vagen.envs` entry-point group of the installed distributions
(this project's pyproject.toml advertises `envs_visual`), so `make_env("vagen/Sokoban-v0")` just
works and a third-party game package joins by declaring

    [project.entry-points."vagen.envs"]
    my_games = "my_games"        # a module that calls register_env(...) when imported

(or by calling `register_env` itself before `make_env`).
"""

from __future__ import annotations

from typing import Any

import gymnasium

from vagen.registry import load_entry_points

ENTRY_POINT_GROUP = "vagen.envs"
_REGISTERED: dict[str, str] = {}


def register_env(env_id: str, entry_point: str, **default_kwargs: Any) -> None:
    """Register a `LanguageEnv` class under a Gymnasium id such as "vagen/Sokoban-v0"."""
    if env_id in _REGISTERED:
        raise ValueError(
            f"Environment id {env_id!r} is already registered (by {_REGISTERED[env_id]}); pick another id."
        )
    _REGISTERED[env_id] = entry_point
    # Gymnasium's passive checker expects array spaces; our spaces hold strings and Observation
    # objects, and `vagen.env.checker` checks them instead.
    gymnasium.register(id=env_id, entry_point=entry_point, kwargs=default_kwargs, disable_env_checker=True)


def _load_env_packages() -> None:
    """Import every game package of the `vagen.envs` entry-point group, once."""
    if not load_entry_points(ENTRY_POINT_GROUP):
        raise RuntimeError(
            f"No game package is registered in the {ENTRY_POINT_GROUP!r} entry-point group, so no environment "
            "is known. Install the project (python3 dev.py test, or pip install -e .) so that its pyproject.toml "
            "entry points are registered."
        )


def registered_envs() -> list[str]:
    """All registered VAGEN environment ids, sorted."""
    _load_env_packages()
    return sorted(_REGISTERED)


def make_env(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """Create a registered environment; an unknown id raises listing the valid ones."""
    _load_env_packages()
    if env_id not in _REGISTERED:
        raise ValueError(f"Unknown environment {env_id!r}. Registered: {sorted(_REGISTERED)}.")
    return gymnasium.make(env_id, **kwargs)
