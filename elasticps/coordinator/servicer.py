"""The Coordinator gRPC service (hosted by PS 0): a translator over :class:`TaskQueue`.

gRPC calls arrive on many threads; one lock serialises them over the pure queue. The model version
comes from PS 0's store through ``version_fn``, so evaluations follow the model's progress. With a
``journal`` path the queue's ledger is written there (atomically) after every report and read back
at start-up, so a restarted PS 0 goes on where it was instead of training every record again.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from elasticps.coordinator.tasks import Finished, QueueSettings, Task, TaskKind, TaskQueue, Wait
from elasticps.files import write_atomically
from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_KINDS = {TaskKind.TRAINING: pb.TASK_TYPE_TRAINING, TaskKind.EVALUATION: pb.TASK_TYPE_EVALUATION}


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    def __init__(
        self,
        settings: QueueSettings,
        version_fn: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        journal: Path | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._queue = TaskQueue(settings, clock)
        self._version_fn = version_fn
        self._settings = settings
        self._journal = journal
        if journal is not None and journal.exists():
            try:
                self._queue.restore(json.loads(journal.read_text()))
                log.info("coordinator resumes from %s", journal)
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("ignoring coordinator journal %s: %s", journal, err)

    def GetTask(self, request: pb.GetTaskRequest, context: grpc.ServicerContext) -> pb.Task:
        if not request.worker:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "GetTask: worker is required")
        with self._lock:
            got = self._queue.get(request.worker, self._version_fn())
        if isinstance(got, Task):
            return pb.Task(
                id=got.id,
                type=_KINDS[got.kind],
                start=got.start,
                end=got.end,
                epoch=got.epoch,
                model_version=got.model_version,
            )
        if got is Finished.FINISHED:
            return pb.Task(type=pb.TASK_TYPE_FINISHED)
        assert got is Wait.WAIT
        return pb.Task(type=pb.TASK_TYPE_WAIT)

    def ReportTask(self, request: pb.TaskResult, context: grpc.ServicerContext) -> pb.Ack:
        if not all(math.isfinite(v) for v in request.metric_sums.values()) or request.records < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ReportTask: metrics must be finite")
        with self._lock:
            self._queue.report(
                request.worker,
                request.task_id,
                request.success,
                loss_sum=request.loss_sum,
                metric_sums=dict(request.metric_sums),
                rejected=request.rejected,
            )
            self._write_journal()
        return pb.Ack()

    def _write_journal(self) -> None:
        if self._journal is None:
            return
        try:
            write_atomically(self._journal, json.dumps(self._queue.state()))
        except OSError as err:
            log.error("cannot write the coordinator journal %s: %s", self._journal, err)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.Ack:
        with self._lock:
            self._queue.heartbeat(request.worker)
        return pb.Ack()

    def GetJobStatus(self, request: pb.JobStatusRequest, context: grpc.ServicerContext) -> pb.JobStatus:
        with self._lock:
            self._queue.requeue_silent()
            progress = self._queue.progress()
        return pb.JobStatus(
            finished=progress.finished,
            epoch=progress.epoch,
            num_epochs=self._settings.num_epochs,
            records_done=progress.records_done,
            records_total=progress.records_total,
            model_version=self._version_fn(),
            loss=progress.loss,
            metrics=dict(progress.metrics),
            metrics_version=progress.metrics_version,
            tasks_requeued=progress.tasks_requeued,
            gradients_rejected=progress.gradients_rejected,
            epoch_records=list(progress.epoch_records),
        )
