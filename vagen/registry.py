"""One small registry type for every pluggable thing (advantage estimators, losses, filters, engines).

A duplicate name raises; an unknown name raises listing the valid ones. Entries of one registry
share one signature, so callers never special-case an entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
_loaded_groups: dict[str, list[str]] = {}


def load_entry_points(group: str) -> list[str]:
    """Import, once per process, every module advertised in the entry-point `group` of the installed distributions
    (e.g. game packages in `vagen.envs`), so that they register themselves; returns the modules' names.

    How layers above a registry add entries to it without the registry's module importing them.
    """
    if group not in _loaded_groups:
        from importlib.metadata import entry_points

        found = list(entry_points(group=group))
        for entry_point in found:
            entry_point.load()
        _loaded_groups[group] = [entry_point.value for entry_point in found]
    return _loaded_groups[group]


class Registry(Generic[T]):
    """A named table of callables (or classes) of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@ADVANTAGES.register("grpo")`."""

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered; choose another name.")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(f"Unknown {self.kind} {name!r}; valid: {sorted(self._entries)}.")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))
