"""The coordinator's client, used by workers (tasks, reports, heartbeats) and the local runner (status).

Transient failures (PS 0 starting or restarting) are retried with backoff until ``deadline_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc
from elasticps.rpc.channels import create_channel
from elasticps.rpc.status import retrying


class CoordinatorClient:
    def __init__(
        self,
        address: str,
        worker: str = "",
        deadline_s: float = 120.0,
        timeout_s: float = 30.0,
        interceptors: Sequence[grpc.Interceptor] = (),
        iteration_fn: Callable[[], int] | None = None,
        token: str | None = None,
    ) -> None:
        """``interceptors``: as for ``PSClient``, gRPC client interceptors every call goes through.
        ``iteration_fn``: a decentralized worker's iteration, sent with every heartbeat. ``token``:
        the caller's identity in the job (None: this process's, ``identity.own_token``)."""
        self.worker = worker
        self.token = token
        self._iteration_fn = iteration_fn
        self._channel = create_channel(address, token)
        self._stub = pb_grpc.CoordinatorStub(grpc.intercept_channel(self._channel, *interceptors))
        self._deadline_s = deadline_s
        self._timeout_s = timeout_s

    def get_task(self) -> pb.Task:
        request = pb.GetTaskRequest(worker=self.worker)
        task: pb.Task = retrying(
            lambda: self._stub.GetTask(request, timeout=self._timeout_s), what="GetTask", deadline_s=self._deadline_s
        )
        return task

    def report(self, result: pb.TaskResult) -> None:
        result.worker = self.worker
        retrying(
            lambda: self._stub.ReportTask(result, timeout=self._timeout_s), what="ReportTask", deadline_s=self._deadline_s
        )

    def heartbeat(self) -> None:
        iteration = self._iteration_fn() if self._iteration_fn is not None else 0
        self._stub.Heartbeat(pb.HeartbeatRequest(worker=self.worker, iteration=iteration), timeout=5.0)

    def leave(self) -> None:
        """Tells the coordinator this worker exits now, so sync rounds stop waiting for it (one try)."""
        self._stub.Heartbeat(pb.HeartbeatRequest(worker=self.worker, leaving=True), timeout=2.0)

    def join_round(
        self, version: int, wait_ms: int, local_steps: int = 0, loss: float = 0.0, learning_rate: float = 0.0,
        task_id: int = 0, task_records: int = 0,
    ) -> pb.JoinReply:
        """Sync: counts this worker's staged gradient (computed on ``version``) in the open round.
        LocalSGD: the staged model delta, trained over a period of ``local_steps`` steps at mean
        ``loss`` and ``learning_rate``; a COMMITTED reply names the next period's steps. ``task_id``,
        ``task_records``: the training task and its records the gradient brings in (VOID: the task
        is no longer this worker's)."""
        request = pb.JoinRequest(
            worker=self.worker,
            version=version,
            wait_ms=wait_ms,
            local_steps=local_steps,
            loss=loss,
            learning_rate=learning_rate,
            task_id=task_id,
            task_records=task_records,
        )
        timeout = self._timeout_s + wait_ms / 1000
        reply: pb.JoinReply = retrying(
            lambda: self._stub.JoinRound(request, timeout=timeout), what="JoinRound", deadline_s=self._deadline_s
        )
        return reply

    def status(self, timeout_s: float = 5.0) -> pb.JobStatus:
        reply: pb.JobStatus = self._stub.GetJobStatus(pb.JobStatusRequest(), timeout=timeout_s)
        return reply

    def close(self) -> None:
        self._channel.close()



