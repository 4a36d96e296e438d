"""PS 0's ``GetJobStatus`` reply as the planner reads it: pure.

Callers: both executors (the operator's ``probing`` through ``observing``, the local runner), each
asking PS 0's coordinator in its own way and handing the reply to :func:`job_progress`.
"""

from __future__ import annotations

import math

from elasticps.planning.observed import JobProgress
from elasticps.proto import elasticps_pb2 as pb


def job_progress(reply: pb.JobStatus) -> JobProgress:
    """The reply as :class:`JobProgress`; the training loss joins the metrics (NaN ones are left out)."""
    fraction = reply.records_done / reply.records_total if reply.records_total > 0 else 0.0
    metrics = {str(k): float(v) for k, v in reply.metrics.items() if math.isfinite(v)}
    if reply.records_done and math.isfinite(reply.loss):
        metrics.setdefault("loss", float(reply.loss))
    return JobProgress(
        finished=reply.finished,
        model_version=int(reply.model_version),
        progress=fraction,
        epoch=int(reply.epoch),
        metrics=metrics,
    )
