"""Shared test settings."""

import torch

# The test models are tiny: intra-op threads only add synchronisation, and on a busy 2-core
# machine oversubscribed threads made a 0.2M-parameter iteration ~25x slower (0.44 s vs 11 s).
torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Tests marked slow run first, longest first (`@pytest.mark.slow(seconds=...)`, measured at one thread), so that
    with `-n 2 --dist worksteal` (dev.py test) the longest one starts at once and never finishes alone at the end."""

    def order(item):
        slow = item.get_closest_marker("slow")
        return (0, -slow.kwargs.get("seconds", 0)) if slow else (1, 0)

    items.sort(key=order)
