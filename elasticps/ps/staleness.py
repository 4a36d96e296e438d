"""Staleness and the staleness-aware learning rate (Zhang et al., IJCAI'16; seed 000).

Pure functions. The PS calls :func:`modulated_lr` once per push and passes the result to the
optimizer for that push only: concurrent pushes share one optimizer, so the learning rate is an
argument, never shared state.
"""

from __future__ import annotations


def staleness(ps_version: int, gradient_version: int) -> int:
    """How many updates the PS applied since the gradient's model; never negative.

    A gradient from a version the PS has not reached (the PS restarted from an older checkpoint)
    counts as fresh.
    """
    return max(0, ps_version - gradient_version)


def modulated_lr(learning_rate: float, stale: int, enabled: bool) -> float:
    """``lr / staleness`` when enabled and staleness > 0, else ``lr``."""
    if enabled and stale > 0:
        return learning_rate / stale
    return learning_rate
