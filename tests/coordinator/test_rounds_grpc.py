"""Sync rounds end to end over real in-process gRPC: two PS shards with real stores, the coordinator
servicer deciding rounds (PS 0's own shard reached in-process, as ``ps/main.py`` wires it; shard 1
through RemoteShard), workers using the real PSClient and CoordinatorClient."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from elasticps.api.optimizer import OptimizerConfig
from elasticps.coordinator.bulk import BulkJoins
from elasticps.coordinator.client import CoordinatorClient
from elasticps.coordinator.engine import Coordinator
from elasticps.api.modes import LocalSGD
from elasticps.coordinator.local_steps import LocalSteps
from elasticps.coordinator.rounds import Rounds
from elasticps.coordinator.servicer import CoordinatorServicer
from elasticps.coordinator.servicer import add_to_server as add_coordinator
from elasticps.coordinator.shards import RemoteShard, ShardLink, Shards, ShardView
from elasticps.coordinator.tasks.base import QueueSettings
from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc
from elasticps.ps.applied import TaskProgress
from elasticps.ps.bulk import BulkServer
from elasticps.psclient.client import PSClient, PullBehind, PushRequest
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.main import LocalShard
from elasticps.ps.servicer import ParameterServerServicer, add_to_server
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc.limits import ServerLimits

from replaceable_shard import Replaceable

LR = 0.1
SGD = OptimizerConfig("sgd", {"learning_rate": LR})
# With 2 shards, by size: "dense/kernel:0" (the larger) lives on shard 0, "dense/bias:0" on shard 1.
MODEL = {
    "dense/kernel:0": np.array([1.0, -2.0, 0.5], dtype=np.float32),
    "dense/bias:0": np.array([3.0, 0.25], dtype=np.float32),
}


def gradient(minibatch: str) -> dict[str, np.ndarray]:
    """A gradient that depends only on the minibatch's name: the round log says what was applied."""
    value = float(zlib.crc32(minibatch.encode()) % 7) - 3.0
    return {n: np.full_like(v, value) for n, v in MODEL.items()}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class SyncJob:
    stores: list[ParameterStore]
    ps_addresses: list[str]
    coordinator_address: str
    servicer: CoordinatorServicer
    rounds: Rounds
    logs: list[Path]
    closers: list[Callable[[], None]]

    def ps_client(self, worker: str) -> PSClient:
        client = PSClient(self.ps_addresses, worker=worker, deadline_s=20.0, timeout_s=20.0)
        self.closers.append(client.close)
        return client

    def coordinator(self, worker: str) -> CoordinatorClient:
        client = CoordinatorClient(self.coordinator_address, worker=worker, deadline_s=20.0, timeout_s=20.0)
        self.closers.append(client.close)
        return client

    def round_log(self, shard: int) -> list[dict[str, object]]:
        path = self.logs[shard]
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def make_job(grpc_servers: Callable[..., int], tmp_path: Path) -> Iterator[Callable[..., SyncJob]]:
    made: list[SyncJob] = []

    def make(
        grads_to_wait: int,
        num_records: int,
        records_per_task: int,
        num_epochs: int = 1,
        clock: Callable[[], float] = time.monotonic,
        task_timeout: float = 60.0,
        ticker: bool = False,
        periods: LocalSteps | None = None,
        bulk: bool = False,
    ) -> SyncJob:
        """``bulk``: each shard serves its bulk channel too, PS 0's taking joins (as ``ps/main.py`` wires it)."""
        logs = [tmp_path / f"ps-{i}.jsonl" for i in range(2)]
        stores = [ParameterStore(StoreSettings(shard=i, round_log=logs[i])) for i in range(2)]
        metrics = [PSMetrics(CollectorRegistry(), i) for i in range(2)]
        addresses = []
        ps_servicers = []
        for store, measured in zip(stores, metrics):
            ps_servicer = ParameterServerServicer(store, metrics=measured)
            ps_servicers.append(ps_servicer)
            addresses.append(f"127.0.0.1:{grpc_servers(lambda s, p=ps_servicer: add_to_server(p, s))}")
        links: list[ShardLink] = [LocalShard(stores[0], metrics[0]), RemoteShard(1, addresses[1])]
        shards = Shards(links)
        rounds = Rounds(grads_to_wait=grads_to_wait, periods=periods)
        settings = QueueSettings(
            num_records=num_records, records_per_task=records_per_task, num_epochs=num_epochs, task_timeout=task_timeout
        )
        engine = Coordinator(
            settings, version_fn=lambda: stores[0].version, clock=clock, rounds=rounds, shards=shards
        )
        servicer = CoordinatorServicer(engine)
        port = grpc_servers(lambda s: add_coordinator(servicer, s))
        job = SyncJob(stores, addresses, f"127.0.0.1:{port}", servicer, rounds, logs, [engine.stop, shards.close])
        if bulk:
            for i, (store, measured, ps_servicer) in enumerate(zip(stores, metrics, ps_servicers)):
                joiner = BulkJoins(engine) if i == 0 else None
                server = BulkServer(store, measured, ServerLimits(), "127.0.0.1", 0, joiner)
                server.start()
                ps_servicer.bulk_port = server.port
                job.closers.append(server.stop)
        setup = job.ps_client("setup")
        assert setup.push_model(MODEL, SGD) == [0, 0]
        made.append(job)
        recover(servicer, ticker)
        return job

    yield make
    for job in made:
        for close in job.closers:
            close()


