"""In-memory stand-ins for what a worker talks to: a PS, a coordinator, a numpy trainer, a reader.

Used by ``test_steps.py`` and ``test_training.py``; no TensorFlow, no gRPC, no threads beyond the
worker's own heartbeat. Every call that matters lands in ``FakePS.events`` in order, so a test can
say what happened before what (a push landing before the next pull, say).

Sync as the real PS and coordinator do it, for one worker: a push is staged on every shard that is
at its version (within ``tolerance``), nothing moves; ``FakeCoordinator.join_round`` admits the
gradient into the open round (the shards' version) and commits that round, of this worker alone, on
every shard. Other workers' rounds are ``FakePS.others_update``.

Model state (BatchNorm-like statistics, ``STATE_OF``) travels as the real PS keeps it: with the
model, with every push (staged with the gradient and set to the round members' mean at a commit;
async: replaced) and with every full pull. ``FakeTrainer`` adds 1 to its state at every gradient
step, as a training forward pass moves BatchNorm's statistics.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.api.spec import TrainingSpec
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import Dropped, Pulled, Pushed, PushHandle, PushRequest, ShardsUninitialized
from elasticps.worker.exporting import Exporter
from elasticps.worker.metrics import WorkerMetrics
from elasticps.backends.api import Trainer
from elasticps.worker.ports import CoordinatorLike, PSClientLike, RoundsLike
from elasticps.worker.local_model import Counters, LocalModel
from elasticps.worker.training import Prediction, Worker
from prometheus_client import CollectorRegistry

WORKER = "worker-0"
# Variable -> shard: two shards with two variables each.
SHARD_OF = {"dense/kernel": 0, "dense/bias": 1, "out/kernel": 0, "out/bias": 1}
SHAPES = {"dense/kernel": (3, 2), "dense/bias": (2,), "out/kernel": (2, 1), "out/bias": (1,)}
# State tensor -> shard: one on each shard.
STATE_OF = {"bn/moving_mean": 0, "bn/moving_variance": 1}


def initial_weights(fill: float = 1.0) -> dict[str, np.ndarray]:
    return {name: np.full(shape, fill, np.float64) for name, shape in SHAPES.items()}


def initial_state() -> dict[str, np.ndarray]:
    return {"bn/moving_mean": np.zeros(2), "bn/moving_variance": np.ones(2)}


@dataclass
class Shard:
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    version: int = 0
    initialized: bool = False
    incarnation: int = 0  # bumped by a rollback (:meth:`FakePS.roll_back`)
    staged: dict[str, tuple[int, dict[str, np.ndarray], float]] = field(default_factory=dict)
    # sync: worker -> (version computed on, its gradient for this shard, learning rate)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    staged_state: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # sync: worker -> its state


class LandingFuture(Future[Pushed]):
    """A push that lands on the PS only when someone waits for it (``result()``), as if it took
    exactly as long as the worker kept computing: makes "settled before X" observable."""

    def __init__(self, land: Callable[[], Pushed]) -> None:
        super().__init__()
        self._land = land

    def result(self, timeout: float | None = None) -> Pushed:
        if not self.done():
            try:
                self.set_result(self._land())
            except BaseException as err:  # noqa: BLE001 - handed to the waiter, as a real future does
                self.set_exception(err)
        return super().result(timeout)


class FakeBehind:
    """A pull sent behind a push (``psclient.client.Behind``): answered when first read, as a shard
    answers once the push is done (sync: once the round is committed), and recorded as
    ``("behind", versions)``; ``("behind_dropped", versions)`` when dropped unread."""

    def __init__(self, ps: FakePS, versions: list[int], incarnations: list[int] | None, wait_ms: int) -> None:
        self._ps, self._versions, self._incarnations, self._wait_ms = ps, versions, incarnations, wait_ms
        self._pulled: Pulled | None = None
        self._dropped = False

    def result(self) -> Pulled:
        # A waiting pull is answered once a shard moved (a commit; the read runs in the worker's
        # background thread meanwhile), or when dropped.
        deadline = time.monotonic() + 5.0
        while self._wait_ms and not self._moved() and not self._dropped and time.monotonic() < deadline:
            time.sleep(0.001)
        if self._dropped:
            raise Dropped("dropped")
        if self._pulled is None:
            self._ps.events.append(("behind", self._versions))
            self._pulled = self._ps.answer(self._versions, incarnations=self._incarnations)
        return self._pulled

    def join(self, request: pb.JoinRequest) -> pb.JoinReply | None:
        """No join goes behind a push here: the step joins through its rounds."""
        return None

    def _moved(self) -> bool:
        return any(shard.version != version for shard, version in zip(self._ps.shards, self._versions))

    def cancel(self) -> bool:
        if self._pulled is None and not self._dropped:
            self._dropped = True
            self._ps.events.append(("behind_dropped", self._versions))
            return True
        return False


class FakePS:
    """Every shard of a PS in memory. ``rule``: sync (a gradient within ``tolerance`` of the shard's
    version is staged; :meth:`commit` applies a round) or async (every gradient applied at once)."""

    def __init__(self, rule: UpdateRule = UpdateRule.SYNC, num_shards: int = 2, tolerance: int = 0) -> None:
        self.worker = WORKER
        self.num_shards = num_shards
        self.rule = rule
        self.tolerance = tolerance
        self.shards = [Shard() for _ in range(num_shards)]
        self.events: list[tuple[Any, ...]] = []
        self.refuse_next_async = 0  # async: answer the next pushes as not accepted (never happens for real)
        self.before_push: Callable[[], None] | None = None  # runs once, just before the next push is looked at
        self.on_wait: Callable[[], None] | None = None  # runs once when a pull waits (wait_ms > 0)
        self.minibatches: list[str] = []  # sync: the minibatch name of every push, in order
        self.pushed_states: list[dict[str, np.ndarray]] = []  # the state every push carried, as it landed
        self.rates: list[float] = []  # the learning rate every push carried, as it landed
        self.waiting_pulls_left = 50  # a worker that waits for a shard more often waits forever: fail

        self.placed: list[list[str]] = []  # the tensors each place() call named (variables, then state)
        self.on_place: Callable[[], None] | None = None  # runs at every place()

    def place(self, variables: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray] | None = None) -> None:
        self.placed.append([*variables, *(state or {})])
        if self.on_place is not None:
            self.on_place()

    # ---- what tests do to it -----------------------------------------------------------------
    def others_update(self, shard: int | None = None) -> None:
        """Another worker's update lands (on one shard, or all)."""
        for index in [shard] if shard is not None else range(self.num_shards):
            self.shards[index].version += 1
            for value in self.shards[index].tensors.values():
                value -= 0.5

    def roll_back(self, version: int, incarnation: int) -> None:
        """The coordinator rolled every shard back to ``version`` under ``incarnation`` (the weights
        are left as they are: tests look at versions and incarnations)."""
        for shard in self.shards:
            shard.version, shard.incarnation = version, incarnation
            shard.staged.clear()

    def lose_model(self, shard: int) -> None:
        """The shard restarts without a checkpoint."""
        self.shards[shard] = Shard()

    def model(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for shard in self.shards:
            out.update({name: value.copy() for name, value in shard.tensors.items()})
        return out

    def state(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for shard in self.shards:
            out.update({name: value.copy() for name, value in shard.state.items()})
        return out

    def kinds(self) -> list[str]:
        return [event[0] for event in self.events]

    def commit(self, round_: int, workers: Sequence[str]) -> None:
        """Sync: the coordinator commits round ``round_`` of ``workers`` on every shard (a shard past
        it already applied it); the average of their staged gradients, once."""
        self.events.append(("commit", round_, list(workers)))
        for shard in self.shards:
            if round_ < shard.version:
                continue
            assert round_ == shard.version, f"round {round_} is ahead of the shard's version {shard.version}"
            members = [shard.staged.pop(worker) for worker in workers]  # KeyError: not staged
            assert all(0 <= round_ - on <= self.tolerance for on, _, _ in members)
            lr = 1.0 if self.rule is UpdateRule.LOCAL_SGD else members[0][2]  # LocalSGD: model deltas averaged
            for name in members[0][1]:
                shard.tensors[name] -= lr * sum(part[name] for _, part, _ in members) / len(members)
            states = [shard.staged_state.pop(worker, {}) for worker in workers]
            for name in shard.state:
                sent = [values[name] for values in states if name in values]
                if sent:
                    shard.state[name] = np.mean(sent, axis=0)
            shard.version += 1

    # ---- PSClientLike ------------------------------------------------------------------------
    def pull(
        self,
        versions: Sequence[int],
        wait_ms: int = 0,
        only: Sequence[int] | None = None,
        incarnations: Sequence[int] | None = None,
    ) -> Pulled:
        self.events.append(("pull", list(versions), wait_ms, None if only is None else list(only)))
        return self.answer(versions, wait_ms, only, incarnations)

    def answer(
        self,
        versions: Sequence[int],
        wait_ms: int = 0,
        only: Sequence[int] | None = None,
        incarnations: Sequence[int] | None = None,
    ) -> Pulled:
        """What a pull gets now (no event)."""
        held = list(incarnations) if incarnations is not None else [0] * self.num_shards
        if wait_ms > 0:
            self.waiting_pulls_left -= 1
            if self.waiting_pulls_left < 0:
                raise AssertionError(f"the worker keeps waiting for shards {only} that never move")
            hook, self.on_wait = self.on_wait, None
            if hook is not None:
                hook()
        asked = range(self.num_shards) if only is None else only
        tensors: dict[str, np.ndarray] = {}
        state: dict[str, np.ndarray] = {}
        for index in asked:
            shard = self.shards[index]
            if shard.initialized and (held[index], versions[index]) != (shard.incarnation, shard.version):
                tensors.update({name: value.copy() for name, value in shard.tensors.items()})
                state.update({name: value.copy() for name, value in shard.state.items()})
        return Pulled(
            versions=[s.version if i in asked else versions[i] for i, s in enumerate(self.shards)],
            incarnations=[s.incarnation if i in asked else held[i] for i, s in enumerate(self.shards)],
            tensors=tensors,
            uninitialized=[i for i in asked if not self.shards[i].initialized],
            state=state,
        )

    def push_model(
        self,
        tensors: Mapping[str, np.ndarray],
        optimizer: OptimizerConfig,
        versions: Sequence[int] | None = None,
        incarnation: int = 0,
        state: Mapping[str, np.ndarray] | None = None,
    ) -> list[int]:
        empty = sorted(index for index, s in enumerate(self.shards) if not s.initialized)
        self.events.append(("push_model", empty) if versions is None else ("push_model", empty, list(versions)))
        for index in empty:
            shard = self.shards[index]
            shard.tensors = {n: np.array(v, copy=True) for n, v in tensors.items() if SHARD_OF[n] == index}
            shard.state = {n: np.array(v, copy=True) for n, v in (state or {}).items() if STATE_OF[n] == index}
            shard.initialized = True
            shard.version = 0 if versions is None else max(0, versions[index])
            shard.incarnation = incarnation
        return [shard.version for shard in self.shards]

    def push(self, request: PushRequest) -> PushHandle:
        assert not request.embeddings  # the fakes train no embedding tables
        wait_ms = None if request.pull_behind is None else request.pull_behind.wait_ms
        if request.background:
            return PushHandle(self._push_later(request, wait_ms))

        def land() -> Pushed:
            self.events.append(("push", list(request.versions)))
            self.minibatches.append(request.minibatch)
            sent_state = {n: np.array(v, copy=True) for n, v in (request.state or {}).items()}
            pushed = self._land(dict(request.gradients), list(request.versions), request.learning_rate,
                                incarnations=request.incarnations, state=sent_state)  # fmt: skip
            return self._behind(pushed, request.versions, request.incarnations, wait_ms)

        return PushHandle.now(land)

    def _behind(
        self, pushed: Pushed, versions: Sequence[int], incarnations: Sequence[int] | None, wait_ms: int | None
    ) -> Pushed:
        if wait_ms is None:
            return pushed
        behind: Any = FakeBehind(self, list(versions), None if incarnations is None else list(incarnations), wait_ms)
        return dataclasses.replace(pushed, behind=behind)

    def _push_later(self, request: PushRequest, wait_ms: int | None) -> LandingFuture:
        self.events.append(("push_async", list(request.versions)))
        sent, at = {n: np.array(g, copy=True) for n, g in request.gradients.items()}, list(request.versions)
        sent_state = {n: np.array(v, copy=True) for n, v in (request.state or {}).items()}
        held = None if request.incarnations is None else list(request.incarnations)

        def land() -> Pushed:
            pushed = self._land(sent, at, request.learning_rate, note="landed", incarnations=held, state=sent_state)
            pushed = self._behind(pushed, at, held, wait_ms)
            if pushed.behind is not None:
                pushed.behind.result()  # read with the push, as the real client does
            return pushed

        return LandingFuture(land)

    def _land(
        self,
        gradients: dict[str, np.ndarray],
        versions: list[int],
        lr: float,
        note: str = "",
        incarnations: Sequence[int] | None = None,
        state: Mapping[str, np.ndarray] | None = None,
    ) -> Pushed:
        held = list(incarnations) if incarnations is not None else [0] * self.num_shards
        self.pushed_states.append(dict(state or {}))
        self.rates.append(lr)
        hook, self.before_push = self.before_push, None
        if hook is not None:
            hook()
        if note:
            self.events.append((note, versions))
        lost = [index for index, shard in enumerate(self.shards) if not shard.initialized]
        if lost:
            raise ShardsUninitialized(lost)
        accepted: list[bool] = []
        for index, shard in enumerate(self.shards):
            mine = {n: g for n, g in gradients.items() if SHARD_OF[n] == index}
            my_state = {n: v for n, v in (state or {}).items() if STATE_OF[n] == index}
            if held[index] != shard.incarnation:  # computed before a rollback: refused, as the store does
                accepted.append(False)
                continue
            if self.rule is UpdateRule.ASYNC:
                ok = self.refuse_next_async == 0
                if ok:
                    shard.state.update(my_state)  # the latest value replaces the held one
                    self._apply(shard, mine, lr)
            else:  # staged, one per worker: a newer push replaces this worker's older one
                ok = 0 <= shard.version - versions[index] <= self.tolerance
                if ok:
                    shard.staged[self.worker] = (versions[index], {n: np.array(g, copy=True) for n, g in mine.items()}, lr)
                    shard.staged_state[self.worker] = my_state
            accepted.append(ok)
        self.refuse_next_async = max(0, self.refuse_next_async - 1)
        return Pushed(accepted, [shard.version for shard in self.shards])

    @staticmethod
    def _apply(shard: Shard, gradients: Mapping[str, np.ndarray], lr: float) -> None:
        for name, gradient in gradients.items():
            shard.tensors[name] -= lr * gradient
        shard.version += 1


class FakeCoordinator:
    """Hands out the given tasks in order, then FINISHED; keeps every report. Sync: a join is
    admitted into the open round (``ps``'s version) when ``0 <= round - version <= tolerance``,
    which is then committed on every shard with this worker alone (``answers``: outcomes to give
    the next joins instead, e.g. PENDING while other workers are awaited)."""

    def __init__(self, tasks: Sequence[pb.Task], ps: FakePS | None = None) -> None:
        self.tasks = list(tasks)
        self.ps = ps
        self.handed = 0
        self.reports: list[pb.TaskResult] = []
        self.heartbeats = 0
        self.fail_reports = False
        self.events: list[tuple[Any, ...]] | None = None  # shares FakePS.events when set
        self.answers: list[pb.JoinOutcome.ValueType] = []
        self.before_join: Callable[[], None] | None = None  # runs once, before the next join is decided
        self.periods: list[tuple[int, float, float]] = []  # each join's (local_steps, loss, learning_rate)
        self.joined_tasks: list[tuple[int, int]] = []  # each join's (task_id, task_records)
        self.next_period = 0  # LocalSGD: the local steps a COMMITTED reply names
        self.left = 0
        self.fail_leave = False
        self.job_status = pb.JobStatus(metrics={"accuracy": 0.75}, metrics_version=3, records_done=32, num_epochs=1)

    def get_task(self) -> pb.Task:
        if self.handed >= len(self.tasks):
            return pb.Task(type=pb.TASK_TYPE_FINISHED)
        self.handed += 1
        return self.tasks[self.handed - 1]

    def report(self, result: pb.TaskResult) -> None:
        if self.fail_reports:
            raise ConnectionError("coordinator unreachable")
        copy = pb.TaskResult()
        copy.CopyFrom(result)
        self.reports.append(copy)
        if self.events is not None:
            self.events.append(("report", result.task_id))

    def heartbeat(self) -> None:
        self.heartbeats += 1

    def leave(self) -> None:
        self.left += 1
        if self.events is not None:
            self.events.append(("leave",))
        if self.fail_leave:
            raise ConnectionError("coordinator unreachable")

    def status(self, timeout_s: float = 5.0) -> pb.JobStatus:
        return self.job_status

    def join_round(
        self, version: int, wait_ms: int, local_steps: int = 0, loss: float = 0.0, learning_rate: float = 0.0,
        task_id: int = 0, task_records: int = 0,
    ) -> pb.JoinReply:
        ps = self.ps
        assert ps is not None, "a sync worker needs the fake coordinator to know the PS"
        ps.events.append(("join", version, wait_ms))
        self.joined_tasks.append((task_id, task_records))
        self.periods.append((local_steps, loss, learning_rate))
        hook, self.before_join = self.before_join, None
        if hook is not None:
            hook()
        round_ = ps.shards[0].version
        if self.answers:
            return pb.JoinReply(outcome=self.answers.pop(0), version=round_)
        if not 0 <= round_ - version <= ps.tolerance:
            return pb.JoinReply(outcome=pb.JOIN_OUTCOME_REFUSED, version=round_)
        ps.commit(round_, [ps.worker])
        return pb.JoinReply(outcome=pb.JOIN_OUTCOME_COMMITTED, version=round_ + 1, local_steps=self.next_period)


def training_task(task_id: int, start: int, end: int) -> pb.Task:
    return pb.Task(id=task_id, type=pb.TASK_TYPE_TRAINING, start=start, end=end)


def export_task(task_id: int, version: int, final: bool = True) -> pb.Task:
    return pb.Task(id=task_id, type=pb.TASK_TYPE_EXPORT, model_version=version, final=final)


def prediction_task(task_id: int, start: int, end: int, version: int = 0) -> pb.Task:
    return pb.Task(id=task_id, type=pb.TASK_TYPE_PREDICTION, start=start, end=end, model_version=version)


def evaluation_task(task_id: int, start: int, end: int) -> pb.Task:
    return pb.Task(id=task_id, type=pb.TASK_TYPE_EVALUATION, start=start, end=end)


WAIT_TASK = pb.Task(type=pb.TASK_TYPE_WAIT)


class FakeTrainer:
    """A "model" of numpy arrays. Minibatches in record order; a minibatch's loss is the mean of
    its labels (so a task's loss sum is the sum of its labels); every gradient is all ones."""

    def __init__(self, minibatch_size: int = 4, fill: float = 1.0) -> None:
        self.minibatch_size = minibatch_size
        self.variables = initial_weights(fill)
        self.statistics = initial_state()  # the model's state (``state``/``assign_state``)
        self.evaluated_state: list[dict[str, np.ndarray]] = []  # the state each evaluation ran with
        self.built = False
        self.computed: list[tuple[int, dict[str, np.ndarray]]] = []  # (first record id, weights then)
        self.applied_locally = 0
        self.scales: list[float] = []  # each sgd_step's scale
        self.schedule: Callable[[int], float] | None = None  # the module's learning rate by version
        self.local_rates: list[float] = []  # the learning_rate of each local step
        self.warmed_up: list[int] = []  # records of each warm_up
        self.evaluated: list[dict[str, np.ndarray]] = []
        self.fail_on_record: int | None = None
        self.events: list[tuple[Any, ...]] | None = None  # shares FakePS.events when set

    def build(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        self.built = True

    def weights(self) -> dict[str, np.ndarray]:
        return {name: value.copy() for name, value in self.variables.items()}

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            self.variables[name] = np.array(value, copy=True)

    def state(self) -> dict[str, np.ndarray]:
        return {name: value.copy() for name, value in self.statistics.items()}

    def assign_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            assert name in self.statistics, name
            self.statistics[name] = np.array(value, copy=True)

    def optimizer_config(self, learning_rate: float) -> OptimizerConfig:
        return OptimizerConfig("sgd", {"learning_rate": learning_rate})

    def batches(self, features: np.ndarray, labels: np.ndarray, mode: str) -> Iterator[tuple[Any, Any]]:
        for start in range(0, len(labels), self.minibatch_size):
            yield features[start : start + self.minibatch_size], labels[start : start + self.minibatch_size]

    def warm_up(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        """As a real trainer: the step runs once (a training forward pass moves the statistics),
        then the state is put back."""
        assert labels is not None  # the fake's records always have labels
        saved = self.state()
        self.gradients(*next(self.batches(features, labels, "training")))
        self.computed.pop()
        self.assign_state(saved)
        self.warmed_up.append(len(features))
        if self.events is not None:
            self.events[-1] = ("warm_up", len(features))

    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]:
        first = int(x[0, 0])
        if self.fail_on_record is not None and self.fail_on_record == first:
            raise RuntimeError("boom")
        self.computed.append((first, self.weights()))
        for value in self.statistics.values():
            value += 1.0  # a training forward pass moves the statistics
        if self.events is not None:
            self.events.append(("gradients", first))
        return float(np.mean(y)), {name: np.ones(shape) for name, shape in SHAPES.items()}

    def row_gradients(self) -> dict[str, Any]:
        return {}  # no embedding tables

    def learning_rate_at(self, version: int) -> float:
        return 0.0 if self.schedule is None else self.schedule(version)

    def apply_local(self, gradients: Mapping[str, np.ndarray], learning_rate: float = 0.0, event: str = "apply_local",
                    scale: float = 1.0) -> None:  # fmt: skip
        self.local_rates.append(learning_rate)
        self.applied_locally += 1
        if self.events is not None:
            self.events.append((event,))
        for name, gradient in gradients.items():
            self.variables[name] = self.variables[name] - 0.01 * scale * gradient

    def sgd_step(self, gradients: Mapping[str, np.ndarray], scale: float = 1.0) -> None:
        self.scales.append(scale)
        self.apply_local(gradients, 0.0, "sgd_step", scale)

    def export(self, directory: Path) -> None:
        """The "model file": the weights as they are, as JSON (a test reads which were exported)."""
        if self.events is not None:
            self.events.append(("export",))
        weights = {name: value.tolist() for name, value in self.variables.items()}
        (directory / "model.keras").write_text(json.dumps(weights))
        (directory / "saved_model").mkdir()
        (directory / "saved_model" / "saved_model.pb").write_text("fake")

    def predict(self, features: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
        """Two "logits" per record: its number, and the model's first ``dense/bias`` value (so a
        test sees which weights predicted)."""
        if self.events is not None:
            self.events.append(("predict", int(features[0, 0])))
        mark = np.full(len(features), self.variables["dense/bias"][0])
        return np.stack([features[:, 0], mark], axis=1)

    def evaluate(self, features: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        self.evaluated.append(self.weights())
        self.evaluated_state.append(self.state())
        if self.events is not None:
            self.events.append(("evaluate",))
        return {"loss": float(np.sum(labels)), "count": float(len(labels))}


class ArrayReader:
    """Records 0..n-1: feature row i starts with i (so a minibatch names its first record); label i is i."""

    def __init__(self, records: int = 32) -> None:
        self.features = np.repeat(np.arange(records, dtype=np.float64)[:, None], 3, axis=1)
        self.labels = np.arange(records, dtype=np.float64)

    @property
    def num_records(self) -> int:
        return len(self.labels)

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        return self.features[start:end], self.labels[start:end]


@dataclass
class Rig:
    """A worker wired to fakes."""

    ps: FakePS
    coordinator: FakeCoordinator
    trainer: FakeTrainer
    registry: CollectorRegistry
    worker: Worker

    def metric(self, name: str) -> float | None:
        return self.registry.get_sample_value(name, {"worker": WORKER})


def make_worker(
    mode: TrainingMode,
    tasks: Sequence[pb.Task],
    ps: FakePS | None = None,
    trainer: FakeTrainer | None = None,
    records: int = 32,
    validation: bool = True,
    learning_rate: float = 0.1,
    exporter: Exporter | None = None,
    prediction: Prediction | None = None,
    training: bool = True,
    stopping: threading.Event | None = None,
) -> Rig:
    ps = ps or FakePS(mode.rule)
    trainer = trainer or FakeTrainer()
    trainer.events = ps.events
    coordinator = FakeCoordinator(tasks, ps)
    coordinator.events = ps.events
    registry = CollectorRegistry()
    worker = Worker(
        TrainingSpec(learning_rate=learning_rate),
        mode,
        trainer,
        ps,
        coordinator,
        ArrayReader(records) if training else None,
        ArrayReader(records) if validation else None,
        heartbeat_s=0.01,
        metrics=WorkerMetrics(registry, WORKER),
        exporter=exporter,
        prediction=prediction,
        stopping=stopping,
    )
    return Rig(ps, coordinator, trainer, registry, worker)


def make_model(ps: FakePS, trainer: FakeTrainer, registry: CollectorRegistry | None = None) -> LocalModel:
    trainer.events = ps.events
    metrics = WorkerMetrics(registry or CollectorRegistry(), WORKER)
    return LocalModel(trainer, ps, 0.1, Counters(), metrics)


# Checked by mypy when run on the tests: the fakes are what the worker's ports ask for.
def _conforms(ps: FakePS, coordinator: FakeCoordinator, trainer: FakeTrainer) -> None:
    _ps: PSClientLike = ps
    _coordinator: CoordinatorLike = coordinator
    _rounds: RoundsLike = coordinator
    _trainer: Trainer = trainer
