"""Sync joins over PS 0's bulk channel (``ps/bulk.py`` with a joiner): a worker writes its join behind
its push, and the pull behind the join; the coordinator's answers are the ones gRPC gives.

The job here is one sync shard with a real store, the coordinator's engine committing rounds on it
in-process (as ``ps/main.py`` wires PS 0), and no coordinator gRPC server at all: every join that is
answered went over the bulk channel."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from bench import malformed
from bench.malformed import COORD_CASES, OK
from elasticps.api.modes import LocalSGD, TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.coordinator.local_steps import LocalSteps
from elasticps.coordinator.rounds import Rounds
from elasticps.coordinator.bulk import BulkJoins
from elasticps.coordinator.engine import Coordinator
from elasticps.coordinator.servicer import CoordinatorServicer
from elasticps.coordinator.shards import Shards
from elasticps.coordinator.tasks.base import QueueSettings
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.bulk import BulkServer
from elasticps.psclient.client import PSClient, PullBehind, Pushed, PushRequest
from elasticps.ps.main import LocalShard
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.servicer import ParameterServerServicer
from elasticps.ps.servicer import add_to_server as add_ps
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc.limits import ServerLimits

LR = 0.5
MODEL = {"a": np.linspace(-1, 1, 3000, dtype=np.float32), "b": np.full((10, 7), 0.25, np.float32)}
JOIN_CASES = [name for name, case in COORD_CASES.items() if case.method == "JoinRound"]


@dataclass
class Job:
    address: str  # PS 0's gRPC address (DescribeShard tells clients its bulk port)
    store: ParameterStore
    coordinator: CoordinatorServicer  # over the engine that PS 0's bulk channel joins reach too
    rounds: Rounds
    server: BulkServer

    def client(self, worker: str) -> PSClient:
        """A worker's PS client; the worker has taken a task, so the rounds count it as live."""
        task = self.coordinator.GetTask(pb.GetTaskRequest(worker=worker), None)  # type: ignore[arg-type]
        assert task.type == pb.TASK_TYPE_TRAINING
        return PSClient([self.address], worker=worker, deadline_s=10, timeout_s=10)


@pytest.fixture
def make_job(grpc_servers: Callable[..., int]) -> Iterator[Callable[..., Job]]:
    stops: list[Callable[[], None]] = []

    def make(grads_to_wait: int = 2, joins: bool = True, sync: bool = True, periods: LocalSteps | None = None) -> Job:
        rule = UpdateRule.ASYNC if not sync else UpdateRule.SYNC if periods is None else UpdateRule.LOCAL_SGD
        store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=rule)))
        metrics = PSMetrics(CollectorRegistry(), 0)
        rounds = Rounds(grads_to_wait=grads_to_wait, periods=periods)
        engine = Coordinator(
            QueueSettings(num_records=64, records_per_task=8, num_epochs=1),
            version_fn=lambda: store.version,
            rounds=rounds if sync else None,
            shards=Shards([LocalShard(store, metrics)]) if sync else None,
        )
        if sync:
            engine.first_recovery()  # ready: the shard was asked what it holds
        coordinator = CoordinatorServicer(engine)
        server = BulkServer(store, metrics, ServerLimits(), "127.0.0.1", 0, BulkJoins(engine) if joins else None)
        server.start()
        servicer = ParameterServerServicer(store, metrics=metrics)
        servicer.bulk_port = server.port
        stops.extend([server.stop, engine.stop])
        job = Job(f"127.0.0.1:{grpc_servers(lambda s: add_ps(servicer, s))}", store, coordinator, rounds, server)
        setup = PSClient([job.address], worker="setup", deadline_s=10, timeout_s=10)
        setup.push_model(MODEL, OptimizerConfig("sgd", {"learning_rate": LR}))
        setup.close()
        return job

    yield make
    for stop in stops:
        stop()


def gradient(scale: float) -> dict[str, np.ndarray]:
    return {name: np.full_like(value, scale) for name, value in MODEL.items()}


def push(client: PSClient, scale: float, minibatch: str) -> Pushed:
    request = PushRequest(gradient(scale), [0], minibatch=minibatch, pull_behind=PullBehind(5_000, join=True))
    pushed = client.push(request).result()
    assert pushed.all_accepted and pushed.behind is not None
    return pushed


