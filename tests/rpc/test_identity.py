"""Job identity (issue 35): a caller without the job's token is refused by every method of the PS,
the coordinator, a decentralized peer and the bulk channel, and changes nothing; a member calls
only what its kind may, and a worker speaks only for itself.

One real asyncio server with the job's key serves the three services, and a real bulk server the
shard's pushes and pulls; the callers are real gRPC channels and sockets. What counts: the status
of each call, the shard's arrays and the coordinator's records after the strangers' calls.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from bench import malformed
from bench.malformed import OPTIMIZERS, T, model_head, push_head, stream, t
from elasticps import identity
from elasticps.api.graph import build
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.coordinator.engine import Coordinator as Engine
from elasticps.coordinator.servicer import CoordinatorServicer
from elasticps.coordinator.servicer import add_to_server as add_coordinator
from elasticps.coordinator.tasks.base import QueueSettings
from elasticps.decentralized.peer_state import PeerState
from elasticps.decentralized.rules import rule_for
from elasticps.decentralized.servicer import PeerServicer
from elasticps.decentralized.servicer import add_to_server as add_peer
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.bulk import BulkServer
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.servicer import ParameterServerServicer
from elasticps.ps.servicer import add_to_server as add_ps
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc import bulk
from elasticps.rpc.channels import create_channel
from elasticps.rpc.health import add_async_health
from elasticps.rpc.limits import ServerLimits

OK = grpc.StatusCode.OK
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
KEY = bytes(range(32))
OTHER_JOB = bytes(range(1, 33))
W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
B = np.full(3, 0.5, np.float32)
LAYOUT = {"w": ((4, 3), np.dtype("float32")), "b": ((3,), np.dtype("float32"))}
STREAMED = {"PushGradients", "PushModel", "SendModel"}
STREAMING_REPLIES = {"PullDense", "PullEmbeddings", "PullModel"}
SERVICES = {name: pb.DESCRIPTOR.services_by_name[name] for name in ("ParameterServer", "Coordinator", "Peer")}
EVERY_METHOD = [(service, method.name) for service, d in SERVICES.items() for method in d.methods]


def token(member: str, key: bytes = KEY) -> str:
    return identity.token_for(key, member)


# Tokens that name no member of this job: none, forged, another job's, not even a token.
STRANGERS = {
    "no token": "",
    "a forged mac": "worker-0." + "0" * 64,
    "another job's worker-0": identity.token_for(OTHER_JOB, "worker-0"),
    "garbage": "@#" * 20,
    "a name without a mac": "ps-0",
}


def grads(scale: float) -> list[T]:
    return [t("w", np.full_like(W, scale)), t("b", np.full_like(B, scale))]


@dataclass
class Job:
    store: ParameterStore
    engine: Engine
    peer: PeerState[dict[str, np.ndarray]]
    address: str
    bulk_port: int
    channels: list[grpc.Channel]

    def channel(self, token: str) -> grpc.Channel:
        channel = create_channel(self.address, token)
        self.channels.append(channel)
        return channel

    def call(self, token: str, service: str, method: str, request: Iterable[bytes] | bytes) -> grpc.StatusCode:
        channel = self.channel(token)
        path = f"/{SERVICES[service].full_name}/{method}"
        ident: Callable[[bytes], bytes] = lambda x: x  # noqa: E731
        try:
            if method in STREAMED:
                assert not isinstance(request, bytes)
                channel.stream_unary(path, ident, ident)(iter(request), timeout=10)
            elif method in STREAMING_REPLIES:
                assert isinstance(request, bytes)
                list(channel.unary_stream(path, ident, ident)(request, timeout=10))
            else:
                assert isinstance(request, bytes)
                channel.unary_unary(path, ident, ident)(request, timeout=10)
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            return err.code()
        return OK

    def arrays(self) -> dict[str, bytes]:
        return {k: np.ascontiguousarray(v).tobytes() for k, v in self.store.snapshot().arrays.items()}


def a_request(service: str, method: str, worker: str = "worker-0") -> Iterable[bytes] | bytes:
    """A well-formed request of ``method`` for ``worker``: what a member would send."""
    index = int(worker.rsplit("-", 1)[1]) if worker.rsplit("-", 1)[-1].isdigit() else 0
    requests: dict[str, Iterable[bytes] | bytes] = {
        "PushModel": stream(model_head(OPTIMIZERS["sgd"]), [t("w", W), t("b", B)]),
        "PushGradients": stream(push_head(version=1, worker=worker), grads(1.0)),
        "PullDense": pb.PullRequest(worker=worker).SerializeToString(),
        "PullEmbeddings": pb.EmbeddingRequest().SerializeToString(),
        "CommitRound": pb.CommitRequest(round=1).SerializeToString(),
        "DescribeShard": pb.DescribeRequest().SerializeToString(),
        "RestoreShard": pb.RestoreRequest(version=0).SerializeToString(),
        "ReadLedger": pb.LedgerRequest().SerializeToString(),
        "GetTask": pb.GetTaskRequest(worker=worker).SerializeToString(),
        "ReportTask": pb.TaskResult(worker=worker, task_id=1, success=True, records=10).SerializeToString(),
        "Heartbeat": pb.HeartbeatRequest(worker=worker).SerializeToString(),
        "JoinRound": pb.JoinRequest(worker=worker, version=1).SerializeToString(),
        "GetJobStatus": pb.JobStatusRequest().SerializeToString(),
        "SendModel": stream(pb.Frame(peer=pb.PeerHead(sender=index, iteration=1)), [t("w", W), t("b", B)]),
        "TakeTokens": pb.TokenRequest(worker=index, count=1).SerializeToString(),
        "Excuse": pb.ExcuseRequest(sender=index, through=1).SerializeToString(),
        "PullModel": pb.PeerModelRequest(worker=index).SerializeToString(),
    }
    return requests[method]


@pytest.fixture
def job(grpc_servers: Callable[..., int]) -> Iterator[Job]:
    store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.ASYNC)))
    store.initialize({"w": W, "b": B}, OptimizerConfig("sgd", {"learning_rate": 0.1}))
    engine = Engine(QueueSettings(num_records=40, records_per_task=10, num_epochs=1), version_fn=lambda: store.version)
    graph = build("ring", 3)
    peer: PeerState[dict[str, np.ndarray]] = PeerState(1, graph, rule_for(len(graph.in_neighbours(1)), 0, 0), 2)

    def register(server):  # type: ignore[no-untyped-def]
        add_ps(ParameterServerServicer(store), server)
        add_coordinator(CoordinatorServicer(engine), server)
        add_peer(PeerServicer(peer, LAYOUT), server)
        add_async_health(server).serving()

    port = grpc_servers(register, verifier=identity.Verifier(KEY))
    bulk_server = BulkServer(store, PSMetrics(CollectorRegistry(), 0), ServerLimits(), "127.0.0.1", 0,
                             verifier=identity.Verifier(KEY))
    bulk_server.start()
    engine.start()
    made = Job(store, engine, peer, f"127.0.0.1:{port}", bulk_server.port, [])
    yield made
    engine.stop()
    bulk_server.stop()
    for channel in made.channels:
        channel.close()


# ---- tokens ----------------------------------------------------------------------------------------


def test_a_token_names_its_member_under_its_key_only() -> None:
    verifier = identity.Verifier(KEY)
    assert verifier.member(token("worker-3")) == "worker-3"
    assert verifier.member(token("ps-0").encode()) == "ps-0"
    assert identity.Verifier(OTHER_JOB).member(token("worker-3")) is None
    mac = token("worker-3").rsplit(".", 1)[1]
    assert verifier.member(f"worker-4.{mac}") is None  # another member's name with this one's mac
    assert verifier.member(token("worker-3")[:-1] + "0") is None or token("worker-3").endswith("0")
    for text in STRANGERS.values():
        assert verifier.member(text) is None
    assert verifier.member("worker-1." + "a" * 600) is None


def test_every_guarded_method_has_a_rule() -> None:
    assert {method for _, method in EVERY_METHOD} == set(identity.ALLOWED)
    assert {d.full_name for d in SERVICES.values()} == set(identity.GUARDED_SERVICES)


def test_a_bad_key_is_refused_with_its_reason() -> None:
    with pytest.raises(identity.IdentityError, match="not hexadecimal"):
        identity.parse_key("zz")
    with pytest.raises(identity.IdentityError, match="at least 16"):
        identity.parse_key("00ff")


# ---- strangers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stranger", list(STRANGERS))
def test_a_stranger_is_refused_by_every_method_and_changes_nothing(job: Job, stranger: str) -> None:
    before = job.arrays()
    codes = {f"{service}.{method}": job.call(STRANGERS[stranger], service, method, a_request(service, method))
             for service, method in EVERY_METHOD}
    assert codes == {name: UNAUTHENTICATED for name in codes}
    assert job.arrays() == before
    assert job.store.version == 0
    assert job.engine.status().progress.records_done == 0
    assert job.peer.iteration == 0


def test_the_health_service_stays_open(job: Job) -> None:
    stub = health_pb2_grpc.HealthStub(job.channel(""))
    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def bulk_call(port: int, hello: str | None, method: str, request: Iterable[bytes] | bytes) -> grpc.StatusCode:
    """``malformed.bulk_call`` behind a hello with ``hello`` (None: no hello at all)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if hello is not None:
            bulk.send(sock, bulk.hello(hello) if hello.isascii() else [bulk.REQUEST.pack(bulk.MAGIC, bulk.HELLO),
                                                                    bulk.LENGTH.pack(3), b"\xff\xfe\xfd"],
                      bulk.Deadline.within(10, 10, "hello"))
        parts: list[bytes] = [bulk.REQUEST.pack(bulk.MAGIC, malformed.BULK_METHODS[method])]
        if isinstance(request, bytes):
            parts += [bulk.LENGTH.pack(len(request)), request]
        else:
            for frame in request:
                parts += [bulk.LENGTH.pack(len(frame)), frame]
            parts.append(bulk.LENGTH.pack(0))
        deadline = bulk.Deadline.within(10, 10, method)
        try:
            bulk.send(sock, parts, deadline)
        except OSError:
            pass  # refused and closed mid-request: the reply may be there
        try:
            return bulk.read_reply(sock, deadline)[0]
        except (OSError, bulk.BulkClosed):
            return grpc.StatusCode.UNAVAILABLE