def recover(servicer: CoordinatorServicer, ticker: bool = True) -> None:
    """A sync coordinator answers UNAVAILABLE until it asked the shards what they hold. With
    ``ticker`` its ticker thread is started and does that first; without, the first recovery is run
    here, in this thread, and no ticker runs (tests that move a fake clock decide when rounds close)."""
    if ticker:
        servicer.engine.start()
    else:
        servicer.engine.first_recovery()
    assert servicer.engine.wait_ready(20), "the coordinator never became ready"


def train(job: SyncJob, worker: str, trained: list[str], records_per_minibatch: int = 1,
          behind: list[pb.JoinReply] | None = None) -> None:  # fmt: skip
    """A worker's sync loop: every minibatch staged on both shards, then joined until a round counted
    it; a refused one is pushed again on the newer model. Says goodbye at the end. ``behind``: the
    worker joins behind its push on PS 0's bulk channel, as a worker does, with pulls behind (the
    answers that came that way are appended), over gRPC when none came."""
    ps, coordinator = job.ps_client(worker), job.coordinator(worker)
    versions = [-1, -1]
    try:
        while True:
            task = coordinator.get_task()
            if task.type == pb.TASK_TYPE_FINISHED:
                return
            if task.type == pb.TASK_TYPE_WAIT:
                time.sleep(0.02)
                continue
            for start in range(task.start, task.end, records_per_minibatch):
                minibatch = f"{task.epoch}/{start}"
                while True:
                    versions = ps.pull(versions).versions
                    while len(set(versions)) > 1:  # a commit between the shards: wait for the lagging one
                        versions = ps.pull(versions, wait_ms=200).versions
                    pull_behind = None if behind is None else PullBehind(2000, join=True)
                    pushed = ps.push(PushRequest(gradient(minibatch), versions, minibatch=minibatch,
                                                 pull_behind=pull_behind)).result()  # fmt: skip
                    if not pushed.all_accepted:
                        if pushed.behind is not None:
                            pushed.behind.cancel()
                        continue
                    joined = None
                    if pushed.behind is not None:
                        joined = pushed.behind.join(pb.JoinRequest(worker=worker, version=versions[0], wait_ms=2000))
                    if joined is not None and behind is not None:
                        behind.append(joined)
                    reply = joined or coordinator.join_round(versions[0], 2000)
                    while reply.outcome == pb.JOIN_OUTCOME_PENDING:
                        reply = coordinator.join_round(versions[0], 2000)
                    if reply.outcome == pb.JOIN_OUTCOME_COMMITTED:
                        if pushed.behind is not None:  # the round's model, each shard's sent as it committed
                            versions = pushed.behind.result().versions
                            assert min(versions) >= reply.version
                        trained.append(minibatch)
                        break
                    if pushed.behind is not None:
                        pushed.behind.cancel()
                    assert reply.outcome == pb.JOIN_OUTCOME_REFUSED, reply
            coordinator.report(pb.TaskResult(task_id=task.id, success=True, records=task.end - task.start))
    finally:
        coordinator.leave()


