"""The worker's half of a training mode: how one minibatch is trained against the PS.

Chosen once per worker by :func:`step_for` from the job's :class:`TrainingMode` (``worker/main.py``
derives it, ``training.py`` asks for the step and calls it; the loop itself has no mode branches).
Each step uses the :class:`LocalModel` for the model traffic and only decides when to pull and push:

* :class:`SyncStep` (``UpdateRule.SYNC``): pull (every shard at one version), compute, stage the
  gradient on every shard with a pull behind it, then join the coordinator's round (behind the
  gradient on PS 0's connection: :func:`joined`) and wait for it to be committed on every shard;
  each shard answers the pull as soon as it commits. A gradient
  the round did not take (too old: the round moved on; or its task went back to the queue) means
  pull and train the same minibatch again.
* :class:`AsyncStep` (``UpdateRule.ASYNC``): the PS accepts every gradient, nothing is retrained; a
  pull goes right behind this worker's own push, so a gradient's staleness counts only other
  workers' updates.
* :class:`SSPStep` (async with ``pull_every`` k > 1): pull every k minibatches; in between take a
  plain SGD step with own gradients on the local copy while also pushing them, each push travelling
  during the next minibatch. A local step has no momentum of its own (the PS applies the optimizer,
  momentum included, to the same gradients: the worker's would count it twice); it is as long as
  the PS's momentum carries the gradient before the worker's next push (:func:`local_step_scale`).
  A push's staleness counts every update since the pull, the worker's own included.

* :class:`LocalSGDStep` (``UpdateRule.LOCAL_SGD``): a period of K steps on the local copy with the
  worker's own optimizer, from a pull; then the model delta (pulled minus trained weights) is staged
  on every shard and joins a round, as a sync gradient does, and the round averages the members'
  models. The coordinator's answer names the next period's K. A delta the round did not take is
  trained again: pull, the period's minibatches again, push. A task's last period ends with the
  task, however short, so that no record of a reported task is left out of the model.

A sync or LocalSGD join names the task and how many of its records the gradient brings in: the
coordinator counts them applied once the round commits, so a task that goes back to the queue is
handed out again only from there. A task that went back (the worker was silent too long, PS 0
rolled back) is VOID at the worker's next join: the step raises :class:`TaskVoid`, and the loop
leaves the task without reporting it.

A new mode is one class here implementing :class:`Step`, one entry in :data:`STEPS`, and the spec
field that selects it in ``api/modes.py``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import PullBehind, Pushed
from elasticps.worker.local_model import LocalModel
from elasticps.worker.ports import RoundsLike

# Sync: how long one JoinRound call waits for the round to be committed before it asks again, how
# long a pull waits for a shard that is behind the others (a commit reaching shards in turn), and how
# long the pull sent behind a gradient waits on each shard for the round's model (the PS's longest).
JOIN_WAIT_MS = 5_000
ALIGN_WAIT_MS = 1_000
BEHIND_WAIT_MS = 10_000
# Sync: the pull behind a gradient (or delta), shard 0's held back to go behind the round's join.
JOIN_BEHIND = PullBehind(BEHIND_WAIT_MS, join=True)


class TaskVoid(Exception):
    """The coordinator says the task is no longer this worker's: it went back to the queue."""


class Step(Protocol):
    """One mode's way of training minibatches, called by the training loop for each training task."""

    def start_task(self, task_id: int = 0, epoch: int = 0) -> None:
        """Training task ``task_id`` of ``epoch`` begins."""

    def train(self, x: Any, y: Any, records: int = 0) -> float:
        """Trains one minibatch (of ``records`` records) against the PS; returns its mean loss."""

    def end_task(self) -> None:
        """The task's minibatches are done; afterwards nothing of the task may still be travelling."""


class TaskPlace:
    """Where a step is in its task: the task's id and the records trained so far."""

    def __init__(self) -> None:
        self.task_id = 0
        self.epoch = 0
        self.records = 0

    def start(self, task_id: int, epoch: int) -> None:
        self.task_id, self.epoch, self.records = task_id, epoch, 0

    def name(self, worker: str, session: str, sequence: int) -> str:
        """A minibatch's name on the PS (its round log's entry): unique, and it names the epoch."""
        return f"{worker}/{session}/{sequence}/e{self.epoch}"


