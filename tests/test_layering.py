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
# The map: every import edge between parts of vagen that exists, and no other (an edge that is added, or one that is
# no longer used, fails `test_the_map_lists_exactly_the_edges_that_exist`). Lazy imports inside functions count.
EDGES = {
    "registry": set(),
    "env": {"registry"},
    "algos": {"registry"},
    "filtering": {"registry"},
    "logging": set(),
    "cli": set(),
    "models": {"registry"},
    "engines": {"registry", "models", "env"},
    "rollout": {"engines", "env"},
    "diagnostics": {"registry", "models", "rollout"},  # scoring runs the model (diagnostics/scoring.py)
    "viz": {"registry"},
    "forward": {"algos", "models", "rollout"},  # teacher-forced log-probs of a TokenBatch: the update's and SFT's
    "trainer": {
        "algos",
        "bootstrap",  # algorithm.sft_coef trains on the warm starts' solver demonstrations, with their SFT loss
        "diagnostics",
        "engines",
        "env",
        "filtering",
        "forward",
        "logging",
        "models",
        "rollout",
        "viz",
    },
    "bootstrap": {"algos", "engines", "env", "forward", "models", "rollout"},
    "eval": {"diagnostics", "engines", "env", "models", "rollout", "trainer", "viz"},
}
# Edges that no import statement shows: a part that loads plugins through an entry-point group reaches whatever
# registers there. `vagen.env.make_env` finds the games (`vagen.envs`), and `vagen.models.registry` the model sources
# built offline (`vagen.model_sources`: the tiny models and warm starts of vagen.bootstrap, whose stale-recipe rebuild
# trains with vagen.forward, never with vagen.trainer: `test_loading_a_model_never_reaches_the_trainer`).
ENTRY_POINT_EDGES = {("env", "vagen.envs"): {"envs_visual"}, ("models", "vagen.model_sources"): {"bootstrap"}}


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


def vagen_files() -> list[Path]:
    return [p for p in sorted((ROOT / "vagen").rglob("*.py")) if p != ROOT / "vagen" / "__init__.py"]


def part_edges() -> dict[str, set[str]]:
    """part -> the other parts of vagen it imports (the root package `vagen` holds only __version__)."""
    edges = {part_of(path): set() for path in vagen_files()}
    for path in vagen_files():
        for name in imported_modules(path):
            top, _, rest = name.partition(".")
            if top == "vagen" and rest and rest.split(".")[0] != part_of(path):
                edges[part_of(path)].add(rest.split(".")[0])
    return edges


def violations() -> list[str]:
    found = []
    for path in vagen_files():
        for name in sorted(imported_modules(path)):
            if name.partition(".")[0] in GAMES:
                found.append(f"{path.relative_to(ROOT)} imports the game package {name}")
    for package in sorted(GAMES):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in sorted(imported_modules(path)):
                top, _, rest = name.partition(".")
                if top == "vagen" and not (rest == "env" or rest.startswith("env.")):
                    found.append(f"{path.relative_to(ROOT)} imports {name}: games may import only vagen.env")
                if package == "envs_text" and top == "envs_visual":
                    found.append(f"{path.relative_to(ROOT)} imports {name}: envs_text must not need envs_visual")
    return found


def test_the_map_lists_exactly_the_edges_that_exist():
    assert part_edges() == EDGES, "update EDGES (and docs/design.md) to the imports as they are"


def test_the_parts_form_no_import_cycle():
    """Ordered so that every part comes after what it imports (the layers of docs/design.md), so no circle."""
    order, edges = [], {part: set(targets) for part, targets in EDGES.items()}
    while edges:
        ready = sorted(part for part, targets in edges.items() if targets <= set(order))
        assert ready, f"import cycle among {sorted(edges)}"
        order += ready
        edges = {part: targets for part, targets in edges.items() if part not in ready}


def test_loading_a_model_never_reaches_the_trainer():
    """Loading a model can build a warm start (the `vagen.model_sources` entry point: models -> bootstrap), so what
    bootstrap reaches, entry points included, must not hold the trainer: the run-time circle trainer -> models ->
    bootstrap -> trainer (SFT borrowing the trainer's forward) is gone."""
    edges = {part: set(targets) for part, targets in EDGES.items()}
    for (part, _), targets in ENTRY_POINT_EDGES.items():
        edges[part] |= targets & set(EDGES)
    reached, frontier = set(), {"bootstrap"}
    while frontier:
        reached |= frontier
        frontier = set().union(*(edges[part] for part in frontier)) - reached
    assert "models" in reached and "trainer" not in reached and "eval" not in reached


def test_no_two_modules_of_vagen_import_each_other():
    """Module level, lazy imports included (models/lora.py and models/registry.py did)."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in vagen_files()}
    imports = {module: {n for n in imported_modules(path) if n in modules} for module, path in modules.items()}
    pairs = sorted((a, b) for a, targets in imports.items() for b in targets if a < b and a in imports.get(b, ()))
    assert pairs == []


def test_entry_point_edges_are_the_registered_ones():
    """Each part named in ENTRY_POINT_EDGES loads that group, and exactly those packages register in it."""
    for (part, group), targets in ENTRY_POINT_EDGES.items():
        assert any(group in path.read_text() for path in vagen_files() if part_of(path) == part), (part, group)
        assert {entry.value.removeprefix("vagen.").split(".")[0] for entry in entry_points(group=group)} == targets


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