def replayed(log: list[dict[str, object]]) -> dict[str, np.ndarray]:
    """The model the rounds of ``log`` give, applied in order: each round's average, once."""
    params = {n: v.copy() for n, v in MODEL.items()}
    for entry in log:
        minibatches = entry["minibatches"]
        assert isinstance(minibatches, list)
        for name in params:
            total = np.zeros_like(params[name])
            for minibatch in minibatches:
                total += gradient(minibatch)[name]
            params[name] -= total * np.float32(1.0 / len(minibatches)) * np.float32(LR)
    return params


# How the workers join: all over gRPC; all behind their pushes on PS 0's bulk channel; half each.
JOINS = {"grpc": (), "bulk": ("w0", "w1", "w2", "w3"), "mixed": ("w0", "w2")}


@pytest.mark.parametrize("joins", list(JOINS))
def test_four_workers_two_gradients_per_round_every_minibatch_counted_once_on_both_shards(
    make_job: Callable[..., SyncJob], joins: str
) -> None:
    # The ticker closes the last rounds when workers run out of work.
    job = make_job(grads_to_wait=2, num_records=24, records_per_task=3, num_epochs=2, ticker=True, bulk=joins != "grpc")
    trained: dict[str, list[str]] = {w: [] for w in ("w0", "w1", "w2", "w3")}
    behind: dict[str, list[pb.JoinReply]] = {w: [] for w in JOINS[joins]}
    errors: list[BaseException] = []

    def run(worker: str) -> None:
        try:
            train(job, worker, trained[worker], behind=behind.get(worker))
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(w,)) for w in trained]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a worker hung"
    assert errors == []

    log0, log1 = job.round_log(0), job.round_log(1)
    # Both shards applied the same rounds, in order, with the same members in the same order.
    assert [e["round"] for e in log0] == list(range(len(log0)))
    assert [(e["round"], e["minibatches"]) for e in log0] == [(e["round"], e["minibatches"]) for e in log1]
    counted = [m for entry in log0 for m in entry["minibatches"]]  # type: ignore[attr-defined]
    everything = [f"{epoch}/{record}" for epoch in range(2) for record in range(24)]
    assert sorted(counted) == sorted(everything)  # every minibatch once: none lost, none twice
    assert sorted(m for ms in trained.values() for m in ms) == sorted(everything)
    assert all(1 <= len(e["minibatches"]) <= 2 for e in log0)  # type: ignore[arg-type]
    assert sum(len(e["minibatches"]) == 2 for e in log0) >= len(log0) - 4  # type: ignore[arg-type]
    assert [s.version for s in job.stores] == [len(log0)] * 2
    assert job.rounds.version == len(log0)
    # The model is exactly the rounds of the log applied in order.
    expected = replayed(log0)
    for store in job.stores:
        with store.reading() as (_, _, variables):
            for name, value in variables.items():
                np.testing.assert_allclose(value, expected[name], rtol=1e-6, err_msg=name)

    status = job.coordinator("observer").status()
    assert status.finished
    assert list(status.shard_versions) == [len(log0)] * 2
    assert status.shard_problem == ""
    # Joins behind pushes were answered over the bulk channel: every minibatch each such worker trained.
    for worker, replies in behind.items():
        assert len(replies) >= len(trained[worker]) > 0, worker
        assert {r.outcome for r in replies} <= {pb.JOIN_OUTCOME_COMMITTED, pb.JOIN_OUTCOME_REFUSED, pb.JOIN_OUTCOME_PENDING}
        assert sum(r.outcome == pb.JOIN_OUTCOME_COMMITTED for r in replies) >= len(trained[worker]) // 2, worker