def test_two_workers_join_behind_their_pushes_and_the_round_model_comes_behind_the_joins(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    clients = [job.client(f"w{i}") for i in range(2)]
    try:
        pushed = [push(client, 0.1 * (i + 1), f"m{i}") for i, client in enumerate(clients)]
        replies: dict[int, pb.JoinReply | None] = {}
        first = threading.Thread(
            target=lambda: replies.update({0: pushed[0].behind.join(pb.JoinRequest(worker="w0", version=0, wait_ms=5_000))})  # type: ignore[union-attr]
        )
        first.start()
        first.join(0.3)
        assert first.is_alive() and job.rounds.version == 0  # w0 waits in its connection's thread for w1
        replies[1] = pushed[1].behind.join(pb.JoinRequest(worker="w1", version=0, wait_ms=5_000))  # type: ignore[union-attr]
        first.join(5)
        for reply in replies.values():
            assert reply is not None and (reply.outcome, reply.version) == (pb.JOIN_OUTCOME_COMMITTED, 1)
        assert job.store.version == 1 and job.rounds.version == 1
        mean = np.float32(0.15) * np.float32(LR)
        for sent in pushed:
            pulled = sent.behind.result()  # type: ignore[union-attr]
            assert pulled.versions == [1]
            np.testing.assert_allclose(pulled.tensors["a"], MODEL["a"] - mean, rtol=1e-6)
        assert job.coordinator.waiting_joins == 0  # no gRPC join was made: there is no coordinator server
    finally:
        for client in clients:
            client.close()


def test_a_join_behind_a_push_to_a_shard_that_takes_no_joins_leaves_the_pull_to_gRPC(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(grads_to_wait=1, joins=False)
    client = job.client("w0")
    try:
        pushed = push(client, 0.1, "m")
        assert pushed.behind is not None
        assert pushed.behind.join(pb.JoinRequest(worker="w0", version=0, wait_ms=1_000)) is None  # UNIMPLEMENTED
        assert job.rounds.version == 0
        job.store.commit(0, ["w0"])  # as a gRPC join would have it committed
        assert pushed.behind.result().versions == [1]  # shard 0 pulled as any pull
    finally:
        client.close()


def test_a_localsgd_join_behind_its_delta_carries_its_period_and_is_answered_with_the_next(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(grads_to_wait=1, periods=LocalSteps(LocalSGD(steps=8, adaptive=True)))
    client = job.client("w0")
    try:
        pushed = push(client, 0.1, "p1")
        request = pb.JoinRequest(worker="w0", version=0, wait_ms=5_000, local_steps=1, loss=2.0, learning_rate=0.1)
        reply = pushed.behind.join(request)  # type: ignore[union-attr]
        assert reply is not None and (reply.outcome, reply.version, reply.local_steps) == (pb.JOIN_OUTCOME_COMMITTED, 1, 8)
        assert pushed.behind.result().versions == [1]  # type: ignore[union-attr]
    finally:
        client.close()


@pytest.mark.parametrize("case", JOIN_CASES)
def test_a_bad_join_over_the_bulk_channel_gets_the_grpc_status_and_the_rounds_are_untouched(
    make_job: Callable[..., Job], case: str
) -> None:
    spec = COORD_CASES[case]
    job = make_job(grads_to_wait=1, sync=spec.sync or not case.startswith("join: async"))
    code, _ = malformed.bulk_call(job.server.port, "JoinRound", spec.request)
    assert code is spec.code
    sync = job.coordinator.engine.sync
    if sync is None:
        return
    assert job.rounds.version == 0 and sync.joined == {}
    client = job.client("w0")  # and the next join, behind a push, is counted
    try:
        reply = push(client, 0.1, "m").behind.join(pb.JoinRequest(worker="w0", version=0, wait_ms=5_000))  # type: ignore[union-attr]
        assert reply is not None and reply.outcome == pb.JOIN_OUTCOME_COMMITTED
        assert job.store.version == 1
    finally:
        client.close()


def test_a_garbage_join_closes_only_its_own_connection(make_job: Callable[..., Job]) -> None:
    job = make_job(grads_to_wait=1)
    code, _ = malformed.bulk_call(job.server.port, "JoinRound", b"\xff" * 64)
    assert code is malformed.INVALID
    code, reply = malformed.bulk_call(job.server.port, "PullDense", pb.PullRequest(worker="w0", version=-1).SerializeToString())
    assert code is OK and reply  # the server goes on
