"""The coordinator over real gRPC: CoordinatorServicer in an in-process server, CoordinatorClient."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import grpc
import pytest

from elasticps.coordinator.client import CoordinatorClient
from elasticps.coordinator.engine import Coordinator as Engine
from elasticps.coordinator.servicer import CoordinatorServicer
from elasticps.coordinator.servicer import add_to_server as add_coordinator
from elasticps.coordinator.tasks.base import QueueSettings
from elasticps.proto import elasticps_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Coordinator:
    def __init__(self, start: Callable[..., int], settings: QueueSettings) -> None:
        self.version = 0
        self.clock = Clock()
        servicer = CoordinatorServicer(Engine(settings, version_fn=lambda: self.version, clock=self.clock))
        self.address = f"127.0.0.1:{start(lambda s: add_coordinator(servicer, s))}"
        self.clients: list[CoordinatorClient] = []

    def client(self, worker: str) -> CoordinatorClient:
        client = CoordinatorClient(self.address, worker=worker, deadline_s=30.0, timeout_s=30.0)
        self.clients.append(client)
        return client


@pytest.fixture
def make_coordinator(grpc_servers: Callable[..., int]) -> Iterator[Callable[..., Coordinator]]:
    made: list[Coordinator] = []

    def make(**settings: object) -> Coordinator:
        base: dict[str, object] = {"num_records": 40, "records_per_task": 10, "num_epochs": 1}
        base.update(settings)
        coordinator = Coordinator(grpc_servers, QueueSettings(**base))  # type: ignore[arg-type]
        made.append(coordinator)
        return coordinator

    yield make
    for coordinator in made:
        for client in coordinator.clients:
            client.close()


def test_a_whole_job_through_grpc(make_coordinator: Callable[..., Coordinator]) -> None:
    c = make_coordinator(num_records=40, records_per_task=10, num_epochs=2, validation_records=20)
    w1, w2 = c.client("w1"), c.client("w2")
    status = w1.status()
    assert (status.finished, status.records_total, status.records_done, status.num_epochs) == (False, 80, 0, 2)
    assert math.isnan(status.loss)
    assert status.metrics_version == -1

    trained: list[tuple[int, int, int]] = []
    for i in range(8):
        client = (w1, w2)[i % 2]
        task = client.get_task()
        assert task.type == pb.TASK_TYPE_TRAINING
        assert task.end - task.start == 10
        trained.append((task.epoch, task.start, task.end))
        client.report(pb.TaskResult(task_id=task.id, success=True, records=10, loss_sum=5.0, rejected=1))
        c.version += 1
    assert sorted(trained) == [(e, s, s + 10) for e in (0, 1) for s in (0, 10, 20, 30)]

    status = w2.status()
    assert status.records_done == 80
    assert list(status.epoch_records) == [40, 40]
    assert status.epoch == 1
    assert status.model_version == 8
    assert status.loss == 0.5
    assert status.gradients_rejected == 8
    assert status.finished is False  # the final evaluation is still to come

    evaluations = [w1.get_task(), w2.get_task()]
    assert [t.type for t in evaluations] == [pb.TASK_TYPE_EVALUATION] * 2
    assert {t.model_version for t in evaluations} == {8}
    assert c.client("w3").get_task().type == pb.TASK_TYPE_WAIT
    for client, task, accuracy in zip((w1, w2), evaluations, (0.5, 1.0)):
        client.report(
            pb.TaskResult(task_id=task.id, success=True, records=10, metric_sums={"accuracy": accuracy * 10})
        )
    status = w1.status()
    assert status.finished is True
    assert dict(status.metrics) == {"accuracy": 0.75}
    assert status.metrics_version == 8
    assert w1.get_task().type == pb.TASK_TYPE_FINISHED


def test_task_fields_travel(make_coordinator: Callable[..., Coordinator]) -> None:
    c = make_coordinator(num_records=25, records_per_task=10)
    tasks = [c.client(f"w{i}").get_task() for i in range(3)]
    assert sorted((t.start, t.end) for t in tasks) == [(0, 10), (10, 20), (20, 25)]
    assert len({t.id for t in tasks}) == 3
    assert all(t.id > 0 and t.epoch == 0 for t in tasks)


def test_restarted_worker_gets_its_task_back(make_coordinator: Callable[..., Coordinator]) -> None:
    c = make_coordinator()
    first = c.client("w1").get_task()
    again = c.client("w1").get_task()  # a new process with the same worker name
    assert again == first
    assert c.client("w9").status().tasks_requeued == 1


def test_silent_worker_is_requeued_by_the_status_poll(make_coordinator: Callable[..., Coordinator]) -> None:
    c = make_coordinator(task_timeout=30.0)
    silent = c.client("silent")
    held = silent.get_task()
    other = c.client("w2")
    c.clock.now += 20.0
    silent.heartbeat()
    c.clock.now += 20.0  # 20 s since the heartbeat: still fine
    assert other.status().tasks_requeued == 0
    c.clock.now += 11.0  # 31 s
    assert other.status().tasks_requeued == 1
    task = other.get_task()
    assert task == held


def test_failed_report_requeues(make_coordinator: Callable[..., Coordinator]) -> None:
    c = make_coordinator()
    w1 = c.client("w1")
    task = w1.get_task()
    w1.report(pb.TaskResult(task_id=task.id, success=False, error="worker crashed"))
    assert c.client("w2").get_task() == task


def test_nan_metric_is_invalid_argument(make_coordinator: Callable[..., Coordinator]) -> None:
    c = make_coordinator(validation_records=10, evaluation_steps=1)
    client = c.client("w1")
    c.version = 1
    task = client.get_task()
    assert task.type == pb.TASK_TYPE_EVALUATION
    for bad in (math.nan, math.inf):
        with pytest.raises(grpc.RpcError) as raised:
            client.report(pb.TaskResult(task_id=task.id, success=True, records=10, metric_sums={"accuracy": bad}))
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    status = client.status()
    assert dict(status.metrics) == {}
    # The task is still this worker's: a good report is taken.
    client.report(pb.TaskResult(task_id=task.id, success=True, records=10, metric_sums={"accuracy": 7.0}))
    assert dict(client.status().metrics) == {"accuracy": 0.7}


def test_negative_records_is_invalid_argument(make_coordinator: Callable[..., Coordinator]) -> None:
    c = make_coordinator()
    client = c.client("w1")
    task = client.get_task()
    with pytest.raises(grpc.RpcError) as raised:
        client.report(pb.TaskResult(task_id=task.id, success=True, records=-1))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_get_task_without_a_worker_name_is_invalid_argument(make_coordinator: Callable[..., Coordinator]) -> None:
    c = make_coordinator()
    with pytest.raises(grpc.RpcError) as raised:
        c.client("").get_task()
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_an_export_refused_every_attempt_is_the_jobs_export_error(grpc_servers: Callable[..., int]) -> None:
    settings = QueueSettings(num_records=10, records_per_task=10, num_epochs=1, export=True, export_attempts=2)
    servicer = CoordinatorServicer(Engine(settings, version_fn=lambda: 1, output="s3://nope/models/tj",
                                          checkpoint_dir="/ckpt", checkpoint_steps=5))  # fmt: skip
    address = f"127.0.0.1:{grpc_servers(lambda s: add_coordinator(servicer, s))}"
    worker = CoordinatorClient(address, worker="w1", deadline_s=30.0, timeout_s=30.0)
    try:
        task = worker.get_task()
        worker.report(pb.TaskResult(task_id=task.id, success=True, records=10))
        for attempt in (1, 2):
            export = worker.get_task()
            assert export.type == pb.TASK_TYPE_EXPORT and export.final
            assert worker.status().export_error == ""
            error = f"OSError: Bucket 'nope' not found\n(attempt {attempt})"
            worker.report(pb.TaskResult(task_id=export.id, success=False, export_failed=True, error=error))
        status = worker.status()
        assert status.export_error == (
            "could not write the final model (version 1) to s3://nope/models/tj: 2 attempts failed, the last with "
            "OSError: Bucket 'nope' not found (attempt 2). The PS checkpoints in /ckpt are kept: once the output "
            "works, `elasticps export /ckpt --job JOB.yaml --out s3://nope/models/tj` writes the newest version "
            "every shard checkpointed."
        )
        assert not status.finished and worker.get_task().type == pb.TASK_TYPE_WAIT
    finally:
        worker.close()
