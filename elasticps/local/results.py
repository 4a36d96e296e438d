"""What ``elasticps run`` reports when a job ends: the result, its summary line, its JSON.

Callers: the local runner builds a :class:`RunResult` on success (the coordinator's last answer,
the learning curve it recorded, the restarts the planner counted); ``elasticps run`` prints
:func:`summary` and writes :func:`outcome` to ``--result_file``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from elasticps.api.spec import TrainingJob
from elasticps.local.progress import describe
from elasticps.proto import elasticps_pb2 as pb


class JobFailed(Exception):
    """The job cannot finish; the message says why."""


@dataclass(frozen=True)
class Evaluation:
    elapsed_s: float  # since the runner started
    version: int  # the model version evaluated
    records_done: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class RunResult:
    status: pb.JobStatus
    elapsed_s: float
    restarts: int
    history: tuple[Evaluation, ...] = ()


def summary(job: TrainingJob, result: RunResult) -> str:
    """What ``elasticps run`` prints last; a job with ``spec.output`` ends with where its model is,
    a job with ``spec.prediction`` with how many predictions were written where."""
    status = result.status
    predicted = (
        f"\n  {status.records_predicted} predictions written to {status.predictions_path}"
        if status.predictions_path
        else ""
    )
    if status.records_total == 0:  # nothing trained: the job predicted with an exported model
        return (
            f"job {job.name} succeeded in {result.elapsed_s:.1f} s: predicted with {job.spec.prediction.model},"
            f" {status.tasks_requeued} tasks requeued, {result.restarts} replicas replaced{predicted}"
        )
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in sorted(status.metrics.items()))
    loss = "" if math.isnan(status.loss) else f", training loss {status.loss:.4f}"
    exported = f"\n  model version {status.export_version} exported to {status.export_path}" if status.export_path else ""
    # A job whose loss said it does not learn still ends, but not as if all were well.
    health = f"\n  warning: {status.health}: {status.health_message}" if status.health else ""
    return (
        f"job {job.name} succeeded in {result.elapsed_s:.1f} s: {metrics or 'no evaluation'}"
        f" (model version {status.metrics_version}){loss}{health}\n"
        f"  {status.records_done}/{status.records_total} records trained over {status.num_epochs} epochs"
        f" ({', '.join(str(n) for n in status.epoch_records)} per epoch), model version {status.model_version},"
        f" {status.tasks_requeued} tasks requeued, {status.gradients_rejected} gradients rejected,"
        f" {result.restarts} replicas replaced\n  {describe(status)}{exported}{predicted}"
    )


def staleness_buckets(status: pb.JobStatus) -> list[list[int | None]]:
    """PS 0's gradient staleness as ``[lowest, highest, pushes]`` per bucket (``highest`` None for
    the open last bucket), from the status's cumulative counts; staleness is a whole number."""
    buckets: list[list[int | None]] = []
    below, lowest = 0, 0
    for bound, cumulative in zip(status.staleness_bounds, status.staleness_pushes):
        highest = None if math.isinf(bound) else int(bound)
        buckets.append([lowest, highest, cumulative - below])
        below = cumulative
        lowest = (highest if highest is not None else lowest) + 1
    return buckets


def outcome(result: RunResult) -> dict[str, object]:
    """The result as plain data (``elasticps run --result_file``)."""
    status = result.status
    return {
        "succeeded": True,
        "elapsed_s": round(result.elapsed_s, 2),
        "restarts": result.restarts,
        "records_done": status.records_done,
        "records_total": status.records_total,
        "epoch_records": list(status.epoch_records),
        "model_version": status.model_version,
        "shard_versions": list(status.shard_versions),
        "shard_bytes_received": list(status.shard_bytes_received),
        "shard_bytes_sent": list(status.shard_bytes_sent),
        "shard_embedding_rows": list(status.shard_embedding_rows),
        "shard_embedding_rows_made": list(status.shard_embedding_rows_made),
        "shard_embedding_rows_evicted": list(status.shard_embedding_rows_evicted),
        "local_steps": status.local_steps,
        "staleness": staleness_buckets(status),
        "metrics": dict(status.metrics),
        "metrics_version": status.metrics_version,
        "tasks_requeued": status.tasks_requeued,
        "gradients_rejected": status.gradients_rejected,
        "history": [asdict(evaluation) for evaluation in result.history],
        "export_path": status.export_path,  # "": the job has no spec.output
        "export_version": status.export_version if status.export_path else -1,
        "records_predicted": status.records_predicted,
        "predictions_path": status.predictions_path,  # "": the job does not predict
        # What the training loss says: "" (it learns), "Diverged" or "Stalled", and why.
        "health": status.health,
        "health_message": status.health_message,
    }
