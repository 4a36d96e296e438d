"""Dynamic data sharding: the task queue of a job (todo / doing / done), pure and clock-injected.

Called by the coordinator servicer under its lock. The training data is cut into tasks of
``records_per_task`` records; each epoch's tasks are created, shuffled, when the previous epoch's
todo runs dry. Failure rules (ElasticDL's training once hung for want of the second one):

* a worker that asks for a task while it still holds one has restarted: its task goes back to todo;
* a task whose worker has been silent (no heartbeat, no report) for ``task_timeout`` goes back to todo;
* a failed task goes back to todo.

So every record is trained exactly ``num_epochs`` times, counted by the ``done`` ledger. The ledger
grows one entry per epoch as each epoch starts: nothing is allocated for epochs not yet reached, so
a large ``num_epochs`` costs nothing up front.
Evaluation: every ``evaluation_steps`` model versions, and once after the last training task, the
validation data is cut into evaluation tasks, handed out before training tasks; their metric sums are
aggregated into one result per evaluated version.
Export (a job with ``spec.output``): once every training task and the final evaluation are done and
every PS shard holds the same version (the caller passes that ``settled`` version to :meth:`get`),
one export task of exactly that version is handed to the next worker that asks; it follows the
failure rules above like any task, so a worker that dies while exporting leaves it to another.
With ``export_steps`` a periodic export is also queued each time the model crosses a multiple of it
(one at a time, handed before training tasks, like evaluations).
Prediction (``prediction_records``, ``spec.prediction``): once the final export is done (or the
final evaluation, without an output) and the shards hold one version (``settled`` again), the
prediction data is cut into prediction tasks of ``records_per_task`` records, in record order, all
carrying that version; a job without training data (``num_records`` 0: it predicts with an exported
model) cuts them at once, with no version. They follow the failure rules above, and each is counted
once, by its first record. The job is finished when every training task of every epoch, the final
evaluation, the final export and every prediction task are done.
An export whose worker reports that the output refused it (``export_failed``: a missing bucket, a
path under a file, no credentials) goes back to todo like any failed task, but it counts: after
``export_attempts`` such failures the queue gives up on the job (:attr:`Progress.export_failure`
says which export, the last error, and how many attempts) and hands out nothing more; the
coordinator reports it and the planner fails the job (reason ExportFailed). A worker that dies
or is stopped while exporting does not count.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class TaskKind(str, Enum):
    TRAINING = "training"
    EVALUATION = "evaluation"
    EXPORT = "export"
    PREDICTION = "prediction"


MAX_COUNT = (1 << 63) - 1  # counters saturate here: they travel as int64 in the job's status


def _saturated(value: int) -> int:
    return max(0, min(MAX_COUNT, value))


class ReportError(ValueError):
    """A report that contradicts its task (its record count); nothing was changed."""


@dataclass(frozen=True)
class Task:
    id: int
    kind: TaskKind
    start: int
    end: int
    epoch: int
    model_version: int = 0  # evaluation: the version that triggered it; export, prediction: the version to use
    final: bool = False  # export: the job's last model (exactly model_version), not a periodic one

    @property
    def records(self) -> int:
        return self.end - self.start


class Wait(Enum):
    """Nothing to hand out now (other workers hold the rest): ask again shortly."""

    WAIT = "wait"


class Finished(Enum):
    """The job is done: the worker may exit."""

    FINISHED = "finished"


@dataclass(frozen=True)
class QueueSettings:
    num_records: int
    records_per_task: int
    num_epochs: int
    validation_records: int = 0
    evaluation_steps: int = 0
    task_timeout: float = 60.0
    seed: int = 0
    export: bool = False  # the job has an output: the final model is exported before it finishes
    export_steps: int = 0  # with export: also every this many model versions
    prediction_records: int = 0  # records of the prediction data (0: the job does not predict)

    @property
    def trains(self) -> bool:
        """Whether the job trains (a job without training data only predicts, with an exported model)."""
        return self.num_records > 0
    export_attempts: int = 3  # an export the output refuses this many times fails the job


@dataclass
class _Doing:
    task: Task
    worker: str


@dataclass
class _Evaluation:
    version: int
    pending: int
    records: int = 0
    sums: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportFailure:
    """An export the output refused ``attempts`` times: the job cannot end well."""

    version: int
    final: bool
    attempts: int
    error: str  # the last worker's words


@dataclass(frozen=True)
class Progress:
    finished: bool
    epoch: int
    records_done: int
    records_total: int
    epoch_records: tuple[int, ...]  # records trained in each epoch started so far
    loss: float
    metrics: Mapping[str, float]
    metrics_version: int
    tasks_requeued: int
    gradients_rejected: int
    export_version: int = -1  # the newest export reported (-1: none)
    export_final: bool = False  # that export is the final model
    evaluations: int = 0  # evaluations completed by this coordinator (since it started)
    records_predicted: int = 0  # records whose prediction tasks are reported
    prediction_records: int = 0  # records to predict (0: the job does not predict)
    export_failure: ExportFailure | None = None  # the queue gave up: the job fails


class TaskQueue:
    def __init__(self, settings: QueueSettings, clock: Callable[[], float]) -> None:
        if settings.num_records < 0 or settings.prediction_records < 0:
            raise ValueError("record counts cannot be negative")
        if settings.num_records == 0 and settings.prediction_records == 0:
            raise ValueError("the training data holds no records (and there is nothing to predict)")
        self._s = settings
        self._clock = clock
        self._rng = random.Random(settings.seed)
        self._next_id = 1
        self._todo: list[Task] = []
        self._eval_todo: list[Task] = []
        self._doing: dict[int, _Doing] = {}
        self._last_seen: dict[str, float] = {}
        self._epoch = -1  # the newest epoch whose tasks were created
        self._epoch_records: list[int] = []  # per started epoch, like _done_starts
        self._done_starts: list[set[int]] = []
        self._evaluation: _Evaluation | None = None
        self._last_eval_trigger = 0
        self._final_eval_started = False
        self._final_eval_done = settings.validation_records == 0
        self._export_todo: list[Task] = []
        self._export_pending = False  # a periodic export is queued or being written
        self._last_export_trigger = 0
        self._final_export_started = False
        self._final_export_done = not (settings.export and settings.trains)  # nothing trained, nothing to export
        self._exported: tuple[int, bool] | None = None  # (version, final) of the newest export done
        self._predict_todo: list[Task] = []
        self._prediction_version: int | None = None  # set when the prediction tasks are cut
        self._predicted: set[int] = set()  # first records of the prediction tasks reported
        self._export_failures: dict[int, int] = {}  # export task id -> attempts the output refused
        self._export_failure: ExportFailure | None = None
        self._metrics: dict[str, float] = {}
        self._metrics_version = -1
        self._evaluations = 0
        self._recent_losses: list[float] = []
        self.tasks_requeued = 0
        self.gradients_rejected = 0
        self._requeued_workers: set[str] = set()

    # ---- workers ask, report, beat -----------------------------------------------------------
    def get(self, worker: str, model_version: int, settled: int | None = None) -> Task | Wait | Finished:
        """The next task for ``worker``. ``settled``: the version every PS shard holds (None: they
        disagree or some did not answer); the final export is handed only on a settled model, so
        the caller need only find it while :attr:`awaiting_final_export` is true."""
        now = self._clock()
        self._last_seen[worker] = now
        for task_id, doing in list(self._doing.items()):
            if doing.worker == worker:  # the worker restarted and lost its task
                self._requeue(task_id)
        self._requeue_silent(now)
        self.on_version(model_version)
        task = None if self._export_failure is not None else self._next_task(model_version, settled)
        if task is None:
            return Finished.FINISHED if self.finished else Wait.WAIT
        self._doing[task.id] = _Doing(task, worker)
        return task

    def heartbeat(self, worker: str) -> None:
        self._last_seen[worker] = self._clock()

    def leave(self, worker: str) -> None:
        """``worker`` exits (finished, or stopped): its task goes back now, it stops counting as live."""
        for task_id, doing in list(self._doing.items()):
            if doing.worker == worker:
                self._requeue(task_id)
        self._last_seen.pop(worker, None)

    # ---- membership (sync rounds count these) ------------------------------------------------
    def live_workers(self) -> set[str]:
        """Workers heard from (task, report, heartbeat) within the task timeout, and not gone."""
        now = self._clock()
        return {w for w, seen in self._last_seen.items() if now - seen <= self._s.task_timeout}

    def can_train(self) -> set[str]:
        """Live workers that hold a training task or could get one: those a sync round may wait for."""
        live = self.live_workers()
        if self._todo or (self._s.trains and self._epoch + 1 < self._s.num_epochs):
            return live
        return {d.worker for d in self._doing.values() if d.task.kind is TaskKind.TRAINING and d.worker in live}

    def take_over_workers(self, old: TaskQueue) -> None:
        """This queue was restored to replace ``old``: the workers stay known as live, and task ids
        continue past every id ``old`` handed out (a late report of a lost task never matches)."""
        self._last_seen.update(old._last_seen)
        self._next_id = max(self._next_id, old._next_id)
        self.tasks_requeued += len(old._doing)
        self._requeued_workers |= {doing.worker for doing in old._doing.values()}

    def take_requeued_workers(self) -> set[str]:
        """The workers whose tasks went back to the queue since the last call (their open-round
        gradients must not count: those minibatches will be trained again)."""
        taken, self._requeued_workers = self._requeued_workers, set()
        return taken

    def report(
        self,
        worker: str,
        task_id: int,
        success: bool,
        loss_sum: float = 0.0,
        metric_sums: Mapping[str, float] | None = None,
        rejected: int = 0,
        model_version: int = 0,
        export_failed: bool = False,
        error: str = "",
        records: int | None = None,
    ) -> bool:
        """Records a task's result; False when the task is not (any more) this worker's.
        ``model_version``: an export's, the version it wrote. ``export_failed``: a failed export
        that the output refused (``error`` says how), counted towards ``export_attempts``.
        ``records``: what the worker says the task held, 0 (not said) or the task's own count;
        anything else raises :class:`ReportError` and changes nothing. ``rejected`` is added to a
        counter that saturates at :data:`MAX_COUNT`."""
        self._last_seen[worker] = self._clock()
        doing = self._doing.get(task_id)
        if doing is None or doing.worker != worker:
            return False
        if records is not None and records not in (0, doing.task.records):
            raise ReportError(f"records {records} != task {task_id}'s {doing.task.records}")
        self.gradients_rejected = _saturated(self.gradients_rejected + rejected)
        if not success:
            if export_failed and doing.task.kind is TaskKind.EXPORT:
                self._count_export_failure(doing.task, error)
            self._requeue(task_id)
            return True
        del self._doing[task_id]
        task = doing.task
        if task.kind is TaskKind.TRAINING:
            self._epoch_records[task.epoch] += task.records
            self._done_starts[task.epoch].add(task.start)
            self._recent_losses = (self._recent_losses + [loss_sum / max(1, task.records)])[-8:]
        elif task.kind is TaskKind.EXPORT:
            self._record_export(task, model_version)
        elif task.kind is TaskKind.PREDICTION:
            self._predicted.add(task.start)
        else:
            self._record_evaluation(task, metric_sums or {})
        return True

    # ---- what the job shows ------------------------------------------------------------------
    @property
    def training_done(self) -> bool:
        return sum(self._epoch_records) == self._s.num_records * self._s.num_epochs

    @property
    def finished(self) -> bool:
        return self.training_done and self._final_eval_done and self._final_export_done and self.prediction_done

    @property
    def prediction_done(self) -> bool:
        return self._records_predicted() == self._s.prediction_records

    def _records_predicted(self) -> int:
        size, total = self._s.records_per_task, self._s.prediction_records
        return sum(min(total, start + size) - start for start in self._predicted)

    @property
    def awaiting_final_export(self) -> bool:
        """Training and the final evaluation are done and the final export is still to hand out:
        the next :meth:`get` needs the ``settled`` version."""
        return (
            self._s.export
            and self._s.trains
            and not self._final_export_started
            and self.training_done
            and self._final_eval_done
            and self._evaluation is None
        )

    @property
    def awaiting_settled(self) -> bool:
        """The next :meth:`get` needs the ``settled`` version: for the final export, or to cut the
        prediction tasks of a job that trained."""
        return self.awaiting_final_export or (self._prediction_due and self._s.trains)

    @property
    def _prediction_due(self) -> bool:
        return (
            self._s.prediction_records > 0
            and self._prediction_version is None
            and self.training_done
            and self._final_eval_done
            and self._final_export_done
            and self._evaluation is None
        )

    def progress(self) -> Progress:
        loss = sum(self._recent_losses) / len(self._recent_losses) if self._recent_losses else float("nan")
        return Progress(
            finished=self.finished,
            epoch=max(0, self._epoch),
            records_done=sum(self._epoch_records),
            records_total=self._s.num_records * self._s.num_epochs,
            epoch_records=tuple(self._epoch_records),
            loss=loss,
            metrics=dict(self._metrics),
            metrics_version=self._metrics_version,
            tasks_requeued=self.tasks_requeued,
            gradients_rejected=self.gradients_rejected,
            export_version=-1 if self._exported is None else self._exported[0],
            export_final=self._exported is not None and self._exported[1],
            evaluations=self._evaluations,
            records_predicted=self._records_predicted(),
            prediction_records=self._s.prediction_records,
            export_failure=self._export_failure,
        )

    # ---- surviving a restart of PS 0 ---------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a restarted coordinator needs to go on: the done ledger, metrics and counters.

        Tasks in flight are not kept: after a restart they are simply not done, so they are handed
        out again (their workers' reports are refused as unknown).
        """
        return {
            "settings": [self._s.num_records, self._s.records_per_task, self._s.num_epochs],
            "epoch": self._epoch,
            "next_id": self._next_id,
            "done": [sorted(starts) for starts in self._done_starts],
            "metrics": dict(self._metrics),
            "metrics_version": self._metrics_version,
            "last_eval_trigger": self._last_eval_trigger,
            "final_eval_done": self._final_eval_done,
            "tasks_requeued": self.tasks_requeued,
            "gradients_rejected": self.gradients_rejected,
            "last_export_trigger": self._last_export_trigger,
            "final_export_done": self._final_export_done,
            "exported": None if self._exported is None else list(self._exported),
            "prediction_version": self._prediction_version,
            "predicted": sorted(self._predicted),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Takes over a saved :meth:`state`; raises ValueError if it belongs to other settings."""
        expected = [self._s.num_records, self._s.records_per_task, self._s.num_epochs]
        if list(state.get("settings", [])) != expected:
            raise ValueError(f"saved for data/settings {state.get('settings')}, now {expected}")
        epoch = int(state["epoch"])
        done = [set(int(start) for start in starts) for starts in state["done"]]
        # A ledger saved before it grew lazily has an (empty) entry for every epoch: kept readable.
        if epoch >= self._s.num_epochs or len(done) < epoch + 1 or any(done[epoch + 1 :]):
            raise ValueError("saved ledger does not match the number of epochs")
        done = done[: epoch + 1]
        self._epoch = epoch
        # Ids continue past the saved ones, so a late report of a lost task can never match a new one.
        self._next_id = int(state["next_id"])
        self._done_starts = done
        self._epoch_records = [0] * len(done)
        self._todo = []
        for e in range(epoch + 1):
            tasks = self._cut(self._s.num_records, TaskKind.TRAINING, epoch=e, version=0)
            self._epoch_records[e] = sum(t.records for t in tasks if t.start in done[e])
            self._todo.extend(t for t in tasks if t.start not in done[e])
        self._rng.shuffle(self._todo)
        self._metrics = {str(k): float(v) for k, v in state["metrics"].items()}
        self._metrics_version = int(state["metrics_version"])
        self._last_eval_trigger = int(state["last_eval_trigger"])
        self._final_eval_done = bool(state["final_eval_done"])
        self.tasks_requeued = _saturated(int(state["tasks_requeued"]))
        self.gradients_rejected = _saturated(int(state["gradients_rejected"]))
        # Ledgers saved before exports existed lack these keys: nothing was exported then.
        self._last_export_trigger = int(state.get("last_export_trigger", 0))
        self._final_export_done = bool(state.get("final_export_done", False)) or not (self._s.export and self._s.trains)
        exported = state.get("exported")
        self._exported = None if not exported else (int(exported[0]), bool(exported[1]))
        # Predictions: the tasks not reported are cut again, for the version they were cut for.
        version = state.get("prediction_version")
        self._prediction_version = None if version is None else int(version)
        self._predicted = {int(start) for start in state.get("predicted", [])}
        self._predict_todo = []
        if self._prediction_version is not None:
            self._cut_predictions(self._prediction_version)

    # ---- internals ---------------------------------------------------------------------------
    def on_version(self, model_version: int) -> None:
        """Starts an evaluation when the model crossed a multiple of ``evaluation_steps``, and queues
        an export when it crossed one of ``export_steps``."""
        self._on_version_export(model_version)
        steps = self._s.evaluation_steps
        if not steps or not self._s.validation_records or self._evaluation is not None:
            return
        if model_version // steps > self._last_eval_trigger // steps:
            self._last_eval_trigger = model_version
            self._start_evaluation(model_version)

    def _start_evaluation(self, version: int) -> None:
        tasks = self._cut(self._s.validation_records, TaskKind.EVALUATION, epoch=0, version=version)
        self._evaluation = _Evaluation(version=version, pending=len(tasks))
        self._eval_todo.extend(tasks)

    def _record_evaluation(self, task: Task, sums: Mapping[str, float]) -> None:
        evaluation = self._evaluation
        if evaluation is None:
            return
        evaluation.pending -= 1
        evaluation.records += task.records
        for name, value in sums.items():
            evaluation.sums[name] = evaluation.sums.get(name, 0.0) + value
        if evaluation.pending == 0:
            self._metrics = {n: v / max(1, evaluation.records) for n, v in evaluation.sums.items()}
            self._metrics_version = evaluation.version
            self._evaluations += 1
            self._evaluation = None
            if self._final_eval_started:
                self._final_eval_done = True

    def _on_version_export(self, model_version: int) -> None:
        steps = self._s.export_steps
        if not self._s.export or not steps or self._export_pending or self.training_done:
            return  # the final export covers the end of training
        if model_version // steps > self._last_export_trigger // steps:
            self._last_export_trigger = model_version
            self._export_pending = True
            self._export_todo.append(Task(self._next_id, TaskKind.EXPORT, 0, 0, max(0, self._epoch), model_version))
            self._next_id += 1

    def _record_export(self, task: Task, written: int) -> None:
        version = written if written > 0 else task.model_version
        if task.final:
            self._final_export_done = True
        else:
            self._export_pending = False
        if self._exported is None or task.final or not self._exported[1]:
            self._exported = (version, task.final)

    def _count_export_failure(self, task: Task, error: str) -> None:
        attempts = self._export_failures.get(task.id, 0) + 1
        self._export_failures[task.id] = attempts
        if attempts >= self._s.export_attempts:
            self._export_failure = ExportFailure(task.model_version, task.final, attempts, error)

    def _final_export(self, settled: int | None) -> Task | None:
        if not self.awaiting_final_export or settled is None:
            return None
        self._final_export_started = True
        task = Task(self._next_id, TaskKind.EXPORT, 0, 0, max(0, self._epoch), settled, final=True)
        self._next_id += 1
        return task

    def _start_prediction(self, settled: int | None) -> Task | None:
        """Cuts the prediction tasks once their turn came: after training, with the ``settled``
        version (the final export's when there was one: the model does not move any more)."""
        if not self._prediction_due:
            return None
        if self._s.trains:
            if settled is None:
                return None
            version = self._exported[0] if self._exported is not None and self._exported[1] else settled
        else:
            version = 0
        self._cut_predictions(version)
        return self._predict_todo.pop(0) if self._predict_todo else None

    def _cut_predictions(self, version: int) -> None:
        self._prediction_version = version
        tasks = self._cut(self._s.prediction_records, TaskKind.PREDICTION, epoch=0, version=version)
        self._predict_todo = [t for t in tasks if t.start not in self._predicted]

    def _next_task(self, model_version: int, settled: int | None = None) -> Task | None:
        if self._eval_todo:
            return self._eval_todo.pop(0)
        if self._export_todo:
            return self._export_todo.pop(0)
        if self._predict_todo:
            return self._predict_todo.pop(0)
        if not self._todo and self._epoch + 1 < self._s.num_epochs and self._s.trains:
            self._epoch += 1
            self._epoch_records.append(0)
            self._done_starts.append(set())
            tasks = self._cut(self._s.num_records, TaskKind.TRAINING, epoch=self._epoch, version=0)
            self._rng.shuffle(tasks)
            self._todo.extend(tasks)
        if self._todo:
            return self._todo.pop(0)
        if self.training_done and not self._final_eval_started and self._evaluation is None:
            if self._s.validation_records and self._metrics_version == model_version:
                self._final_eval_done = True  # the last periodic evaluation saw this very model
            elif self._s.validation_records:
                self._final_eval_started = True
                self._start_evaluation(model_version)
                return self._eval_todo.pop(0)
        return self._final_export(settled) or self._start_prediction(settled)

    def _cut(self, records: int, kind: TaskKind, epoch: int, version: int) -> list[Task]:
        tasks = []
        for start in range(0, records, self._s.records_per_task):
            end = min(records, start + self._s.records_per_task)
            tasks.append(Task(self._next_id, kind, start, end, epoch, version))
            self._next_id += 1
        return tasks

    def _requeue(self, task_id: int) -> None:
        doing = self._doing.pop(task_id)
        self._requeued_workers.add(doing.worker)
        queues = {
            TaskKind.TRAINING: self._todo,
            TaskKind.EVALUATION: self._eval_todo,
            TaskKind.EXPORT: self._export_todo,
            TaskKind.PREDICTION: self._predict_todo,
        }
        queues[doing.task.kind].insert(0, doing.task)
        self.tasks_requeued = _saturated(self.tasks_requeued + 1)

    def _requeue_silent(self, now: float) -> None:
        for task_id, doing in list(self._doing.items()):
            if now - self._last_seen.get(doing.worker, now) > self._s.task_timeout:
                self._requeue(task_id)

    def requeue_silent(self) -> None:
        """Called periodically, so a silent worker's task is freed even if nobody asks for work."""
        self._requeue_silent(self._clock())
