"""Dynamic data sharding: the queue's shared mechanics over the four kinds of task.

Called by the coordinator's engine under its lock. Failure rules, the same for every kind
(ElasticDL's training once hung for want of the second one):

* a worker that asks for a task while it still holds one has restarted: its task goes back to todo;
* a task whose worker has been silent (no heartbeat, no report) for ``task_timeout`` goes back to todo;
* a failed task goes back to todo.

Order: evaluation tasks first, then a periodic export, then prediction tasks, then training (an
epoch at a time, ``training.py``); after training the final evaluation (``evaluation.py``), the
final export of the version every shard holds (``export.py``; the caller passes that ``settled``
version to :meth:`TaskQueue.get`), then the prediction tasks (``prediction.py``). So every record
is trained exactly ``num_epochs`` times, and the job is finished when every training task of every
epoch, the final evaluation, the final export and every prediction task are done. Once the output
refused an export ``export_attempts`` times the queue hands out nothing more; the coordinator
reports it and the planner fails the job (reason ExportFailed). So too, under
``spec.training.failUnhealthy``, once the reported training loss says Diverged or Stalled
(``coordinator/health.py``): no final export of a useless model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticps.coordinator.tasks.base import (
    Finished, Ids, Progress, QueueSettings, ReportError, Task, TaskKind, Wait, saturated,
)  # fmt: skip
from elasticps.coordinator.health import FirstLoss, HealthWatch, Verdict
from elasticps.coordinator.tasks.evaluation import Evaluations
from elasticps.coordinator.tasks.export import Exports
from elasticps.coordinator.tasks.prediction import Predictions
from elasticps.coordinator.tasks.training import Training


@dataclass
class _Doing:
    task: Task
    worker: str
    applied: int = 0  # training: records of the task (from its start) in committed sync rounds


class TaskQueue:
    def __init__(self, settings: QueueSettings, clock: Callable[[], float]) -> None:
        if settings.num_records < 0 or settings.prediction_records < 0:
            raise ValueError("record counts cannot be negative")
        if settings.num_records == 0 and settings.prediction_records == 0:
            raise ValueError("the training data holds no records (and there is nothing to predict)")
        self._s = settings
        self._clock = clock
        self._ids = Ids(settings.records_per_task)
        self._training = Training(settings, self._ids)
        self._evaluations = Evaluations(settings, self._ids)
        self._exports = Exports(settings, self._ids)
        self._predictions = Predictions(settings, self._ids)
        self._health = HealthWatch(settings.stall_records)
        self._doing: dict[int, _Doing] = {}
        self._last_seen: dict[str, float] = {}
        self.tasks_requeued = 0
        self.gradients_rejected = 0
        self._requeued_workers: set[str] = set()
        # Sync: the tasks a round being committed brings forward (task id -> records from its start),
        # and those of them that went back to the queue meanwhile: they are cut once the round is
        # settled (:meth:`round_settled`), so a record is neither trained twice nor lost.
        self._committing: dict[int, int] = {}
        self._going_back: set[int] = set()

    # ---- workers ask, report, beat -----------------------------------------------------------
    def get(self, worker: str, model_version: int, settled: int | None = None) -> Task | Wait | Finished:
        """The next task for ``worker``. ``settled``: the version every PS shard holds (None: they
        disagree or some did not answer); the final export is handed only on a settled model, so
        the caller need only find it while :attr:`awaiting_settled` is true."""
        now = self._clock()
        self._last_seen[worker] = now
        for task_id, doing in list(self._doing.items()):
            if doing.worker == worker:  # the worker restarted and lost its task
                self._requeue(task_id)
        self._requeue_silent(now)
        self.on_version(model_version)
        task = None if self.halted else self._next_task(model_version, settled)
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
        if self._training.has_work:
            return live
        return {d.worker for d in self._doing.values() if d.task.kind is TaskKind.TRAINING and d.worker in live}

    def take_over_workers(self, old: TaskQueue) -> None:
        """This queue was restored to replace ``old``: the workers stay known as live, and task ids
        continue past every id ``old`` handed out (a late report of a lost task never matches)."""
        self._last_seen.update(old._last_seen)
        self._ids.next = max(self._ids.next, old._ids.next)
        self.tasks_requeued += len(old._doing)
        self._requeued_workers |= {doing.worker for doing in old._doing.values()}

    def holds(self, worker: str, task_id: int) -> bool:
        """Whether task ``task_id`` is ``worker``'s now (not done, not gone back to the queue)."""
        doing = self._doing.get(task_id)
        return doing is not None and doing.worker == worker and task_id not in self._going_back

    def advance(self, worker: str, task_id: int, records: int) -> tuple[int, int, int] | None:
        """Where ``worker``'s gradient that brings task ``task_id``'s records up to ``records``
        (from its start) leaves the task: its epoch, its key, its first record not applied; None
        for a task not (any more) the worker's."""
        doing = self._doing.get(task_id)
        if doing is None or doing.worker != worker or doing.task.kind is not TaskKind.TRAINING:
            return None
        task = doing.task
        records = min(max(records, doing.applied), task.records)
        self._committing[task_id] = records
        return task.epoch, task.key, task.start + records

    def round_settled(self, committed: bool) -> None:
        """The round whose tasks :meth:`advance` named was committed on every shard (their records
        count now) or aborted (they do not); tasks that went back meanwhile go back now."""
        committing, self._committing = self._committing, {}
        for task_id, records in committing.items():
            doing = self._doing.get(task_id)
            if committed and doing is not None:
                self.applied(doing.worker, task_id, records)
        going_back, self._going_back = self._going_back, set()
        for task_id in going_back:
            if task_id in self._doing:
                self._requeue(task_id)

    def rebuild(self, advances: Iterable[tuple[int, int, int, int]]) -> int:
        """Takes over a ledger rebuilt from a shard's copy (``advances``: epoch, key, first record
        not applied, task id per task the rounds brought forward; ``ps/applied.py``): the records
        applied count, the rest is handed out. The records applied; ValueError if the copy does
        not fit the data."""
        partial: list[dict[int, int]] = []
        last_id = 0
        for epoch, key, reached, task_id in advances:
            if not 0 <= epoch < self._s.num_epochs:
                raise ValueError(f"a task of epoch {epoch}, the job has {self._s.num_epochs}")
            partial += [{} for _ in range(epoch + 1 - len(partial))]
            partial[epoch][key] = reached
            last_id = max(last_id, task_id)
        if not partial:
            return 0
        keys = set(range(0, self._s.num_records, self._s.records_per_task))
        if any(key not in keys for epoch in partial for key in epoch):
            raise ValueError("the copy names tasks this data does not cut")
        self._ids.next = max(self._ids.next, last_id + 1)
        self._training.restore(len(partial) - 1, [set() for _ in partial], partial)
        return self._training.records_done

    def applied(self, worker: str, task_id: int, records: int) -> None:
        """A committed sync round applied ``worker``'s gradient that brought task ``task_id``'s
        records up to ``records`` (from its start): they count now, and the task goes back to the
        queue, if it does, only from there. Ignored for a task not (any more) the worker's."""
        doing = self._doing.get(task_id)
        if doing is None or doing.worker != worker or doing.task.kind is not TaskKind.TRAINING:
            return
        records = min(records, doing.task.records)
        if records > doing.applied:
            self._training.apply(doing.task, doing.applied, records)
            doing.applied = records

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
        nonfinite_steps: int = 0,
        first_loss: FirstLoss | None = None,
    ) -> bool:
        """Records a task's result; False when the task is not (any more) this worker's.
        ``model_version``: an export's, the version it wrote. ``export_failed``: a failed export
        that the output refused (``error`` says how), counted towards ``export_attempts``.
        ``nonfinite_steps``: training minibatches whose loss was not finite (the job is Diverged);
        ``first_loss``: the task's first finite minibatch loss and its version (``health.py``).
        ``records``: what the worker says the task held, 0 (not said) or the task's own count;
        anything else raises :class:`ReportError` and changes nothing. ``rejected`` is added to a
        counter that saturates at :data:`~elasticps.coordinator.tasks.base.MAX_COUNT`."""
        self._last_seen[worker] = self._clock()
        doing = self._doing.get(task_id)
        if doing is None or doing.worker != worker or task_id in self._going_back:
            return False
        if records is not None and records not in (0, doing.task.records):
            raise ReportError(f"records {records} != task {task_id}'s {doing.task.records}")
        self.gradients_rejected = saturated(self.gradients_rejected + rejected)
        if not success:
            if export_failed and doing.task.kind is TaskKind.EXPORT:
                self._exports.count_failure(doing.task, error)
            self._requeue(task_id)
            return True
        del self._doing[task_id]
        task = doing.task
        if task.kind is TaskKind.TRAINING:
            self._training.record(task, loss_sum, doing.applied)
            self._health.record(loss_sum / max(1, task.records), task.records, nonfinite_steps, first_loss)
        elif task.kind is TaskKind.EXPORT:
            self._exports.record(task, model_version)
        elif task.kind is TaskKind.PREDICTION:
            self._predictions.record(task)
        else:
            self._evaluations.record(task, metric_sums or {})
        return True

    # ---- what the job shows ------------------------------------------------------------------
    @property
    def training_done(self) -> bool:
        return self._training.done

    @property
    def finished(self) -> bool:
        return (
            self.training_done
            and self._evaluations.final_done
            and self._exports.final_done
            and self.prediction_done
        )

    @property
    def health(self) -> Verdict:
        return self._health.verdict()

    @property
    def halted(self) -> bool:
        """The queue hands out nothing more: an export failed every attempt, or the training is
        unhealthy in a job that asked to fail then (the coordinator reports why; the planner fails it)."""
        return self._exports.failure is not None or (self._s.fail_unhealthy and not self.health.healthy)

    @property
    def prediction_done(self) -> bool:
        return self._predictions.done

    @property
    def _evaluated(self) -> bool:
        """Training and the final evaluation are done, and no evaluation is running."""
        return self.training_done and self._evaluations.final_done and not self._evaluations.running

    @property
    def awaiting_final_export(self) -> bool:
        """Training and the final evaluation are done and the final export is still to hand out:
        the next :meth:`get` needs the ``settled`` version."""
        return self._exports.awaiting_final(self._evaluated)

    @property
    def awaiting_settled(self) -> bool:
        """The next :meth:`get` needs the ``settled`` version: for the final export, or to cut the
        prediction tasks of a job that trained."""
        return self.awaiting_final_export or (self._prediction_due and self._s.trains)

    @property
    def _prediction_due(self) -> bool:
        return self._predictions.due(self._evaluated and self._exports.final_done)

    def progress(self) -> Progress:
        exported = self._exports.exported
        return Progress(
            finished=self.finished,
            epoch=max(0, self._training.epoch),
            records_done=self._training.records_done,
            records_total=self._s.num_records * self._s.num_epochs,
            epoch_records=self._training.epoch_records,
            loss=self._training.loss,
            metrics=dict(self._evaluations.metrics),
            metrics_version=self._evaluations.metrics_version,
            tasks_requeued=self.tasks_requeued,
            gradients_rejected=self.gradients_rejected,
            export_version=-1 if exported is None else exported[0],
            export_final=exported is not None and exported[1],
            evaluations=self._evaluations.completed,
            records_predicted=self._predictions.records_predicted,
            prediction_records=self._s.prediction_records,
            export_failure=self._exports.failure,
            health=self.health,
            training_reports=self._training.reports,
        )

    # ---- surviving a restart of PS 0 ---------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a restarted coordinator needs to go on: the done ledger, metrics and counters.

        Tasks in flight are not kept: after a restart they are simply not done, so they are handed
        out again (their workers' reports are refused as unknown).
        """
        return {
            "settings": [self._s.num_records, self._s.records_per_task, self._s.num_epochs],
            **self._training.state(),
            "next_id": self._ids.next,
            **self._evaluations.state(),
            "tasks_requeued": self.tasks_requeued,
            "gradients_rejected": self.gradients_rejected,
            **self._exports.state(),
            **self._predictions.state(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Takes over a saved :meth:`state`; raises ValueError if it belongs to other settings."""
        expected = [self._s.num_records, self._s.records_per_task, self._s.num_epochs]
        if list(state.get("settings", [])) != expected:
            raise ValueError(f"saved for data/settings {state.get('settings')}, now {expected}")
        epoch, done, partial = self._training.parse(state)
        # Ids continue past the saved ones, so a late report of a lost task can never match a new one.
        self._ids.next = int(state["next_id"])
        self._training.restore(epoch, done, partial)
        self._evaluations.restore(state)
        self.tasks_requeued = saturated(int(state["tasks_requeued"]))
        self.gradients_rejected = saturated(int(state["gradients_rejected"]))
        self._exports.restore(state)
        self._predictions.restore(state)
        # The loss's first values are gone with the coordinator that saw them: a resumed job is
        # judged only for divergence (its loss now is no job's first values).
        self._health = HealthWatch(self._s.stall_records if self._training.records_done == 0 else 0)

    # ---- internals ---------------------------------------------------------------------------
    def on_version(self, model_version: int) -> None:
        """Starts an evaluation when the model crossed a multiple of ``evaluation_steps``, and queues
        an export when it crossed one of ``export_steps``."""
        self._exports.on_version(model_version, self.training_done, self._training.epoch)
        self._evaluations.on_version(model_version)

    def _next_task(self, model_version: int, settled: int | None = None) -> Task | None:
        for todo in (self._evaluations.todo, self._exports.todo, self._predictions.todo):
            if todo:
                return todo.pop(0)
        task = self._training.next() or self._evaluations.final(self.training_done, model_version)
        if task is not None:
            return task
        epoch = self._training.epoch
        return self._exports.final(self.awaiting_final_export, settled, epoch) or self._predictions.start(
            self._prediction_due, settled, self._exports.exported
        )

    def _todo(self, kind: TaskKind) -> list[Task]:
        if kind is TaskKind.TRAINING:
            return self._training.todo
        if kind is TaskKind.EVALUATION:
            return self._evaluations.todo
        if kind is TaskKind.EXPORT:
            return self._exports.todo
        return self._predictions.todo

    def _requeue(self, task_id: int) -> None:
        """The task goes back to the queue: the records of it that rounds applied stay applied, the
        rest is handed out again (as a new task id: the worker that held it hears it is void). A
        task a round being committed brings forward waits for the round's outcome."""
        if task_id in self._committing:
            self._going_back.add(task_id)
            return
        doing = self._doing.pop(task_id)
        self._requeued_workers.add(doing.worker)
        task: Task | None = doing.task
        if doing.task.kind is TaskKind.TRAINING and doing.applied > 0:
            task = self._training.resume(doing.task, doing.applied, self._ids.take())
        if task is not None:
            self._todo(task.kind).insert(0, task)
        self.tasks_requeued = saturated(self.tasks_requeued + 1)

    def _requeue_silent(self, now: float) -> None:
        for task_id, doing in list(self._doing.items()):
            if now - self._last_seen.get(doing.worker, now) > self._s.task_timeout:
                self._requeue(task_id)

    def requeue_silent(self) -> None:
        """Called periodically, so a silent worker's task is freed even if nobody asks for work."""
        self._requeue_silent(self._clock())
