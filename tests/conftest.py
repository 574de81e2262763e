"""Shared test settings."""

import torch

# The test models are tiny: intra-op threads only add synchronisation, and on a busy 2-core
# machine oversubscribed threads made a 0.2M-parameter iteration ~25x slower (0.44 s vs 11 s).
torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Tests marked slow run first, so that with `-n 2` (dev.py test) the longest ones never finish alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
