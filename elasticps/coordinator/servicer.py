"""The Coordinator gRPC service: a thin face over the engine (``engine.py``).

Each method checks its request at the edge (``requests.py``: INVALID_ARGUMENT naming the field),
decodes it into the engine's plain values, calls the engine and encodes its answer; engine
refusals become status codes (UNAVAILABLE until a sync coordinator is ready, INVALID_ARGUMENT for
a report that contradicts its task). Served by the PS process's asyncio server (``rpc/serving.py``):
the unary calls run in its work pool; ``JoinRound`` waits on the event loop, holding no thread, and
waiting joins are bounded by ``--max_long_polls`` (RESOURCE_EXHAUSTED past it). The same joins
also come over PS 0's bulk channel (``bulk.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from grpc import aio

from elasticps.coordinator import joins, requests
from elasticps.coordinator.engine import Coordinator, JobView, Report
from elasticps.coordinator.health import FirstLoss
from elasticps.coordinator.syncing import CommitFailed
from elasticps.coordinator.tasks.base import Finished, ReportError, Task, TaskKind, Wait
from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc
from elasticps.rpc import edges
from elasticps.rpc.limits import ServerLimits, Slots
from elasticps.rpc.receiving import Refused
from elasticps.rpc.serving import AsyncServer

R = TypeVar("R")
Context = aio.ServicerContext[Any, Any]

_KINDS = {
    TaskKind.TRAINING: pb.TASK_TYPE_TRAINING,
    TaskKind.EVALUATION: pb.TASK_TYPE_EVALUATION,
    TaskKind.EXPORT: pb.TASK_TYPE_EXPORT,
    TaskKind.PREDICTION: pb.TASK_TYPE_PREDICTION,
}


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    def __init__(self, engine: Coordinator, limits: ServerLimits = ServerLimits()) -> None:
        self.engine = engine
        self._polls = Slots("waiting joins", limits.max_long_polls, "--max_long_polls")

    @property
    def waiting_joins(self) -> int:
        """Joins waiting for their round over gRPC now (metrics; tests)."""
        return self._polls.in_use

    def _require_ready(self, context: grpc.ServicerContext) -> None:
        if not self.engine.ready:
            context.abort(grpc.StatusCode.UNAVAILABLE, joins.NOT_READY)

    def GetTask(self, request: pb.GetTaskRequest, context: grpc.ServicerContext) -> pb.Task:
        _checked(requests.check_get_task, request, context)
        self._require_ready(context)
        got = self.engine.get_task(request.worker)
        if isinstance(got, Task):
            return pb.Task(
                id=got.id,
                type=_KINDS[got.kind],
                start=got.start,
                end=got.end,
                epoch=got.epoch,
                model_version=got.model_version,
                final=got.final,
            )
        if got is Finished.FINISHED:
            return pb.Task(type=pb.TASK_TYPE_FINISHED)
        assert got is Wait.WAIT
        return pb.Task(type=pb.TASK_TYPE_WAIT)

    def ReportTask(self, request: pb.TaskResult, context: grpc.ServicerContext) -> pb.Ack:
        _checked(requests.check_report, request, context)
        self._require_ready(context)
        report = Report(
            worker=request.worker,
            task_id=request.task_id,
            success=request.success,
            loss_sum=request.loss_sum,
            metric_sums=dict(request.metric_sums),
            rejected=request.rejected,
            model_version=request.model_version,
            export_failed=request.export_failed,
            error=requests.error_text(request.error),
            records=request.records,
            nonfinite_steps=request.nonfinite_steps,
            first_loss=FirstLoss(request.first_loss, request.first_loss_version) if request.HasField("first_loss") else None,
        )
        try:
            self.engine.report(report)
        except ReportError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ReportTask: {err}")
        return pb.Ack()

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.Ack:
        _checked(requests.check_heartbeat, request, context)
        if request.leaving:
            self.engine.leave(request.worker)
        else:
            self.engine.heartbeat(request.worker, request.iteration)
        return pb.Ack()

    async def JoinRound(self, request: pb.JoinRequest, context: Context) -> pb.JoinReply:
        """Admits the worker's staged gradient into the open round and waits (on the event loop)
        until that round is committed, the gradient is refused, or ``wait_ms`` passes (PENDING: the
        worker asks again)."""
        try:
            join = joins.decode(self.engine, request)
        except Refused as refused:
            await context.abort(refused.code, refused.message)
        try:
            if request.wait_ms <= 0:
                return joins.encode(await self.engine.join_async(join, 0))
            async with self._polls.taking(context, "JoinRound"):
                return joins.encode(await self.engine.join_async(join, request.wait_ms))
        except CommitFailed as err:
            failed = joins.not_committed(err)
        await context.abort(failed.code, failed.message)

    def GetJobStatus(self, request: pb.JobStatusRequest, context: grpc.ServicerContext) -> pb.JobStatus:
        return _encode_status(self.engine.status())


def _encode_status(view: JobView) -> pb.JobStatus:
    progress = view.progress
    return pb.JobStatus(
        finished=progress.finished,
        epoch=progress.epoch,
        num_epochs=view.num_epochs,
        records_done=progress.records_done,
        records_total=progress.records_total,
        model_version=view.model_version,
        loss=progress.loss,
        metrics=dict(progress.metrics),
        metrics_version=progress.metrics_version,
        tasks_requeued=progress.tasks_requeued,
        gradients_rejected=progress.gradients_rejected,
        epoch_records=list(progress.epoch_records),
        shard_versions=view.shard_versions,
        shard_bytes_received=view.shard_bytes_received,
        shard_bytes_sent=view.shard_bytes_sent,
        shard_embedding_rows=[held for held, _, _ in view.shard_rows],
        shard_embedding_rows_made=[made for _, made, _ in view.shard_rows],
        shard_embedding_rows_evicted=[evicted for _, _, evicted in view.shard_rows],
        local_steps=view.local_steps,
        staleness_bounds=[bound for bound, _ in view.staleness],
        staleness_pushes=[int(count) for _, count in view.staleness],
        live_workers=view.live_workers,
        grads_to_wait=view.grads_to_wait,
        shard_problem=view.shard_problem,
        export_path=view.export_path,
        export_version=progress.export_version,
        export_final=progress.export_final,
        records_predicted=progress.records_predicted,
        prediction_records=progress.prediction_records,
        predictions_path=view.predictions_path,
        export_error=view.export_error,
        min_iteration=view.min_iteration,
        max_iteration=view.max_iteration,
        health=progress.health.health.value,
        health_message=progress.health.message,
        rollbacks=view.rollbacks,
        last_rollback=view.last_rollback,
        checkpoint_failure=view.checkpoint_failure,
        unrecoverable=view.unrecoverable,
    )


def _checked(check: Callable[[R], None], request: R, context: grpc.ServicerContext) -> None:
    try:
        check(request)
    except requests.RequestError as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


def add_to_server(servicer: CoordinatorServicer, server: AsyncServer) -> None:
    """Registers the service, every method unary: a request that does not parse is answered
    INVALID_ARGUMENT and logged as one rate-limited line (``rpc/edges.py``). ``JoinRound`` is a
    coroutine; the other methods are plain functions, which the server runs in its work pool."""
    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    handlers = {}
    for method in service.methods:
        request_type = getattr(pb, method.input_type.name)
        reply_type = getattr(pb, method.output_type.name)
        handlers[method.name] = edges.unary_unary(
            getattr(servicer, method.name), method.name, request_type.FromString, reply_type.SerializeToString
        )
    server.add_service(service.full_name, handlers)