BULK_STRANGERS = {**STRANGERS, "no hello": None, "bytes that are not ASCII": "\xff"}


@pytest.mark.parametrize("stranger", list(BULK_STRANGERS))
def test_a_stranger_on_the_bulk_channel_is_refused_and_changes_nothing(job: Job, stranger: str) -> None:
    before = job.arrays()
    hello = BULK_STRANGERS[stranger]
    for method in malformed.BULK_METHODS:
        assert bulk_call(job.bulk_port, hello, method, a_request("ParameterServer", method)) is UNAUTHENTICATED, method
    assert job.arrays() == before
    assert job.store.version == 0


# ---- members ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("member", "service", "method"), [
    ("observer-runner", "ParameterServer", "PushGradients"),
    ("observer-runner", "Coordinator", "ReportTask"),
    ("worker-0", "ParameterServer", "RestoreShard"),
    ("worker-0", "ParameterServer", "CommitRound"),
    ("ps-1", "ParameterServer", "PushGradients"),
    ("ps-1", "Peer", "SendModel"),
])  # fmt: skip
def test_a_member_calls_only_what_its_kind_may(job: Job, member: str, service: str, method: str) -> None:
    before = job.arrays()
    assert job.call(token(member), service, method, a_request(service, method)) is DENIED
    assert job.arrays() == before


