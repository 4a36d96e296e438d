"""What every kind of task shares: the task itself, the queue's settings and reports, and the ids.

Pure values, plus :class:`Ids`: one counter for the whole queue, so a task id is never handed out
twice whatever its kind (a late report of a lost task can never match a new one), and the one way
a run of records is cut into tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from elasticps.coordinator.health import Verdict

class TaskKind(str, Enum):
    TRAINING = "training"
    EVALUATION = "evaluation"
    EXPORT = "export"
    PREDICTION = "prediction"


MAX_COUNT = (1 << 63) - 1  # counters saturate here: they travel as int64 in the job's status


def saturated(value: int) -> int:
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
    # Training: the first record of the task as it was cut, the ledger's key for it (-1: ``start``).
    # A task that went back to the queue after some of its records were applied is handed out
    # again from the first record not applied: ``start`` moves on, ``first`` stays.
    first: int = -1

    @property
    def records(self) -> int:
        return self.end - self.start

    @property
    def key(self) -> int:
        """The task's entry in the epoch's ledger: where it was cut."""
        return self.start if self.first < 0 else self.first


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
    stall_records: int = 0  # training health: records within which the loss must fall (0: never judged)
    fail_unhealthy: bool = False  # a Diverged or Stalled job gets no more tasks (the planner fails it)

    @property
    def trains(self) -> bool:
        """Whether the job trains (a job without training data only predicts, with an exported model)."""
        return self.num_records > 0
    export_attempts: int = 3  # an export the output refuses this many times fails the job


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
    health: Verdict = Verdict()  # what the training loss says (health.py)
    training_reports: int = 0  # training tasks reported done to this coordinator


class Ids:
    """The queue's task ids, one counter for every kind; ``next`` is saved with the ledger."""

    def __init__(self, records_per_task: int) -> None:
        self.next = 1
        self._per_task = records_per_task

    def take(self) -> int:
        taken = self.next
        self.next += 1
        return taken

    def cut(self, records: int, kind: TaskKind, epoch: int, version: int) -> list[Task]:
        """``records`` records as tasks of ``records_per_task`` (the last one shorter), in order."""
        tasks = []
        for start in range(0, records, self._per_task):
            end = min(records, start + self._per_task)
            tasks.append(Task(self.take(), kind, start, end, epoch, version))
        return tasks
