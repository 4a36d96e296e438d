"""Staleness, and the learning-rate choices an update rule applies a push with (seed 000).

Pure. The async rule (``rules.py``) asks its :class:`LearningRate` once per push, with that push's
base learning rate and staleness, and hands the answer to the optimizer for that push only:
concurrent pushes share one optimizer, so the learning rate is an argument, never shared state.
:class:`StalenessAware` (Zhang et al., IJCAI'16) wraps another choice and divides its answer by the
staleness; the registry wraps the async rule's choice in it when the job asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


def staleness(ps_version: int, gradient_version: int) -> int:
    """How many updates the PS applied since the gradient's model; never negative.

    A gradient from a version the PS has not reached (the PS restarted from an older checkpoint)
    counts as fresh.
    """
    return max(0, ps_version - gradient_version)


class LearningRate(Protocol):
    def __call__(self, base_lr: float, stale: int) -> float:
        """The learning rate to apply one push with; ``base_lr`` is the push's (or the PS's)."""
        ...


def as_given(base_lr: float, stale: int) -> float:
    """The base learning rate, whatever the staleness."""
    return base_lr


@dataclass(frozen=True)
class StalenessAware:
    """``inner``'s learning rate divided by the staleness when it is > 0."""

    inner: LearningRate = as_given

    def __call__(self, base_lr: float, stale: int) -> float:
        lr = self.inner(base_lr, stale)
        return lr / stale if stale > 0 else lr