def test_a_lone_worker_commits_its_round_at_once_and_the_status_shows_it(make_job: Callable[..., SyncJob]) -> None:
    job = make_job(grads_to_wait=0, num_records=4, records_per_task=4)
    ps, coordinator = job.ps_client("w0"), job.coordinator("w0")
    assert coordinator.get_task().type == pb.TASK_TYPE_TRAINING
    assert ps.push(PushRequest(gradient("m"), [0, 0], minibatch="m")).result().all_accepted
    reply = coordinator.join_round(0, 5000)
    assert (reply.outcome, reply.version) == (pb.JOIN_OUTCOME_COMMITTED, 1)
    assert coordinator.join_round(0, 0).outcome == pb.JOIN_OUTCOME_COMMITTED  # asked again: the same answer
    status = coordinator.status()
    assert (list(status.shard_versions), status.live_workers, status.grads_to_wait) == ([1, 1], 1, 1)
    assert [e["minibatches"] for e in job.round_log(1)] == [["m"]]
    # Each shard's tensor bytes of pushes and pulls, from its own metric: this push, no pull yet.
    kernel, bias = MODEL["dense/kernel:0"].nbytes, MODEL["dense/bias:0"].nbytes
    assert list(status.shard_bytes_received) == [kernel, bias]
    assert list(status.shard_bytes_sent) == [0, 0]
    ps.pull([-1, -1])
    assert all(sent > 0 for sent in coordinator.status().shard_bytes_sent)


def test_a_localsgd_join_is_answered_with_the_next_period(make_job: Callable[..., SyncJob]) -> None:
    job = make_job(grads_to_wait=0, num_records=8, records_per_task=8, periods=LocalSteps(LocalSGD(steps=8, adaptive=True)))
    ps, coordinator = job.ps_client("w0"), job.coordinator("w0")
    coordinator.get_task()
    assert ps.push(PushRequest(gradient("p1"), [0, 0], minibatch="p1")).result().all_accepted
    reply = coordinator.join_round(0, 5000, local_steps=1, loss=2.0, learning_rate=0.1)
    assert (reply.outcome, reply.version, reply.local_steps) == (pb.JOIN_OUTCOME_COMMITTED, 1, 8)
    assert ps.push(PushRequest(gradient("p2"), [1, 1], minibatch="p2")).result().all_accepted
    reply = coordinator.join_round(1, 5000, local_steps=8, loss=0.5, learning_rate=0.1)
    assert reply.local_steps == 4  # int(8 * sqrt(0.5 / 2.0))
    again = coordinator.join_round(1, 0)  # asked again: the same answer
    assert (again.outcome, again.local_steps) == (pb.JOIN_OUTCOME_COMMITTED, 4)


