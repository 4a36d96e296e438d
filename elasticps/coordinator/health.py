"""Training health: whether the training loss the workers report says the job learns. Pure.

Called by the task queue for every training task reported (its mean loss per record). The first
``FIRST_TASKS`` tasks give the job's first values; the latest ``RECENT_TASKS`` its recent loss.

* **Diverged**: a task had minibatches whose loss was not finite (the worker pushed none of them,
  ``TaskResult.nonfinite_steps``) or a loss that is not finite, or the recent loss is ``EXPLODED``
  times the first values or more. It stays diverged: the weights that gave it are trained on.
* **Stalled**: ``stall_records`` records into the job (``spec.training.stallEpochs`` epochs), the
  recent loss is still not below its first values (within ``MARGIN``): a model at chance level
  after an epoch (asynchronous SGD tipped over by momentum: loss 2.30 on MNIST's ten classes). The
  first values are the lower of the first tasks' mean loss and the initial model's: the first
  minibatch of each task that began at the job's lowest model version (:class:`FirstLoss`). A run
  that blows up within its first tasks has first tasks' losses above chance (3.6 at lr 0.5) and
  would pass for learning when it settles at chance; the initial model's loss (2.30) does not. A
  stalled job whose loss falls again is healthy again.

What follows from a verdict is the caller's: the coordinator reports it (``JobStatus.health``),
the planner turns it into a condition and an event, and ``spec.training.failUnhealthy`` fails the
job instead of exporting its model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

FIRST_TASKS = 4
RECENT_TASKS = 8
EXPLODED = 10.0
MARGIN = 0.01


class Health(str, Enum):
    HEALTHY = ""
    DIVERGED = "Diverged"
    STALLED = "Stalled"


@dataclass(frozen=True)
class FirstLoss:
    """A training task's first finite minibatch loss and the model version it was computed at."""

    loss: float
    version: int


@dataclass(frozen=True)
class Verdict:
    health: Health = Health.HEALTHY
    message: str = ""

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY


class HealthWatch:
    """The verdict on the losses recorded so far. ``stall_records``: training records within which
    the loss must fall below its first values (0: never judged stalled)."""

    def __init__(self, stall_records: int) -> None:
        self._stall_records = stall_records
        self._first: list[float] = []
        self._recent: list[float] = []
        self._records = 0  # training records reported so far
        self._diverged = ""
        self._initial: list[float] = []  # first minibatch losses at the lowest version reported
        self._initial_version = -1

    def record(self, loss: float, records: int, nonfinite_steps: int = 0, first_loss: FirstLoss | None = None) -> None:
        """One training task's mean loss per record over ``records`` records, of which
        ``nonfinite_steps`` minibatches had a loss that is not finite (left out of ``loss``);
        ``first_loss``: its first finite minibatch's loss and version."""
        self._records += records
        if first_loss is not None and math.isfinite(first_loss.loss) and first_loss.version >= 0:
            if self._initial_version < 0 or first_loss.version < self._initial_version:
                self._initial, self._initial_version = [], first_loss.version
            if first_loss.version == self._initial_version and len(self._initial) < FIRST_TASKS:
                self._initial.append(first_loss.loss)
        if nonfinite_steps or not math.isfinite(loss):
            if not self._diverged:
                what = f"{nonfinite_steps} minibatches of a task" if nonfinite_steps else "a task"
                self._diverged = f"the training loss was not finite in {what} after {self._records} records"
            return
        if len(self._first) < FIRST_TASKS:
            self._first.append(loss)
        self._recent = [*self._recent, loss][-RECENT_TASKS:]
        first, recent = self._means()
        if not self._diverged and len(self._first) == FIRST_TASKS and recent >= EXPLODED * max(first, 1e-12):
            self._diverged = (
                f"the training loss grew from {first:.4g} (first {FIRST_TASKS} tasks) to {recent:.4g} "
                f"(latest {len(self._recent)}) after {self._records} records"
            )

    def verdict(self) -> Verdict:
        if self._diverged:
            return Verdict(Health.DIVERGED, self._diverged)
        if self._stall_records <= 0 or len(self._first) < FIRST_TASKS:
            return Verdict()
        since = self._records  # from the job's start: "still at chance level after an epoch"
        first, recent = self._means()
        against = f"{first:.4g} (first {FIRST_TASKS} tasks)"
        if self._initial:
            initial = sum(self._initial) / len(self._initial)
            if initial < first:
                first, against = initial, f"{initial:.4g} (the model at version {self._initial_version})"
        if since >= self._stall_records and recent >= (1 - MARGIN) * first:
            return Verdict(
                Health.STALLED,
                f"the training loss has not fallen in {since} records: {recent:.4g} (latest {len(self._recent)} "
                f"tasks) against {against}",
            )
        return Verdict()

    def _means(self) -> tuple[float, float]:
        return sum(self._first) / len(self._first), sum(self._recent) / len(self._recent)
