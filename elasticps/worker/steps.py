"""The worker's half of a training mode: how one minibatch is trained against the PS.

Chosen once per worker by :func:`step_for` from the job's :class:`TrainingMode` (``worker/main.py``
derives it, ``training.py`` asks for the step and calls it; the loop itself has no mode branches).
Each step uses the :class:`LocalModel` for the model traffic and only decides when to pull and push:

* :class:`SyncStep` (``UpdateRule.SYNC``): pull before each minibatch if the PS has a newer model,
  push and wait; a rejected push (the PS moved on) means pull and train the same minibatch again.
* :class:`AsyncStep` (``UpdateRule.ASYNC``): the PS accepts every gradient, nothing is retrained; a
  pull waits for this worker's own push, so a gradient's staleness counts only other workers' updates.
* :class:`SSPStep` (async with ``pull_every`` k > 1): pull every k minibatches; in between apply own
  gradients to the local copy while also pushing them, each push travelling during the next minibatch.

A new mode (e.g. LocalSGD: K local steps, then model averaging) is one class here implementing
:class:`Step`, one entry in :data:`STEPS`, and the spec field that selects it in ``api/modes.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.worker.local_model import LocalModel

# Sync: after a gradient was accepted but the update waits for other workers' gradients, the next
# pull waits up to this long for the update instead of training a minibatch on a model the PS is
# about to replace (that gradient would be rejected and the minibatch trained again). Bounded, so
# a dead or slow peer costs at most this per step: the survivor then fills the update itself.
SYNC_WAIT_MS = 250


class Step(Protocol):
    """One mode's way of training minibatches, called by the training loop for each training task."""

    def start_task(self) -> None:
        """A training task begins."""

    def train(self, x: Any, y: Any) -> float:
        """Trains one minibatch against the PS; returns its mean loss."""

    def end_task(self) -> None:
        """The task's minibatches are done; afterwards nothing of the task may still be travelling."""


class SyncStep:
    def __init__(self, model: LocalModel) -> None:
        self._model = model
        self._update_pending = False  # our last gradient was accepted, the update it joins not yet applied

    def start_task(self) -> None:
        pass

    def train(self, x: Any, y: Any) -> float:
        model = self._model
        while True:
            model.pull(wait_ms=SYNC_WAIT_MS if self._update_pending else 0)
            loss, gradients = model.gradients(x, y)
            pushed = model.push(gradients)
            if pushed.all_accepted:
                # Accepted but the versions did not move: the update waits for other workers' gradients.
                self._update_pending = pushed.versions == model.versions
                return loss
            self._update_pending = False
            model.counters.rejected += 1  # the PS moved on: pull and train this minibatch again
            model.metrics.rejected.inc()

    def end_task(self) -> None:
        self._model.settle()  # nothing travels after a sync push; kept for the step contract


class AsyncStep:
    def __init__(self, model: LocalModel) -> None:
        self._model = model

    def start_task(self) -> None:
        pass

    def train(self, x: Any, y: Any) -> float:
        # The pull must see this worker's own last gradient: pulling while it is in flight would
        # add a step of staleness to every gradient (measured: with momentum 0.9 that made async
        # MNIST diverge).
        self._model.refresh()
        loss, gradients = self._model.gradients(x, y)
        self._model.push_async(gradients)
        return loss

    def end_task(self) -> None:
        self._model.settle()


class SSPStep:
    def __init__(self, model: LocalModel, pull_every: int) -> None:
        if pull_every < 1:
            raise ValueError(f"pull_every must be >= 1, got {pull_every}")
        self._model = model
        self._pull_every = pull_every
        self._since_pull = 0  # minibatches trained since the last pull, within this task

    def start_task(self) -> None:
        self._since_pull = 0  # every task starts from a fresh pull

    def train(self, x: Any, y: Any) -> float:
        if self._since_pull == 0:
            self._model.refresh()  # as in AsyncStep: the pull includes our own last push
        loss, gradients = self._model.gradients(x, y)
        self._model.push_async(gradients)
        self._since_pull += 1
        if self._since_pull < self._pull_every:
            self._model.apply_local(gradients)  # the next pull replaces this local step's effect
        else:
            self._since_pull = 0
        return loss

    def end_task(self) -> None:
        self._model.settle()


StepFactory = Callable[[TrainingMode, LocalModel], Step]

# Keyed by (the PS's update rule, whether the worker takes local steps between pulls). Sync with
# local steps has no entry: the spec refuses getModelFrequency > 1 without useAsync (api/modes.py).
STEPS: Mapping[tuple[UpdateRule, bool], StepFactory] = {
    (UpdateRule.SYNC, False): lambda mode, model: SyncStep(model),
    (UpdateRule.ASYNC, False): lambda mode, model: AsyncStep(model),
    (UpdateRule.ASYNC, True): lambda mode, model: SSPStep(model, mode.pull_every),
}


def step_for(mode: TrainingMode, model: LocalModel) -> Step:
    """The step of ``mode``, working on ``model``."""
    factory = STEPS.get((mode.rule, mode.pull_every > 1))
    if factory is None:
        raise ValueError(f"no worker step for the training mode {mode.label}")
    return factory(mode, model)
