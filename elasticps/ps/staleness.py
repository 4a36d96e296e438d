"""Staleness, and the choices an async update rule applies a push with (seed 000).

Pure. The async rule (``rules.py``) asks once per push, with that push's own staleness, and hands
the answers to the optimizer for that push only: concurrent pushes share one optimizer, so they
are arguments, never shared state.

* Its :class:`LearningRate`, from the push's base learning rate: :func:`as_given`, or
  :class:`StalenessAware` (Zhang et al., IJCAI'16) dividing by the staleness, when the job sets
  ``lrStalenessModulation``.
* Its :class:`Compensation` (``spec.training.stalenessCompensation``): the momentum the push's
  staleness already carries, which the optimizer takes off its own momentum coefficient
  (``optimizers.py``). Asynchrony begets momentum (Mitliagkas et al., 2016): a gradient computed
  ``s`` updates ago lands as heavy-ball momentum of about ``s / (s + 1)`` would (N workers at even
  speed: staleness N - 1, momentum 1 - 1/N), so explicit momentum 0.9 on top of it makes a total
  above 1 and the run diverges (``bench/delayed_gradients.py``: every gradient one version late
  at momentum 0.9 dies at 0.1135; corrected, 0.4 for those pushes, it learns). Fresh pushes keep
  the configured momentum; a push 9 or more versions late gets none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from elasticps.api.spec import StalenessCompensation


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


class Compensation(Protocol):
    def __call__(self, stale: int) -> float:
        """The implicit momentum of a push ``stale`` versions late, in [0, 1)."""
        ...


def uncompensated(stale: int) -> float:
    """No implicit momentum: every push is applied with the optimizer's own."""
    return 0.0


def implicit_momentum(stale: int) -> float:
    """``stale / (stale + 1)``: 0 for a fresh push, 1/2 one version late, 9/10 nine late."""
    return stale / (stale + 1) if stale > 0 else 0.0


# The one place a spec's compensation becomes the PS's.
COMPENSATIONS: Mapping[StalenessCompensation, Compensation] = MappingProxyType(
    {
        StalenessCompensation.NONE: uncompensated,
        StalenessCompensation.MOMENTUM_CORRECTION: implicit_momentum,
    }
)