def joined(model: LocalModel, rounds: RoundsLike, pushed: Pushed, version: int, place: TaskPlace,
           local_steps: int = 0, loss: float = 0.0, learning_rate: float = 0.0) -> pb.JoinReply | None:  # fmt: skip
    """Joins the round with what ``pushed`` staged on every shard (computed on ``version``, bringing
    the task's records up to ``place``; LocalSGD: a period of ``local_steps`` at mean ``loss``):
    behind the push on PS 0, over gRPC where that cannot go. The COMMITTED answer, or None when
    the round did not take it; :class:`TaskVoid` when the task is no longer this worker's."""
    task = {"task_id": place.task_id, "task_records": place.records}
    reply = model.join(pushed, version, JOIN_WAIT_MS, local_steps, loss, learning_rate, **task)
    while True:
        if reply is None:
            reply = rounds.join_round(version, JOIN_WAIT_MS, local_steps, loss, learning_rate, **task)
        if reply.outcome == pb.JOIN_OUTCOME_COMMITTED:
            return reply
        if reply.outcome == pb.JOIN_OUTCOME_REFUSED:
            return None
        if reply.outcome == pb.JOIN_OUTCOME_VOID:
            raise TaskVoid(f"task {place.task_id} went back to the queue")
        reply = None  # pending: ask again


class SyncStep:
    def __init__(self, model: LocalModel, rounds: RoundsLike, pull_ahead: bool = False) -> None:
        self._model = model
        self._pull_ahead = pull_ahead
        self._rounds = rounds
        self._session = secrets.token_hex(3)  # minibatch names stay unique across restarts
        self._sequence = 0
        self._place = TaskPlace()

    def start_task(self, task_id: int = 0, epoch: int = 0) -> None:
        self._place.start(task_id, epoch)

    def train(self, x: Any, y: Any, records: int = 0) -> float:
        model = self._model
        self._sequence += 1
        self._place.records += records
        minibatch = self._place.name(model.worker, self._session, self._sequence)  # kept when trained again
        while True:
            model.pull_aligned(ALIGN_WAIT_MS)
            version = model.versions[0]
            loss, gradients = model.gradients(x, y)
            # A pull goes behind the gradient on each shard, answered as soon as that shard commits the
            # round; on PS 0 the join goes first, behind the gradient, on the same connection.
            pushed = model.push(gradients, minibatch, JOIN_BEHIND if self._pull_ahead else None)
            try:
                taken = pushed.all_accepted and joined(model, self._rounds, pushed, version, self._place) is not None
            except TaskVoid:
                model.drop_behind(pushed)
                raise
            if taken:
                if self._pull_ahead:
                    model.pull_behind(pushed)  # committed: the next step's model, read while the loop goes on
                return loss
            model.drop_behind(pushed)
            model.counters.rejected += 1  # the round moved on without it: pull and train it again
            model.metrics.rejected.inc()

    def end_task(self) -> None:
        self._model.settle()  # the last round was committed before train() returned