@pytest.mark.parametrize(("service", "method"), [
    ("ParameterServer", "PushGradients"), ("Coordinator", "GetTask"), ("Coordinator", "ReportTask"),
    ("Coordinator", "Heartbeat"), ("Coordinator", "JoinRound"), ("Peer", "SendModel"), ("Peer", "TakeTokens"),
    ("Peer", "Excuse"), ("Peer", "PullModel"),
])  # fmt: skip
def test_a_worker_may_not_speak_for_another(job: Job, service: str, method: str) -> None:
    before = job.arrays()
    assert job.call(token("worker-2"), service, method, a_request(service, method, worker="worker-0")) is DENIED
    assert job.arrays() == before
    assert job.engine.status().progress.records_done == 0


def test_a_worker_may_not_push_or_join_for_another_over_the_bulk_channel(job: Job) -> None:
    before = job.arrays()
    push = stream(push_head(version=0, worker="worker-0"), grads(1.0))
    assert bulk_call(job.bulk_port, token("worker-2"), "PushGradients", push) is DENIED
    join = pb.JoinRequest(worker="worker-0", version=0).SerializeToString()
    assert bulk_call(job.bulk_port, token("worker-2"), "JoinRound", join) is DENIED
    assert job.arrays() == before


def test_members_are_served_over_grpc_and_the_bulk_channel(job: Job) -> None:
    assert job.call(token("worker-0"), "ParameterServer", "PushGradients",
                    stream(push_head(version=0, worker="worker-0"), grads(1.0))) is OK
    assert job.store.version == 1
    connection = bulk.BulkConnection("127.0.0.1", job.bulk_port, 5, 10, token=token("worker-1"))
    try:
        reply = connection.push(pb.Frame(push=pb.PushHead(worker="worker-1", version=1)),
                                {"w": np.ones_like(W), "b": np.ones_like(B)}, {})
        assert reply.accepted
        assert connection.pull(pb.PullRequest(worker="worker-1")).first.model.version == 2
    finally:
        connection.close()
    assert job.store.version == 2
    assert job.call(token("worker-0"), "Coordinator", "GetTask", a_request("Coordinator", "GetTask")) is OK
    assert job.call(token("observer-runner"), "Coordinator", "GetJobStatus", b"") is OK
    assert job.call(token("observer-runner"), "ParameterServer", "PullDense", a_request("ParameterServer", "PullDense")) is OK
    assert job.call(token("ps-1"), "ParameterServer", "DescribeShard", b"") is OK
