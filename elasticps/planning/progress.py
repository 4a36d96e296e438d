"""PS 0's ``GetJobStatus`` reply as the planner reads it, and what it means for a job: pure.

Callers: both executors (the operator's ``probing`` through ``observing``, the local runner), each
asking PS 0's coordinator in its own way and handing the reply to :func:`job_progress`, the one
place that reads the wire format; the planner's ``reporting`` (``status.gradsToWait``) and
``training`` (condition GradsToWaitClamped) read a sync job's rounds through :func:`sync_rounds`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from elasticps.api.modes import TrainingMode
from elasticps.api.spec import TrainingJob
from elasticps.planning.observed import JobProgress
from elasticps.proto import elasticps_pb2 as pb


def job_progress(reply: pb.JobStatus) -> JobProgress:
    """The reply as :class:`JobProgress`; the training loss joins the metrics (NaN ones are left out).
    A coordinator that predates a field leaves it at its zero value, which reads as "not known"."""
    # Training, then prediction: one fraction over both (a job that only predicts has no training records).
    done, total = reply.records_done + reply.records_predicted, reply.records_total + reply.prediction_records
    fraction = done / total if total > 0 else 0.0
    metrics = {str(k): float(v) for k, v in reply.metrics.items() if math.isfinite(v)}
    if reply.records_done and math.isfinite(reply.loss):
        metrics.setdefault("loss", float(reply.loss))
    return JobProgress(
        finished=reply.finished,
        model_version=int(reply.model_version),
        progress=fraction,
        epoch=int(reply.epoch),
        metrics=metrics,
        shard_versions=tuple(int(v) for v in reply.shard_versions),
        live_workers=max(0, int(reply.live_workers)),
        grads_to_wait=max(0, int(reply.grads_to_wait)),
        shard_problem=reply.shard_problem.strip(),
        export_path=reply.export_path,
        export_version=int(reply.export_version) if reply.export_path else -1,
        export_final=reply.export_final and bool(reply.export_path),
        records_predicted=int(reply.records_predicted),
        prediction_records=int(reply.prediction_records),
        predictions_path=reply.predictions_path,
        export_error=reply.export_error.strip(),
        iterations=(int(reply.min_iteration), int(reply.max_iteration)) if 0 <= reply.min_iteration <= reply.max_iteration else None,
        health=reply.health.strip(),
        health_message=reply.health_message.strip(),
        last_rollback=reply.last_rollback.strip(),
        checkpoint_failure=reply.checkpoint_failure.strip(),
        unrecoverable=reply.unrecoverable.strip(),
    )


@dataclass(frozen=True)
class SyncRounds:
    """A sync job's rounds as the coordinator's reply shows them.

    ``requested``: ``spec.training.gradsToWait`` (0: one gradient per worker). ``averaged``: the
    gradients a round averages now (``status.gradsToWait``). ``live_workers``: the workers the
    coordinator heard from (0: not known).
    """

    requested: int
    averaged: int
    live_workers: int

    @property
    def clamped(self) -> bool:
        """A round cannot wait for more gradients than there are live workers to send them: an
        explicit ``gradsToWait`` above the live workers is cut down to them."""
        return 0 < self.live_workers < self.requested


def sync_rounds(job: TrainingJob, progress: JobProgress) -> SyncRounds | None:
    """The job's sync rounds (None for an async job, and a job without PS). ``averaged`` is the
    coordinator's number when it gives one, else the spec's (``TrainingJob.grads_to_wait``) cut
    down to the live workers."""
    if not job.uses_ps or not TrainingMode.of(job.spec.training).rounds:
        return None
    live = progress.live_workers
    if progress.grads_to_wait > 0:
        averaged = progress.grads_to_wait
    else:
        averaged = min(job.grads_to_wait, live) if live > 0 else job.grads_to_wait
    return SyncRounds(requested=job.spec.training.grads_to_wait, averaged=averaged, live_workers=live)