class LocalSGDStep:
    """The worker's optimizer state (momentum) is kept across averagings: it is this worker's own
    descent direction, and resetting it every K steps would make each period start cold. The first
    period of a worker is one step long: the coordinator's answer to its first join gives the job's
    current K (``coordinator/local_steps.py``)."""

    def __init__(self, model: LocalModel, rounds: RoundsLike) -> None:
        self._model = model
        self._rounds = rounds
        self._session = secrets.token_hex(3)
        self._sequence = 0
        self._period = 1  # K of the current period
        self._start: dict[str, np.ndarray] = {}  # the weights the period started from (pulled)
        self._version = 0  # the version they were pulled at
        self._trained: list[tuple[Any, Any]] = []  # the period's minibatches, to train again if refused
        self._losses: list[float] = []
        self._place = TaskPlace()

    @property
    def period(self) -> int:
        return self._period

    def start_task(self, task_id: int = 0, epoch: int = 0) -> None:
        self._place.start(task_id, epoch)
        self._trained, self._losses = [], []  # a task left void may have left its period behind

    def train(self, x: Any, y: Any, records: int = 0) -> float:
        if not self._trained:
            self._begin()
        self._place.records += records
        loss = self._local_step(x, y)
        self._trained.append((x, y))
        self._losses.append(loss)
        if len(self._trained) >= self._period:
            self._average()
        return loss

    def end_task(self) -> None:
        if self._trained:
            self._average()  # the task's records are in the model before it is reported
        self._model.settle()

    def _begin(self) -> None:
        self._model.pull_aligned(ALIGN_WAIT_MS)
        self._version = self._model.versions[0]
        self._start = self._model.weights()

    def _local_step(self, x: Any, y: Any) -> float:
        loss, gradients = self._model.gradients(x, y)
        self._model.apply_local(gradients)
        return loss

    def _average(self) -> None:
        model = self._model
        self._sequence += 1
        minibatch = self._place.name(model.worker, self._session, self._sequence)
        while True:
            trained = model.weights()
            delta = {name: start - trained[name] for name, start in self._start.items()}
            pushed = model.push(delta, minibatch, JOIN_BEHIND)
            if pushed.all_accepted:
                loss = sum(self._losses) / len(self._losses)
                try:
                    reply = joined(model, self._rounds, pushed, self._version, self._place, len(self._trained), loss,
                                   model.learning_rate)  # fmt: skip
                except TaskVoid:
                    model.drop_behind(pushed)
                    self._trained, self._losses = [], []
                    raise
                if reply is not None:
                    self._period = max(1, reply.local_steps)
                    model.pull_behind(pushed)  # the next period's model, read while the loop goes on
                    break
            model.drop_behind(pushed)
            model.counters.rejected += 1  # the round moved on without it: the period again
            model.metrics.rejected.inc()
            self._begin()
            self._losses = [self._local_step(x, y) for x, y in self._trained]
        self._trained, self._losses = [], []



class AsyncStep:
    """``overlap``: the pull for the next minibatch starts as soon as the push is sent, the two
    travelling together (and with the loop's work between minibatches); the next gradient may then
    be computed on a model without this worker's last one: one own step more of staleness."""

    def __init__(self, model: LocalModel, overlap: bool = False) -> None:
        self._model = model
        self._overlap = overlap

    def start_task(self, task_id: int = 0, epoch: int = 0) -> None:
        pass

    def train(self, x: Any, y: Any, records: int = 0) -> float:
        # By default the pull sees this worker's own last gradient: pulling while it is in flight
        # adds a step of staleness to every gradient (measured once: with momentum 0.9 that made
        # async MNIST diverge), so it is only an option (spec.training.overlapPull).
        # Without overlap, the pull travels right behind the push (on the same connections): one
        # round trip for both, and its model includes the push.
        if not self._overlap:
            self._model.settle()
        self._model.pull(take_ahead=True)  # the pull behind, or started with, the last push, if any
        loss, gradients = self._model.gradients(x, y)
        self._model.push_async(gradients, pull_behind=not self._overlap)
        if self._overlap:
            self._model.pull_ahead()
        return loss

    def end_task(self) -> None:
        self._model.settle()


