"""Update rules: how a shard turns pushed gradients into model versions (the PS half of a mode).

Callers: the store (``store.py``) builds its rule once, through :func:`make_rule`, from the
``TrainingMode`` in its settings, and then only moves data: it checks a push against its tables and
hands it to the rule, and it reads under the rule's :meth:`Rule.guard`. The servicer asks
:attr:`Rule.consistent_reads` (through the store) whether it may encode a version once for every
puller. In the spirit of ps-lite's server request handle, the rule alone decides what a push does.

* :class:`SyncAveraging` (seed 000, the default): a gradient counts only when
  ``0 <= version_ps - version <= sync_version_tolerance``; ``grads_to_wait`` of them are summed,
  their average applied once, and the version bumped. Updates and reads hold one lock, so a pull
  never sees half an update.
* :class:`AsyncApply`: every gradient is applied at once, without a shard-wide lock (with
  ``use_locking``, one writer per variable); pulls read the live arrays, so a pulled model may mix
  versions. Its learning rate per push comes from a :class:`~elasticps.ps.staleness.LearningRate`,
  wrapped in :class:`~elasticps.ps.staleness.StalenessAware` for ``lrStalenessModulation``.

Adding a mode: a member of ``api.modes.UpdateRule``, a :class:`Rule` subclass here, an entry in
:data:`RULES`.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from elasticps.api.modes import UpdateRule
from elasticps.ps.model import Model, Update
from elasticps.ps.settings import StoreSettings
from elasticps.ps.staleness import LearningRate, StalenessAware, as_given, staleness
from elasticps.ps.tables import Accumulator
from elasticps.ps.versions import ModelVersion


@dataclass(frozen=True)
class PushOutcome:
    accepted: bool
    version: int  # the store's version after this push
    staleness: int
    learning_rate: float  # the learning rate this push was applied with (0 when rejected)


class Rule(abc.ABC):
    """One shard's update rule; a push reaches it already checked against the model's tables."""

    # True: a version's parameters never change while pulls read them, so its encoding can be shared.
    consistent_reads: ClassVar[bool]

    def reset(self, model: Model) -> None:
        """A model was installed (first push or restore): forget what was pending for the old one.

        Called under :meth:`guard`."""

    @abc.abstractmethod
    def push(
        self, model: Model, version: ModelVersion, update: Update, computed_on: int, base_lr: float
    ) -> PushOutcome:
        """Applies or holds ``update``, computed on model version ``computed_on``."""

    @abc.abstractmethod
    def guard(self) -> AbstractContextManager[object]:
        """Held by pulls while they read and by the store while it installs a model."""


class SyncAveraging(Rule):
    consistent_reads = True

    def __init__(self, grads_to_wait: int = 1, sync_version_tolerance: int = 0) -> None:
        if grads_to_wait < 1:
            raise ValueError(f"grads_to_wait must be >= 1, got {grads_to_wait}")
        self.grads_to_wait = grads_to_wait
        self.sync_version_tolerance = sync_version_tolerance
        self._lock = threading.Lock()  # updates and reads
        self._pending: dict[str, Accumulator[Any]] = {}
        self._count = 0

    def reset(self, model: Model) -> None:
        self._pending = model.accumulators()
        self._count = 0

    def guard(self) -> AbstractContextManager[object]:
        return self._lock

    def push(
        self, model: Model, version: ModelVersion, update: Update, computed_on: int, base_lr: float
    ) -> PushOutcome:
        with self._lock:
            behind = version.value - computed_on
            if not 0 <= behind <= self.sync_version_tolerance:
                return PushOutcome(False, version.value, max(0, behind), 0.0)
            for name, gradient in update.items():
                self._pending[name].add(gradient)
            self._count += 1
            if self._count >= self.grads_to_wait:
                for name, summed in self._pending.items():
                    model.tables[name].apply(summed.averaged(self._count), model.optimizer, base_lr)
                    summed.clear()
                self._count = 0
                version.advance()  # under the lock: a checkpoint it starts copies this version
            return PushOutcome(True, version.value, behind, base_lr)


class AsyncApply(Rule):
    consistent_reads = False

    def __init__(self, use_locking: bool = False, learning_rate: LearningRate = as_given) -> None:
        self.use_locking = use_locking
        self.learning_rate = learning_rate

    def guard(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def push(
        self, model: Model, version: ModelVersion, update: Update, computed_on: int, base_lr: float
    ) -> PushOutcome:
        stale = staleness(version.value, computed_on)
        lr = self.learning_rate(base_lr, stale)
        model.apply(update, lr, locking=self.use_locking)
        return PushOutcome(True, version.advance(), stale, lr)


def _sync(settings: StoreSettings) -> Rule:
    return SyncAveraging(settings.grads_to_wait, settings.sync_version_tolerance)


def _async(settings: StoreSettings) -> Rule:
    learning_rate: LearningRate = StalenessAware(as_given) if settings.mode.staleness_lr else as_given
    return AsyncApply(settings.mode.use_locking, learning_rate)


# The one place a mode becomes a rule on the PS.
RULES: Mapping[UpdateRule, Callable[[StoreSettings], Rule]] = MappingProxyType(
    {UpdateRule.SYNC: _sync, UpdateRule.ASYNC: _async}
)


def make_rule(settings: StoreSettings) -> Rule:
    factory = RULES.get(settings.mode.rule)
    if factory is None:
        raise ValueError(f"the PS has no update rule for mode {settings.mode.rule.value!r}")
    return factory(settings)
