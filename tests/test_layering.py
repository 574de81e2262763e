"""The import directions of docs/design.md, read from the source with `ast` (lazy imports inside functions included).

scripts → vagen.eval, vagen.bootstrap → vagen.trainer → (rollout, engines, algos, filtering, diagnostics, viz, logging)
→ models, env → registry. `algos` and `filtering` are pure tensor code. Nothing in `vagen` names a game package
(`envs_text`, `envs_visual`): games are found through the `vagen.envs` entry points, and the models built
offline (tiny models, the tiny_vl warm start: vagen.bootstrap) through `vagen.model_sources`. Game packages
import only `vagen.env` (and `envs_visual` may reuse `envs_text`).
"""

from __future__ import annotations

import ast
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GAMES = {"envs_text", "envs_visual"}
EVERYTHING = {
    "registry", "env", "algos", "filtering", "logging", "models", "engines", "rollout", "diagnostics", "viz",
    "trainer", "eval", "bootstrap",
}  # fmt: skip
# What each part of vagen may import (besides itself). Anything else, and any game package, is a violation.
ALLOWED = {
    "registry": set(),
    "env": {"registry"},
    "algos": {"registry"},
    "filtering": {"registry"},
    "logging": {"registry"},
    "models": {"registry"},
    "engines": {"registry", "models", "env"},
    "rollout": {"registry", "engines", "env", "models"},
    "diagnostics": {"registry", "algos", "models", "rollout"},
    "viz": {"registry", "env", "rollout", "logging"},
    "trainer": EVERYTHING - {"trainer", "eval", "bootstrap"},
    "bootstrap": EVERYTHING - {"bootstrap", "eval"},  # supervised warm starts reuse the rollout and trainer forward
    "eval": EVERYTHING - {"eval"},
}


def imported_modules(path: Path) -> set[str]:
    """Absolute module names imported anywhere in the file (top level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def part_of(path: Path) -> str:
    """'trainer' for vagen/trainer/run.py, 'filtering' for vagen/filtering.py."""
    relative = path.relative_to(ROOT / "vagen").parts
    return relative[0] if len(relative) > 1 else Path(relative[0]).stem


def violations() -> list[str]:
    found = []
    for path in sorted((ROOT / "vagen").rglob("*.py")):
        if path.name == "__init__.py" and path.parent == ROOT / "vagen":
            continue
        part = part_of(path)
        allowed = ALLOWED[part]
        for name in sorted(imported_modules(path)):
            top, _, rest = name.partition(".")
            if name == "vagen":
                continue  # the root package holds only __version__
            target = rest.split(".")[0] if top == "vagen" else top
            if top in GAMES and top not in allowed:
                found.append(f"{path.relative_to(ROOT)} imports the game package {name}")
            elif top == "vagen" and target != part and target not in allowed:
                found.append(f"{path.relative_to(ROOT)} ({part}) imports {name} ({target})")
    for package in sorted(GAMES):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in sorted(imported_modules(path)):
                top, _, rest = name.partition(".")
                if top == "vagen" and not (rest == "env" or rest.startswith("env.")):
                    found.append(f"{path.relative_to(ROOT)} imports {name}: games may import only vagen.env")
                if package == "envs_text" and top == "envs_visual":
                    found.append(f"{path.relative_to(ROOT)} imports {name}: envs_text must not need envs_visual")
    return found


def test_every_vagen_part_is_in_the_layering_map():
    parts = {part_of(p) for p in (ROOT / "vagen").rglob("*.py") if p != ROOT / "vagen" / "__init__.py"}
    assert parts == set(ALLOWED), "add the new part of vagen to ALLOWED (with the directions docs/design.md gives)"


def test_imports_flow_the_way_design_md_says():
    assert violations() == []


@pytest.mark.parametrize("module", ["envs_text.sokoban", "envs_text.sokoban_solver", "envs_text.boxoban"])
def test_sokoban_modules_form_no_import_cycle(module):
    """Each Sokoban module imports the shared board (sokoban_level), never back into one that imports it."""
    graph = {}
    for path in (ROOT / "envs_text").glob("*.py"):
        graph[f"envs_text.{path.stem}"] = {n for n in imported_modules(path) if n.startswith("envs_text.")}
    seen, stack = set(), [(module, (module,))]
    while stack:
        current, trail = stack.pop()
        for nxt in graph.get(current, ()):
            assert nxt not in trail, f"import cycle: {' -> '.join((*trail, nxt))}"
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, (*trail, nxt)))


def test_games_are_found_through_the_entry_point_group():
    advertised = {entry.value for entry in entry_points(group="vagen.envs")}
    assert "envs_visual" in advertised
    from vagen.env import registered_envs

    assert {"vagen/Sokoban-v0", "vagen/FrozenLake-v0"} <= set(registered_envs())
