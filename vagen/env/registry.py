"""One registry of environments, backed by Gymnasium's.

Built-in games register themselves when their package is imported (`envs_visual` registers
every `vagen/…-v0` id). `vagen` itself never imports a concrete game: `make_env` imports the
packages named in `ENV_PACKAGES` on first use, so `make_env("vagen/Sokoban-v0")` just works,
and third-party packages can add themselves to that tuple or call `register_env` directly.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium

ENV_PACKAGES: list[str] = ["envs_visual"]
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
    for package in ENV_PACKAGES:
        importlib.import_module(package)


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
