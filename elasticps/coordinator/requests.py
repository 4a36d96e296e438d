"""The coordinator's requests, checked at the edge: every field a worker sends, before the queue sees it.

Pure; called by the coordinator's faces (``servicer.py``, ``joins.py``) first thing in every method, which turn
a :class:`RequestError` into INVALID_ARGUMENT with its message (it names the field). What passes
here cannot break a later call: every number that is summed into the job's status is bounded, so
no sum overflows an int64 or a double (``tasks/queue.py`` also saturates its counters at
:data:`~elasticps.coordinator.tasks.base.MAX_COUNT`, for a ledger read back from a journal). The rules:

* ``worker``: required, at most :data:`MAX_NAME` characters (a pod name is at most 253);
* ``task_id`` >= 0; ``model_version`` >= 0; ``records`` in [0, :data:`MAX_RECORDS`] (the queue
  then requires 0 or the task's own record count);
* ``rejected`` in [0, :data:`MAX_REJECTED`] per report;
* ``loss_sum`` and every ``metric_sums`` value finite with a magnitude of at most :data:`MAX_SUM`
  (a sum of per-record values: 1e200 leaves room to add up any number of tasks); at most
  :data:`MAX_METRICS` metrics, each named, names at most :data:`MAX_NAME` characters;
* ``error``: kept, cut to :data:`MAX_ERROR` characters (a diagnosis, never refused);
* JoinRound: ``version`` >= 0, ``wait_ms`` >= 0 (capped by the servicer); LocalSGD's period:
  ``local_steps`` >= 0, ``loss`` finite with a magnitude of at most :data:`MAX_SUM`,
  ``learning_rate`` finite and >= 0.
"""

from __future__ import annotations

import math

from elasticps.proto import elasticps_pb2 as pb

MAX_NAME = 256
MAX_ERROR = 4096
MAX_RECORDS = 1 << 53  # records of one task: as many as a double counts exactly
MAX_REJECTED = 1 << 31  # gradients one task's worker saw refused
MAX_SUM = 1e200
MAX_METRICS = 64


class RequestError(ValueError):
    """A request field out of its range; the message names the method and the field."""


def _worker(method: str, worker: str) -> None:
    if not worker:
        raise RequestError(f"{method}: worker is required")
    if len(worker) > MAX_NAME:
        raise RequestError(f"{method}: worker is {len(worker)} characters long, at most {MAX_NAME}")


def _bounded_sum(method: str, field: str, value: float) -> None:
    if not math.isfinite(value):
        raise RequestError(f"{method}: {field} must be finite, got {value!r}")
    if abs(value) > MAX_SUM:
        raise RequestError(f"{method}: {field} {value!r} is out of range (|value| <= {MAX_SUM:g})")


def _in_range(method: str, field: str, value: int, high: int | None = None) -> None:
    if value < 0:
        raise RequestError(f"{method}: {field} must be >= 0, got {value}")
    if high is not None and value > high:
        raise RequestError(f"{method}: {field} {value} is out of range (at most {high})")


def check_get_task(request: pb.GetTaskRequest) -> None:
    _worker("GetTask", request.worker)


def check_heartbeat(request: pb.HeartbeatRequest) -> None:
    _worker("Heartbeat", request.worker)
    _in_range("Heartbeat", "iteration", request.iteration)


def check_join(request: pb.JoinRequest) -> None:
    _worker("JoinRound", request.worker)
    _in_range("JoinRound", "version", request.version)
    _in_range("JoinRound", "wait_ms", request.wait_ms)
    _in_range("JoinRound", "local_steps", request.local_steps)
    _in_range("JoinRound", "task_id", request.task_id)
    _in_range("JoinRound", "task_records", request.task_records, MAX_RECORDS)
    _bounded_sum("JoinRound", "loss", request.loss)
    _bounded_sum("JoinRound", "learning_rate", request.learning_rate)
    if request.learning_rate < 0:
        raise RequestError(f"JoinRound: learning_rate must be >= 0, got {request.learning_rate!r}")


def check_report(request: pb.TaskResult) -> None:
    method = "ReportTask"
    _worker(method, request.worker)
    _in_range(method, "task_id", request.task_id)
    _in_range(method, "records", request.records, MAX_RECORDS)
    _in_range(method, "rejected", request.rejected, MAX_REJECTED)
    _in_range(method, "model_version", request.model_version)
    _bounded_sum(method, "loss_sum", request.loss_sum)
    _in_range(method, "nonfinite_steps", request.nonfinite_steps, MAX_RECORDS)
    _bounded_sum(method, "first_loss", request.first_loss)
    _in_range(method, "first_loss_version", request.first_loss_version)
    if len(request.metric_sums) > MAX_METRICS:
        raise RequestError(f"{method}: {len(request.metric_sums)} metric_sums, at most {MAX_METRICS}")
    for name, value in request.metric_sums.items():
        if not name or len(name) > MAX_NAME:
            raise RequestError(f"{method}: a metric_sums name must have 1 to {MAX_NAME} characters")
        _bounded_sum(method, f"metric_sums[{name!r}]", value)


def error_text(error: str) -> str:
    """A report's ``error``, cut to :data:`MAX_ERROR` characters."""
    return error if len(error) <= MAX_ERROR else error[: MAX_ERROR - 3] + "..."