@pytest.mark.parametrize(("loss", "learning_rate"), [(1.0, 5e-324), (1e200, 1e-300)])
def test_a_localsgd_join_at_the_edge_of_the_floats_keeps_the_period(
    make_job: Callable[..., SyncJob], loss: float, learning_rate: float
) -> None:
    """Issue 35, Found 3: these answered UNKNOWN (ZeroDivisionError, OverflowError in AdaComm's K)."""
    job = make_job(grads_to_wait=0, num_records=8, records_per_task=8, periods=LocalSteps(LocalSGD(steps=8, adaptive=True)))
    ps, coordinator = job.ps_client("w0"), job.coordinator("w0")
    coordinator.get_task()
    assert ps.push(PushRequest(gradient("p1"), [0, 0], minibatch="p1")).result().all_accepted
    assert coordinator.join_round(0, 5000, local_steps=1, loss=2.0, learning_rate=0.1).local_steps == 8
    assert ps.push(PushRequest(gradient("p2"), [1, 1], minibatch="p2")).result().all_accepted
    reply = coordinator.join_round(1, 5000, local_steps=8, loss=loss, learning_rate=learning_rate)
    assert (reply.outcome, reply.version, reply.local_steps) == (pb.JOIN_OUTCOME_COMMITTED, 2, 8)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"local_steps": -1}, "JoinRound: local_steps must be >= 0, got -1"),
        ({"local_steps": 4, "loss": float("nan")}, "JoinRound: loss must be finite, got nan"),
        ({"local_steps": 4, "learning_rate": -0.5}, "JoinRound: learning_rate must be >= 0, got -0.5"),
    ],
)
def test_a_join_with_a_bad_period_is_invalid_argument(
    make_job: Callable[..., SyncJob], fields: dict[str, float], message: str
) -> None:
    job = make_job(grads_to_wait=0, num_records=8, records_per_task=8, periods=LocalSteps(LocalSGD(steps=4)))
    with grpc.insecure_channel(job.coordinator_address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.JoinRound(pb.JoinRequest(worker="w0", version=0, **fields), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == message
    assert job.rounds.version == 0


def test_a_join_of_an_old_gradient_is_refused(make_job: Callable[..., SyncJob]) -> None:
    job = make_job(grads_to_wait=1, num_records=4, records_per_task=4)
    ps, coordinator = job.ps_client("w0"), job.coordinator("w0")
    coordinator.get_task()
    ps.push(PushRequest(gradient("a"), [0, 0], minibatch="a")).result()
    assert coordinator.join_round(0, 5000).outcome == pb.JOIN_OUTCOME_COMMITTED
    other = job.coordinator("w1")
    reply = other.join_round(0, 0)  # computed on version 0, the round is 1 now
    assert (reply.outcome, reply.version) == (pb.JOIN_OUTCOME_REFUSED, 1)


def test_a_round_a_shard_cannot_take_is_aborted_and_its_members_refused(make_job: Callable[..., SyncJob]) -> None:
    """w0 joins without having staged anything on shard 1: the dry run fails there, nothing is applied."""
    job = make_job(grads_to_wait=1, num_records=4, records_per_task=4)
    coordinator = job.coordinator("w0")
    coordinator.get_task()
    job.stores[0].push({"dense/kernel:0": gradient("x")["dense/kernel:0"]}, version=0, worker="w0")
    assert coordinator.join_round(0, 2000).outcome == pb.JOIN_OUTCOME_REFUSED
    assert [s.version for s in job.stores] == [0, 0]
    assert (job.rounds.version, job.rounds.aborted_rounds) == (0, 1)
    assert job.round_log(0) == job.round_log(1) == []


def test_join_round_of_an_async_job_is_failed_precondition(grpc_servers: Callable[..., int]) -> None:
    settings = QueueSettings(num_records=4, records_per_task=4, num_epochs=1)
    servicer = CoordinatorServicer(Coordinator(settings, version_fn=lambda: 0))
    port = grpc_servers(lambda s: add_coordinator(servicer, s))
    client = CoordinatorClient(f"127.0.0.1:{port}", worker="w0", deadline_s=5.0, timeout_s=5.0)
    try:
        with pytest.raises(grpc.RpcError) as raised:
            client.join_round(0, 0)
        assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert client.status().grads_to_wait == 0
    finally:
        client.close()


def test_sync_rounds_need_shards() -> None:
    with pytest.raises(ValueError, match="shards"):
        Coordinator(QueueSettings(num_records=4, records_per_task=4, num_epochs=1), version_fn=lambda: 0, rounds=Rounds())


def test_a_leaving_worker_lets_the_round_close_without_it(make_job: Callable[..., SyncJob]) -> None:
    job = make_job(grads_to_wait=2, num_records=40, records_per_task=10)
    a, b = job.coordinator("a"), job.coordinator("b")
    a.get_task()
    b.get_task()
    job.ps_client("a").push(PushRequest(gradient("a/1"), [0, 0], minibatch="a/1")).result()
    assert a.join_round(0, 0).outcome == pb.JOIN_OUTCOME_PENDING  # b can still join
    b.leave()
    assert b.status().live_workers == 1
    reply = a.join_round(0, 2000)
    assert (reply.outcome, reply.version) == (pb.JOIN_OUTCOME_COMMITTED, 1)
    assert [e["minibatches"] for e in job.round_log(0)] == [["a/1"]]


def test_a_member_whose_task_went_back_is_refused(make_job: Callable[..., SyncJob]) -> None:
    clock = Clock()
    job = make_job(grads_to_wait=2, num_records=40, records_per_task=10, clock=clock, task_timeout=10.0)
    w1, w2 = job.coordinator("w1"), job.coordinator("w2")
    w1.get_task()
    w2.get_task()
    job.ps_client("w1").push(PushRequest(gradient("w1/1"), [0, 0], minibatch="w1/1")).result()
    assert w1.join_round(0, 0).outcome == pb.JOIN_OUTCOME_PENDING
    clock.now += 11  # w1 fell silent past the timeout; w2 did not
    w2.heartbeat()
    assert w2.status().tasks_requeued == 1  # w1's task went back
    assert w1.join_round(0, 0).outcome == pb.JOIN_OUTCOME_REFUSED
    assert not job.rounds.is_member("w1")


def test_a_dropped_member_that_retrains_on_the_same_version_joins_again(make_job: Callable[..., SyncJob]) -> None:
    clock = Clock()
    job = make_job(grads_to_wait=2, num_records=40, records_per_task=10, clock=clock, task_timeout=10.0)
    w1, w2 = job.coordinator("w1"), job.coordinator("w2")
    ps1 = job.ps_client("w1")
    w1.get_task()
    w2.get_task()
    ps1.push(PushRequest(gradient("w1/1"), [0, 0], minibatch="w1/1")).result()
    assert w1.join_round(0, 0).outcome == pb.JOIN_OUTCOME_PENDING
    clock.now += 11
    w2.heartbeat()
    assert w2.status().tasks_requeued == 1
    assert w1.join_round(0, 0).outcome == pb.JOIN_OUTCOME_REFUSED  # dropped: its task went back
    # w1 goes on: it takes a task, trains a minibatch on the model it has (round 0 is still open) and joins.
    assert w1.get_task().type == pb.TASK_TYPE_TRAINING
    ps1.push(PushRequest(gradient("w1/2"), [0, 0], minibatch="w1/2")).result()
    assert w1.join_round(0, 0).outcome == pb.JOIN_OUTCOME_PENDING  # admitted, waiting for a second gradient
    job.ps_client("w2").push(PushRequest(gradient("w2/1"), [0, 0], minibatch="w2/1")).result()
    assert w2.join_round(0, 5000).outcome == pb.JOIN_OUTCOME_COMMITTED
    assert [e["minibatches"] for e in job.round_log(0)] == [["w1/2", "w2/1"]]


def test_the_ticker_closes_a_round_whose_missing_member_died(make_job: Callable[..., SyncJob]) -> None:
    clock = Clock()
    job = make_job(grads_to_wait=2, num_records=40, records_per_task=10, clock=clock, task_timeout=10.0, ticker=True)
    w1, w2 = job.coordinator("w1"), job.coordinator("w2")
    w1.get_task()
    w2.get_task()
    job.ps_client("w1").push(PushRequest(gradient("w1/1"), [0, 0], minibatch="w1/1")).result()
    assert w1.join_round(0, 0).outcome == pb.JOIN_OUTCOME_PENDING
    assert job.rounds.version == 0
    clock.now += 11  # w2 died; w1 is still waiting in its round (its join is its heartbeat)
    w1.heartbeat()
    deadline = time.monotonic() + 10
    while job.rounds.version == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # nobody calls: only the ticker can close the round
    assert job.rounds.version == 1
    assert job.rounds.short_rounds == 1
    assert w1.join_round(0, 0).outcome == pb.JOIN_OUTCOME_COMMITTED
    assert [e["minibatches"] for e in job.round_log(1)] == [["w1/1"]]


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_status_names_a_shard_that_restarted_and_lost_its_model(grpc_servers: Callable[..., int]) -> None:
    stores = [ParameterStore(StoreSettings(shard=i)) for i in range(2)]
    for store in stores:
        store.initialize({"w": np.zeros(2, dtype=np.float32)}, SGD)
    links = [Replaceable(store) for store in stores]
    shards = Shards(links)
    engine = Coordinator(
        QueueSettings(num_records=4, records_per_task=4, num_epochs=1),
        version_fn=lambda: stores[0].version,
        rounds=Rounds(grads_to_wait=1),
        shards=shards,
    )
    servicer = CoordinatorServicer(engine)
    port = grpc_servers(lambda s: add_coordinator(servicer, s))
    client = CoordinatorClient(f"127.0.0.1:{port}", worker="observer", deadline_s=5.0, timeout_s=5.0)
    try:
        recover(servicer)
        first = client.status()
        assert (list(first.shard_versions), first.shard_problem) == ([0, 0], "")
        links[1].link = LocalShard(ParameterStore(StoreSettings(shard=1)))  # restarted, no checkpoint
        wait_for(lambda: client.status().shard_problem != "")  # the ticker saw its new boot
        second = client.status()
        assert list(second.shard_versions) == [0, 0]
        assert "PS shards [1] restarted without a checkpoint" in second.shard_problem
        assert "lost their model" in second.shard_problem
        assert engine.rollbacks == 0  # nothing to roll back to: the workers repair it
    finally:
        engine.stop()
        client.close()
        shards.close()


def test_a_lone_shard_repaired_by_a_worker_is_followed_at_the_workers_version() -> None:
    """PS 0 of a one-shard job came back without a checkpoint (so with a new coordinator at version 0)
    and a worker pushed its copy of version 7: rounds go on from 7, and the status says what was lost."""
    store = ParameterStore(StoreSettings(shard=0))
    shards = Shards([LocalShard(store)])
    rounds = Rounds(grads_to_wait=1)
    engine = Coordinator(
        QueueSettings(num_records=4, records_per_task=4, num_epochs=1),
        version_fn=lambda: store.version,
        rounds=rounds,
        shards=shards,
    )
    servicer = CoordinatorServicer(engine)
    try:
        recover(servicer)
        assert rounds.version == 0
        store.initialize({"w": np.zeros(2, dtype=np.float32)}, SGD, version=7)  # the worker's repair
        wait_for(lambda: rounds.version == 7)
        assert "a worker's copy of version 7 replaced it" in engine.shard_problem
        assert store.push({"w": np.ones(2, dtype=np.float32)}, 7, worker="w").accepted
        assert engine.sync is not None
        with engine.sync.lock:
            assert rounds.join("w", 7, live=1).value == "admitted"
    finally:
        engine.stop()
        shards.close()


def test_a_committed_round_counts_its_tasks_records_and_a_void_tasks_join_is_told_so(
    make_job: Callable[..., SyncJob]
) -> None:
    clock = Clock()
    job = make_job(grads_to_wait=1, num_records=40, records_per_task=10, clock=clock, task_timeout=10.0)
    w1, w2 = job.coordinator("w1"), job.coordinator("w2")
    task = w1.get_task()
    job.ps_client("w1").push(PushRequest(gradient("w1/1"), [0, 0], minibatch="w1/1")).result()
    reply = w1.join_round(0, 2000, task_id=task.id, task_records=3)
    assert (reply.outcome, reply.version) == (pb.JOIN_OUTCOME_COMMITTED, 1)
    assert w1.status().records_done == 3  # applied, before any report
    for store in job.stores:  # each shard's copy of the ledger, what a restarted PS 0 rebuilds from
        assert store.applied.copy().tasks == (TaskProgress(task.epoch, task.start, task.start + 3, task.id),)
    clock.now += 11  # w1 fell silent past the timeout: its task goes back from its 4th record
    rest = w2.get_task()
    assert (rest.start, rest.end, rest.epoch) == (task.start + 3, task.end, task.epoch)
    job.ps_client("w1").push(PushRequest(gradient("w1/2"), [1, 1], minibatch="w1/2")).result()
    void = w1.join_round(1, 0, task_id=task.id, task_records=6)
    assert void.outcome == pb.JOIN_OUTCOME_VOID
    assert [e["minibatches"] for e in job.round_log(0)] == [["w1/1"]]  # the void gradient joined nothing
    job.ps_client("w2").push(PushRequest(gradient("w2/1"), [1, 1], minibatch="w2/1")).result()
    assert w2.join_round(1, 2000, task_id=rest.id, task_records=7).outcome == pb.JOIN_OUTCOME_COMMITTED
    w2.report(pb.TaskResult(task_id=rest.id, success=True, records=7))
    assert w2.status().records_done == 10


def test_a_join_with_a_negative_task_is_invalid_argument(make_job: Callable[..., SyncJob]) -> None:
    job = make_job(grads_to_wait=1, num_records=40, records_per_task=10)
    with pytest.raises(grpc.RpcError) as err:
        job.coordinator("w1").join_round(0, 0, task_id=-1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "task_id" in err.value.details()


def test_each_commit_tells_every_shard_the_version_to_keep(make_job: Callable[..., SyncJob]) -> None:
    job = make_job(grads_to_wait=1, num_records=40, records_per_task=10)
    sync = job.servicer.engine.sync
    assert sync is not None
    sync.restorable = 7  # what the shard watch found every shard and the ledger can restore
    w1 = job.coordinator("w1")
    w1.get_task()
    job.ps_client("w1").push(PushRequest(gradient("w1/1"), [0, 0], minibatch="w1/1")).result()
    assert w1.join_round(0, 2000).outcome == pb.JOIN_OUTCOME_COMMITTED
    assert [store._checkpoints.protected for store in job.stores] == [7, 7]
