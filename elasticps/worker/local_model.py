"""This worker's copy of the model and its traffic with the PS: pulls, pushes, versions, repairs.

Used by every step (``steps.py``) and by the training loop (``training.py``: the first pull, and
the refresh before an evaluation). The steps decide *when* to pull and push; this module knows
*how*: which versions the local copy holds, which push is still travelling, and what to do when a
PS shard lost its model (restarted without a checkpoint): push this worker's model to it again and
pull. Every pull, push and gradient computation is timed and counted here, once for all modes.

The model's non-trainable state (BatchNorm statistics, ``Trainer.state``) goes with the initial
model, with every push (its value after the minibatch the gradients come from) and with a repair;
every pull that brings a newer model assigns the PS's state too, so an evaluation, which pulls
first, uses the statistics the PS holds rather than this worker's own.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import Behind, Pulled, PullBehind, Pushed, PushHandle, PushRequest, ShardsUninitialized
from elasticps.worker.metrics import WorkerMetrics
from elasticps.worker.pacing import Pace
from elasticps.backends.api import Trainer
from elasticps.worker.ports import PSClientLike

log = logging.getLogger(__name__)

# A starting worker that finds some shards without a model waits this long for the workers holding
# it to repair them (their next push or pull finds them: within a round), polling every ADOPT_POLL_S.
ADOPT_WAIT_S = 20.0
ADOPT_POLL_S = 0.5


class NotSettled(Exception):
    """The PS shards do not come to one version (an export needs one model)."""


@dataclass
class Counters:
    """What this worker did over its life (logged at the end; the tests read them)."""

    steps: int = 0
    examples: int = 0  # training examples in the steps
    pulls: int = 0
    rejected: int = 0
    reinitialised: int = 0
    slowed_s: float = 0.0  # slept on purpose (spec.training.slowdown)


def paced_gradients(trainer: Trainer, x: Any, y: Any, pace: Pace | None, counters: Counters,
                    metrics: WorkerMetrics) -> tuple[float, dict[str, np.ndarray]]:
    """One minibatch's mean loss and gradients, timed; then, for a worker slowed on purpose, its
    sleep (counted in ``counters.slowed_s``; the step's seconds include it, as a slower processor's
    would). Every step of every strategy computes its gradients here."""
    with metrics.step_seconds.time():
        began = time.perf_counter()
        result = trainer.gradients(x, y)
        if pace is not None:
            counters.slowed_s += pace.after(time.perf_counter() - began)
    if not math.isfinite(result[0]):
        raise NonFiniteLoss(result[0])  # before anything of it is pushed or applied
    return result


class NonFiniteLoss(ArithmeticError):
    """A minibatch whose loss is not finite: its gradients go nowhere (the PS would refuse them).
    The training loop counts it for the task's report, and the coordinator marks the job Diverged
    (``coordinator/health.py``)."""

    def __init__(self, loss: float) -> None:
        super().__init__(f"the loss is {loss}")
        self.loss = loss


class Ahead(Protocol):
    """A pull whose answer the next pull takes: one started early (a future) or one sent behind a
    push (``psclient.client.Behind``)."""

    def result(self) -> Pulled: ...


class LocalModel:
    def __init__(
        self,
        trainer: Trainer,
        ps: PSClientLike,
        learning_rate: float,
        counters: Counters,
        metrics: WorkerMetrics,
        pace: Pace | None = None,
    ) -> None:
        self.counters = counters  # shared with the loop; steps count their own events here
        self.metrics = metrics
        self._trainer = trainer
        self._ps = ps
        self._learning_rate = learning_rate
        self._pace = pace  # spec.training.slowdown: sleeps after each computation
        self._versions = [-1] * ps.num_shards  # per shard; -1: nothing yet
        self._incarnations = [0] * ps.num_shards  # per shard: the timeline its version counts on
        self._in_flight: PushHandle | None = None
        self._placed = False  # whether the client has this model's placement (before any pull)
        self._ahead: Ahead | None = None  # a pull started early or sent behind a push, not yet taken
        self._ahead_pool: ThreadPoolExecutor | None = None
        self._reading: tuple[Behind, Future[Pulled]] | None = None  # pulls behind a push, being read

    @property
    def worker(self) -> str:
        return self._ps.worker

    @property
    def versions(self) -> list[int]:
        """The PS shards' versions the local copy was pulled at (a copy)."""
        return list(self._versions)

    @property
    def held(self) -> tuple[int, int]:
        """The (incarnation, version) of the oldest shard the local copy was pulled from."""
        return min(zip(self._incarnations, self._versions))

    # ---- pulls -------------------------------------------------------------------------------
    def initialise(self, adopt_wait_s: float = ADOPT_WAIT_S) -> None:
        """The first pull. The first worker to find every shard empty initialises the model; the
        others adopt it. Some shards empty beside others holding a model is no new job: those shards
        restarted without a checkpoint while this worker was starting, and the workers that hold the
        model repair them at its version. This worker, which holds no model yet, waits for that up to
        ``adopt_wait_s``, then repairs them itself at the others' version: never at version 0, which
        no round of the others' could follow (the job would wait for ever)."""
        self._place()
        deadline = time.monotonic() + adopt_wait_s
        with self.metrics.pull_seconds.time():
            pulled = self._ps.pull(self._versions, incarnations=self._incarnations)
            while 0 < len(pulled.uninitialized) < self._ps.num_shards:
                time.sleep(ADOPT_POLL_S)
                # Only the empty shards are asked while waiting; the whole model once they hold
                # one, or at the deadline (the repair goes at the others' version of now).
                empty = self._ps.pull(self._versions, only=pulled.uninitialized, incarnations=self._incarnations)
                if not empty.uninitialized or time.monotonic() >= deadline:
                    pulled = self._ps.pull(self._versions, incarnations=self._incarnations)
                    break
        self._take(pulled, initialise=len(pulled.uninitialized) == self._ps.num_shards)

    def _place(self) -> None:
        """Hands the client the model's tensors (names, shapes, dtypes) to place on the shards:
        every pull is joined by that placement, so it comes first (the trainer is built by now)."""
        if self._placed:
            return
        weights = self._trainer.weights()
        if weights:  # a model not built yet has none: the pull names what it lacks (Trainer.assign)
            self._ps.place(weights, self._trainer.state())
            self._placed = True

    def pull(self, wait_ms: int = 0, take_ahead: bool = False) -> None:
        """Takes what the PS has that is newer; with ``wait_ms``, waits that long for a newer version.
        ``take_ahead``: the answer of a pull started ahead is enough (the caller started it for this)."""
        self._pull(wait_ms=wait_ms, take_ahead=take_ahead)

    def refresh(self) -> None:
        """Settles the push in flight, then pulls: the local copy then includes this worker's own updates."""
        self.settle()
        self.pull()

    def pull_ahead(self) -> None:
        """Starts a pull in the background: the next pull takes its answer instead of asking.

        For the moments the caller knows a pull comes next and has other things to do first
        (sync: the round was committed; the task's loop, the report and the next minibatch come
        before the next step). At most one travels; while it does, no other pull may be asked."""
        if self._ahead is not None:
            return
        versions, incarnations = list(self._versions), list(self._incarnations)
        self._ahead = self._background().submit(self._ps.pull, versions, 0, None, incarnations)

    def pull_behind(self, pushed: Pushed) -> None:
        """:meth:`pull_ahead` for a push sent with pulls behind it (:meth:`push` with a
        ``pull_behind``; sync: its round was committed): the next pull takes their answers, read
        in the background since the push (each shard sent its model as soon as it committed the
        round). Without them, a pull is started ahead."""
        reading, self._reading = self._reading, None
        if reading is None or reading[0] is not pushed.behind:
            self.pull_ahead()
        elif self._ahead is not None:
            reading[0].cancel()
        else:
            self._ahead = reading[1]

    def drop_behind(self, pushed: Pushed) -> None:
        """The pulls behind ``pushed`` are not wanted (sync: its round did not count it)."""
        self._reading = None
        if pushed.behind is not None:
            pushed.behind.cancel()  # their reading, if under way, ends (psclient.client.Dropped)

    def _background(self) -> ThreadPoolExecutor:
        if self._ahead_pool is None:
            self._ahead_pool = ThreadPoolExecutor(1, thread_name_prefix="pull-ahead")
        return self._ahead_pool

    def _pull(
        self, wait_ms: int = 0, only: list[int] | None = None, take_ahead: bool = False
    ) -> None:
        """One pull. A pull started ahead (:meth:`pull_ahead`) is always taken first: it must not
        travel beside another. Its answer is what ``take_ahead`` callers wanted (the model for the
        next step); any other caller wants the model as it is now, which may have moved since that
        pull was started (another worker's rounds while this one reported a task, say), so it asks
        again from there (an unchanged shard answers with its version alone)."""
        self._place()
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            with self.metrics.pull_seconds.time():
                pulled = ahead.result()
            if not self._take(pulled, initialise=False) or take_ahead:
                return
        with self.metrics.pull_seconds.time():
            pulled = self._ps.pull(self._versions, wait_ms=wait_ms, only=only, incarnations=self._incarnations)
        self._take(pulled, initialise=False)

    def _take(self, pulled: Pulled, initialise: bool) -> bool:
        """Makes a pull's answer the local copy; False when it found shards without a model and
        repaired them instead (the repair pulled again)."""
        self.counters.pulls += 1
        if pulled.uninitialized:
            if not initialise:
                self._repair(pulled)
                return False
            self._ps.push_model(
                self._trainer.weights(),
                self._trainer.optimizer_config(self._learning_rate),
                state=self._trainer.state(),
            )
            pulled = self._ps.pull([-1] * self._ps.num_shards)
        if pulled.tensors:
            self._trainer.assign(pulled.tensors)
        if pulled.state:
            self._trainer.assign_state(pulled.state)
        self._versions = pulled.versions
        self._incarnations = pulled.incarnations
        self.metrics.model_version.set(pulled.versions[0])
        return True

    def pull_settled(self, wait_ms: int, attempts: int, strict: bool) -> int:
        """Settles the push in flight and pulls until every shard is at one (incarnation, version);
        returns that version (an export writes it). A sync job's shards meet between rounds; an
        async job's may keep moving apart: after ``attempts`` waiting pulls the oldest shard's
        version is returned, or with ``strict`` :class:`NotSettled` is raised."""
        self.refresh()
        for _ in range(attempts):
            held = list(zip(self._incarnations, self._versions))
            if len(set(held)) == 1:
                return self._versions[0]
            newest = max(held)
            self._pull(wait_ms=wait_ms, only=[i for i, model in enumerate(held) if model < newest])
        if len(set(zip(self._incarnations, self._versions))) == 1:
            return self._versions[0]
        if strict:
            raise NotSettled(f"the PS shards stay at different versions {self._versions}")
        return min(self._versions)

    def pull_aligned(self, wait_ms: int) -> None:
        """Pulls until every shard is at the same version (sync: a round is being committed on the
        shards one after another; the lagging ones are waited for, up to ``wait_ms`` per pull). A
        pull started ahead, after this worker's last round was committed, is the first pull."""
        self.pull(take_ahead=True)
        while len(set(zip(self._incarnations, self._versions))) > 1:
            newest = max(zip(self._incarnations, self._versions))
            held = zip(self._incarnations, self._versions)
            self._pull(wait_ms=wait_ms, only=[i for i, model in enumerate(held) if model < newest])

    def _repair(self, pulled: Pulled) -> None:
        """Shards lost their model (restarted without a checkpoint): ours is pushed to them, at the
        version and incarnation the healthy shards answered with (sync: every shard at one version,
        so the repaired shards join the next round with the others), then pulled."""
        log.warning("PS shards %s lost their model: pushing ours again", pulled.uninitialized)
        self.counters.reinitialised += 1
        healthy = [
            (incarnation, version)
            for shard, (incarnation, version) in enumerate(zip(pulled.incarnations, pulled.versions))
            if shard not in pulled.uninitialized
        ]
        incarnation, version = max(healthy) if healthy else (0, 0)
        self._ps.push_model(
            self._trainer.weights(),
            self._trainer.optimizer_config(self._learning_rate),
            [version] * self._ps.num_shards,
            incarnation,
            state=self._trainer.state(),
        )
        self._versions = [-1] * self._ps.num_shards
        self._pull()

    def _reinitialise(self, shards: list[int]) -> None:
        """A push found ``shards`` without a model: a pull sees which, and repairs them."""
        log.warning("PS shards %s hold no model", shards)
        self._pull()

    # ---- gradients ---------------------------------------------------------------------------
    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]:
        """One minibatch's mean loss and gradients on the local copy (then, for a worker slowed on
        purpose, its sleep: the step's seconds include it, as a slower processor's would)."""
        return paced_gradients(self._trainer, x, y, self._pace, self.counters, self.metrics)

    def apply_local(self, gradients: Mapping[str, np.ndarray]) -> None:
        """LocalSGD: a step of the worker's own optimizer on the local copy, at the module's
        scheduled rate for the copy's version if it has a schedule; the PS does not see it."""
        self._trainer.apply_local(gradients, self._trainer.learning_rate_at(self.held[1]))

    def sgd_step(self, gradients: Mapping[str, np.ndarray], scale: float = 1.0) -> None:
        """SSP: a local step between pulls, ``gradients`` times the learning rate times ``scale``
        taken off the local copy (``scale``: how far the PS's momentum carries the same gradient
        before this worker's next push lands, ``steps.local_step_scale``); no momentum of its own:
        the PS applies the same gradients with the optimizer's, and the next pull replaces the
        copy. A push after it is still tagged with the pulled versions: the PS moved by its own
        (momentum) updates of this worker's gradients, not by these steps, so they count in the
        push's staleness. Under a learning-rate schedule the step is at the schedule's rate."""
        scheduled = self._trainer.learning_rate_at(self.held[1])
        self._trainer.sgd_step(gradients, scale * scheduled / self.learning_rate if scheduled > 0 else scale)

    def weights(self) -> dict[str, np.ndarray]:
        """The local copy's trainable weights now (LocalSGD: where a period starts and ends)."""
        return self._trainer.weights()

    @property
    def learning_rate(self) -> float:
        """The learning rate of the worker's own optimizer (its local steps)."""
        return self._trainer.optimizer_config(self._learning_rate).params["learning_rate"]

    @property
    def momentum(self) -> float:
        """The heavy-ball momentum the PS applies this model's gradients with (SGD's; 0 for the
        optimizers without one)."""
        config = self._trainer.optimizer_config(self._learning_rate)
        return config.params.get("momentum", 0.0) if config.name == "sgd" else 0.0

    # ---- pushes ------------------------------------------------------------------------------
    def _rate(self) -> float:
        """The learning rate a gradient of the local copy is pushed with: the module's schedule's
        at the copy's version (``elasticps.callbacks``), else the job's (0: the PS's own)."""
        scheduled = self._trainer.learning_rate_at(self.held[1])
        return scheduled if scheduled > 0 else self._learning_rate

    def push(self, gradients: Mapping[str, np.ndarray], minibatch: str = "",
             pull_behind: PullBehind | None = None) -> Pushed:  # fmt: skip
        """Pushes in the caller's thread and waits for every shard's answer, tagged with the local
        copy's versions.

        ``pull_behind``: with a pull behind it on each shard (``psclient.client.PullBehind``), whose
        answers are read in the background from now on; the caller then takes them
        (:meth:`pull_behind`) or drops them (:meth:`drop_behind`). With its ``join`` (sync): shard
        0's pull waits for the round's join (:meth:`join`), and the reading starts there.

        A shard that lost its model gets ours pushed again (and pulled); the push then counts as
        rejected on every shard, so the caller trains the minibatch again on the fresh copy.
        """
        try:
            with self.metrics.push_seconds.time():
                request = PushRequest(
                    gradients,
                    self._versions,
                    self._rate(),
                    minibatch,
                    self._incarnations,
                    state=self._trainer.state(),
                    embeddings=self._trainer.row_gradients(),
                    pull_behind=pull_behind,
                )
                pushed = self._ps.push(request).result()
            if pushed.behind is not None and not (pull_behind is not None and pull_behind.join):
                self._read_behind(pushed)
            return pushed
        except ShardsUninitialized as err:
            self._reinitialise(err.shards)
            return Pushed([False] * self._ps.num_shards, list(self._versions))

    def join(self, pushed: Pushed, version: int, wait_ms: int, local_steps: int = 0, loss: float = 0.0,
             learning_rate: float = 0.0, task_id: int = 0, task_records: int = 0) -> pb.JoinReply | None:  # fmt: skip
        """Sync, after :meth:`push` with a joining ``pull_behind``: joins the round behind the push on PS 0
        (``Behind.join``), then reads the pulls behind in the background; the coordinator's answer,
        or None when the join could not go that way (the caller joins over gRPC)."""
        if pushed.behind is None or not pushed.all_accepted:
            return None  # refused: the caller drops the pulls behind
        try:
            request = pb.JoinRequest(worker=self.worker, version=version, wait_ms=wait_ms, local_steps=local_steps,
                                     loss=loss, learning_rate=learning_rate, task_id=task_id,
                                     task_records=task_records)  # fmt: skip
            return pushed.behind.join(request)
        finally:
            self._read_behind(pushed)

    def _read_behind(self, pushed: Pushed) -> None:
        assert pushed.behind is not None
        self._reading = (pushed.behind, self._background().submit(pushed.behind.result))

    def push_async(self, gradients: Mapping[str, np.ndarray], pull_behind: bool = False) -> None:
        """Sends a push that travels while the caller computes; one push in flight at a time.

        The push is tagged with the versions the gradients were computed at, taken before the
        previous push is settled (settling may repair a shard and pull). It runs on the client's
        push thread (``PushRequest.background``). ``pull_behind``: a pull travels right behind it;
        once the push is settled, the next pull that takes what is ahead (``pull(take_ahead=True)``)
        takes its answer.
        """
        versions, incarnations = list(self._versions), list(self._incarnations)
        rate = self._rate()
        state = self._trainer.state()  # now: settling may pull, replacing it with the PS's
        rows = self._trainer.row_gradients()
        self.settle()
        request = PushRequest(
            gradients, versions, rate, incarnations=incarnations, state=state, embeddings=rows,
            pull_behind=PullBehind() if pull_behind else None, background=True,
        )  # fmt: skip
        self._in_flight = self._ps.push(request)

    def settle(self) -> None:
        """Waits for the push in flight, if any; a shard that lost its model gets ours pushed again.
        A pull that travelled behind the push is kept for the next pull to take."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        try:
            pushed = in_flight.result()
        except ShardsUninitialized as err:
            self._reinitialise(err.shards)
            return
        if pushed.behind is not None:
            if self._ahead is None:
                self._ahead = pushed.behind
            else:
                pushed.behind.cancel()