def local_step_scale(momentum: float, versions_per_push: float) -> float:
    """How many learning rates' worth of a gradient the PS's momentum has moved the model by when
    the worker's next push lands, ``versions_per_push`` updates later: ``1 + m + ... + m^(n-1)``,
    ``(1 - m^n) / (1 - m)`` (1 without momentum or for one version; ``1 / (1 - m)`` at most). Pure.

    SSP's local step takes this many steps of plain SGD, so the copy the next gradients are
    computed on is where the PS has carried this worker's own gradient by then (momentum 0.9, 4
    workers: 3.4), not a tenth of the way there; the other workers' updates it cannot know."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    n = max(1.0, versions_per_push)
    return (1.0 - momentum**n) / (1.0 - momentum) if momentum > 0 else 1.0


# The weight of the latest pull in SSPStep's mean of versions per push.
PACE_WEIGHT = 0.25


class SSPStep:
    """``overlap``: as :class:`AsyncStep`'s, for the pull every ``pull_every`` minibatches.

    Its local steps are scaled by :func:`local_step_scale`, from the model's momentum and the PS
    versions per push of this worker seen between its pulls (a running mean; 1 until two pulls
    a task apart are known)."""

    def __init__(self, model: LocalModel, pull_every: int, overlap: bool = False) -> None:
        if pull_every < 1:
            raise ValueError(f"pull_every must be >= 1, got {pull_every}")
        self._model = model
        self._pull_every = pull_every
        self._overlap = overlap
        self._since_pull = 0  # minibatches trained since the last pull, within this task
        self._pulled_at: tuple[int, int] | None = None  # the (incarnation, version) of this task's last pull
        self.versions_per_push = 1.0
        self._momentum: float | None = None  # the model's, read once (its optimizer does not change)

    def start_task(self, task_id: int = 0, epoch: int = 0) -> None:
        self._since_pull = 0  # every task starts from a fresh pull
        self._pulled_at = None  # the pace counts pushes between pulls within a task

    def train(self, x: Any, y: Any, records: int = 0) -> float:
        if self._since_pull == 0:
            if self._overlap:
                self._model.pull(take_ahead=True)  # the pull started with the last push, if any
            else:
                self._model.refresh()  # as in AsyncStep: the pull includes our own last push
            self._paced(self._model.held)
        loss, gradients = self._model.gradients(x, y)
        self._model.push_async(gradients)
        self._since_pull += 1
        if self._since_pull < self._pull_every:
            # The next pull replaces this local step's effect.
            if self._momentum is None:
                self._momentum = self._model.momentum
            self._model.sgd_step(gradients, local_step_scale(self._momentum, self.versions_per_push))
        else:
            self._since_pull = 0
            if self._overlap:
                self._model.pull_ahead()
        return loss

    def _paced(self, held: tuple[int, int]) -> None:
        """Takes the versions the PS moved by since this task's previous pull, ``pull_every``
        pushes of this worker ago, into the mean; not across a rollback (a new incarnation) or a
        shard restored to an older version."""
        before, self._pulled_at = self._pulled_at, held
        if before is not None and held[0] == before[0] and held[1] >= before[1]:
            seen = (held[1] - before[1]) / self._pull_every
            self.versions_per_push += PACE_WEIGHT * (seen - self.versions_per_push)

    def end_task(self) -> None:
        self._model.settle()


StepFactory = Callable[[TrainingMode, LocalModel, RoundsLike], Step]

# Keyed by (the PS's update rule, whether the worker takes local steps between pulls). Sync and
# LocalSGD with SSP's pulls have no entry: the spec refuses getModelFrequency > 1 without useAsync
# (api/modes.py).
# Async and SSP pulls leave with the push when mode.overlap_pull (see AsyncStep); sync always pulls ahead.
STEPS: Mapping[tuple[UpdateRule, bool], StepFactory] = {
    (UpdateRule.SYNC, False): lambda mode, model, rounds: SyncStep(model, rounds, pull_ahead=True),
    (UpdateRule.ASYNC, False): lambda mode, model, rounds: AsyncStep(model, mode.overlap_pull),
    (UpdateRule.ASYNC, True): lambda mode, model, rounds: SSPStep(model, mode.pull_every, mode.overlap_pull),
    (UpdateRule.LOCAL_SGD, False): lambda mode, model, rounds: LocalSGDStep(model, rounds),
}


def step_for(mode: TrainingMode, model: LocalModel, rounds: RoundsLike) -> Step:
    """The step of ``mode``, working on ``model`` (sync: joining ``rounds``)."""
    factory = STEPS.get((mode.rule, mode.pull_every > 1))
    if factory is None:
        raise ValueError(f"no worker step for the training mode {mode.label}")
    return factory(mode, model, rounds)
