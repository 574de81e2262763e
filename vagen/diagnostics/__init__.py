"""Training diagnostics as pure tensor functions: MI proxies, reasoning regimes, Echo Trap signals.

No model, no I/O: the trainer computes the cross-scoring matrix and the step scalars, these
functions turn them into metrics (logged under `mi/` and `echo/`).
"""

from vagen.diagnostics.mi import mi_metrics
from vagen.diagnostics.regimes import (
    COLLAPSE_REGIMES,
    REGIMES,
    classify_regime,
    default_mi_threshold,
    echo_trap_init,
    echo_trap_update,
)

__all__ = [
    "COLLAPSE_REGIMES",
    "REGIMES",
    "classify_regime",
    "default_mi_threshold",
    "echo_trap_init",
    "echo_trap_update",
    "mi_metrics",
]
