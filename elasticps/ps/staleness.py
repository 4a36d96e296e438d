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
  at momentum 0.9 dies at 0.1135; corrected, 0.4 for those pushes, it learns). A push 9 or more
  versions late gets none. :class:`MomentumCorrection` takes the larger of the push's staleness and
  the shard's recent mean: a fresh push among stale ones (the other workers' pushes just missed it)
  is corrected as they are, and when the job's last worker trains alone at its end, every push
  fresh, the momentum comes back over some 64 pushes instead of jumping from 0.4 to 0.9 at once,
  which multiplied the step, ``lr / (1 - momentum)``, by six and undid the model in the job's last
  seconds (2 workers, lr 0.05: 0.9852 to 0.9473 at the end of one run, 2026-11-28).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


def implicit_momentum(stale: float) -> float:
    """``stale / (stale + 1)``: 0 for a fresh push, 1/2 one version late, 9/10 nine late."""
    return stale / (stale + 1) if stale > 0 else 0.0


# Pushes the recent mean staleness of MomentumCorrection spans, about.
MEMORY = 64


class MomentumCorrection:
    """The implicit momentum of a push: ``implicit_momentum(max(stale, mean))``, ``mean`` the
    running mean of the staleness of the shard's pushes (this one included, weight 1/``memory``).

    The mean is a float written by concurrent pushes without a lock: one lost to a race leaves it a
    push older, and each push still takes at least its own staleness."""

    def __init__(self, memory: int = MEMORY) -> None:
        if memory < 1:
            raise ValueError(f"memory must be >= 1, got {memory}")
        self._rate = 1.0 / memory
        self.mean = 0.0

    def __call__(self, stale: int) -> float:
        mean = self.mean + (stale - self.mean) * self._rate
        self.mean = mean
        return implicit_momentum(max(float(stale), mean))


def _uncompensated() -> Compensation:
    return uncompensated


# The one place a spec's compensation becomes the PS's: a new one for each shard's rule.
COMPENSATIONS: Mapping[StalenessCompensation, Callable[[], Compensation]] = MappingProxyType(
    {
        StalenessCompensation.NONE: _uncompensated,
        StalenessCompensation.MOMENTUM_CORRECTION: MomentumCorrection,
    }
)
