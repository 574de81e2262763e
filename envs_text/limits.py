"""Size bounds from the memory this machine has. A game refuses, in its constructor, a size whose allocations could not
fit, before anything allocates: unbounded, `tile_px=100000` drew a 600000-pixel-wide image until the OOM killer ended
the process at ~21 GB. The estimates are generous per unit (cell, pixel), so a refused size is far past any useful one.
"""

from __future__ import annotations

from pathlib import Path

GIB = 1024**3
MEMORY_SHARE = 0.5  # of the available memory one env may plan for: the model and the other envs need the rest
BYTES_PER_CELL = 4096  # a grid cell: the map, its text, transition tables, solver searches (FrozenLake: ~1 KB)


def _cgroup_room() -> int | None:
    """Bytes this process's cgroup (v2) may still allocate, where it sets a limit."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) - used


def available_memory() -> int | None:
    """What can be allocated without swapping or the OOM killer: MemAvailable, or a cgroup's room where lower; None
    where neither can be read."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if ":" in line}
    except (OSError, ValueError, IndexError):
        fields = {}
    known = [room for room in (fields.get("MemAvailable"), _cgroup_room()) if room is not None]
    return min(known) if known else None


def memory_budget() -> float | None:
    """Bytes one env may plan to use (`MEMORY_SHARE` of what is available); None where that cannot be read."""
    available = available_memory()
    return None if available is None else MEMORY_SHARE * available


def check_fits(need: int, what: str, fix: str) -> None:
    """Raise a ValueError saying that `what` needs `need` bytes, what the machine has, and `fix`, when `need` exceeds
    the budget."""
    budget = memory_budget()
    if budget is None or need <= budget:
        return
    raise ValueError(
        f"{what}, which needs about {need / GIB:,.1f} GiB, but this machine has {budget / MEMORY_SHARE / GIB:.1f} GiB "
        f"available (an env may plan for {MEMORY_SHARE:.0%} of it); {fix}."
    )


def check_grid(rows: int, cols: int, option: str, value: object) -> None:
    """Refuse a rows × cols grid, set by `option`=`value`, that cannot fit in memory."""
    need = int(rows) * int(cols) * BYTES_PER_CELL
    check_fits(need, f"{option}={value} makes a {rows}x{cols} grid", f"lower {option}")
