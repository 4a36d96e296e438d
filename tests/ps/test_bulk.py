"""The bulk channel (``rpc/bulk.py``, ``ps/bulk.py``): the same answers as gRPC frames, the same
limits, the model untouched by anything refused, and the client's fallback to gRPC frames.

The malformed pushes and pulls of ``bench/malformed.py`` (the fuzz test's cases, issue 13) are sent
over the bulk wire format: each gets the status code it gets over gRPC, and the shard's every array
is unchanged after it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from bench import malformed
from bench.malformed import INVALID, OK, Target, push_head, stream, t
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient import routes
from elasticps.ps.bulk import BulkServer
from elasticps.psclient.client import Behind, Dropped, PSClient, Pulled, PullBehind, PushRequest
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.servicer import ParameterServerServicer
from elasticps.ps.servicer import add_to_server as add_ps
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc import bulk, frames
from elasticps.rpc.limits import ServerLimits

MODES = {"sync": UpdateRule.SYNC, "async": UpdateRule.ASYNC}
W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
B = np.full(3, 0.5, np.float32)
S = np.zeros(3, np.float32)
TARGET = Target("w", "b", "bn/mean", W, B, S)
PS_CASES = malformed.ps_cases(TARGET)
BULK_CASES = {name: case for name, case in PS_CASES.items() if case.method in malformed.BULK_METHODS}
BULK_IDS = [(name, mode) for name, case in BULK_CASES.items() for mode in case.modes]
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED


@dataclass
class Shard:
    store: ParameterStore
    server: BulkServer

    def call(self, method: str, request: list[bytes] | bytes) -> grpc.StatusCode:
        return malformed.bulk_call(self.server.port, method, request)[0]

    def everything(self) -> dict[str, bytes]:
        return {k: np.ascontiguousarray(v).tobytes() for k, v in self.store.snapshot().arrays.items()}


@pytest.fixture
def make_shard() -> Iterator[Callable[..., Shard]]:
    servers: list[BulkServer] = []

    def make(mode: str, limits: ServerLimits = ServerLimits()) -> Shard:
        store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=MODES[mode])))
        store.initialize({"w": W, "b": B}, OptimizerConfig("adam", {"learning_rate": 0.001}), state={"bn/mean": S})
        server = BulkServer(store, PSMetrics(CollectorRegistry(), 0), limits, "127.0.0.1", 0)
        server.start()
        servers.append(server)
        shard = Shard(store, server)
        assert shard.call("PushGradients", stream(push_head(), malformed.good_grads(TARGET, 0.5))) is OK
        if mode == "sync":
            store.commit(0, ["fuzz"])
        assert store.version == 1
        return shard

    yield make
    for server in servers:
        server.stop()


@pytest.mark.parametrize(("case", "mode"), BULK_IDS, ids=[f"{c}-{m}" for c, m in BULK_IDS])
def test_a_bad_call_over_the_bulk_channel_is_refused_and_the_model_is_unchanged(
    make_shard: Callable[..., Shard], case: str, mode: str
) -> None:
    shard = make_shard(mode)
    everything = shard.everything()
    spec = BULK_CASES[case]
    assert shard.call(spec.method, spec.request) is spec.code
    assert shard.everything() == everything
    assert shard.call("PushGradients", stream(push_head(version=1), malformed.good_grads(TARGET))) is OK


@pytest.mark.parametrize("garbage", [b"", b"EPB1\x07", b"GET / HTTP/1.1\r\n\r\n", b"EPB1\x01" + b"\xff" * 8])
def test_bytes_that_are_no_bulk_request_are_refused(make_shard: Callable[..., Shard], garbage: bytes) -> None:
    shard = make_shard("async")
    everything = shard.everything()
    with socket.create_connection(("127.0.0.1", shard.server.port), timeout=10) as sock:
        try:
            sock.sendall(garbage)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # answered and closed already
        try:
            code, _ = bulk.read_reply(sock, bulk.Deadline.within(10, 10))
        except (bulk.BulkClosed, OSError):
            code = None  # closed without a word: nothing was under way
    assert code in (INVALID, None)
    assert shard.everything() == everything


def test_a_head_that_declares_more_than_the_model_is_refused_before_its_payload(make_shard: Callable[..., Shard]) -> None:
    shard = make_shard("async")
    huge = malformed.T("w", malformed.F32, [1 << 20, 1 << 10], b"")
    first = stream(push_head(), [huge, t("b", B)])[0]
    with socket.create_connection(("127.0.0.1", shard.server.port), timeout=10) as sock:
        # Only the head: the answer comes before any payload is sent.
        sock.sendall(bulk.REQUEST.pack(bulk.MAGIC, bulk.PUSH_GRADIENTS) + bulk.LENGTH.pack(len(first)) + first)
        code, message = bulk.read_reply(sock, bulk.Deadline.within(10, 10))
    assert code is INVALID and b"float32[1048576, 1024] in the push" in message


def test_connections_past_the_limit_are_resource_exhausted_and_the_rest_served(make_shard: Callable[..., Shard]) -> None:
    shard = make_shard("async", ServerLimits(max_push_streams=3))

    def until(count: int) -> None:
        deadline = time.monotonic() + 10
        while shard.server.connections() != count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert shard.server.connections() == count

    until(0)
    held = [socket.create_connection(("127.0.0.1", shard.server.port)) for _ in range(2)]
    try:
        until(2)
        assert shard.call("PushGradients", stream(push_head(version=1), malformed.good_grads(TARGET))) is OK
        until(2)
        held.append(socket.create_connection(("127.0.0.1", shard.server.port)))
        until(3)
        assert shard.call("PushGradients", stream(push_head(version=2), malformed.good_grads(TARGET))) is EXHAUSTED
    finally:
        for sock in held:
            sock.close()
    until(0)
    assert shard.call("PushGradients", stream(push_head(version=2), malformed.good_grads(TARGET))) is OK


@pytest.mark.parametrize("drip", [False, True])
def test_a_stalled_or_dripping_push_is_cut_off_and_nothing_is_applied(make_shard: Callable[..., Shard], drip: bool) -> None:
    limits = ServerLimits(stream_idle_s=0.3, stream_deadline_s=1.0 if drip else 30.0)
    shard = make_shard("async", limits)
    everything = shard.everything()
    first, rest = stream(push_head(version=1), malformed.good_grads(TARGET), split=8)
    with socket.create_connection(("127.0.0.1", shard.server.port), timeout=10) as sock:
        sock.sendall(bulk.REQUEST.pack(bulk.MAGIC, bulk.PUSH_GRADIENTS) + bulk.LENGTH.pack(len(first)) + first)
        sock.sendall(bulk.LENGTH.pack(len(rest)) + rest[:3])
        started = time.monotonic()
        if drip:  # a byte every 0.1 s: never idle, past the whole deadline
            for byte in rest[3:]:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break
                if time.monotonic() - started > 5:
                    break
                time.sleep(0.1)
        code, message = bulk.read_reply(sock, bulk.Deadline.within(10, 10))
    assert code is DEADLINE
    assert shard.everything() == everything


# ---- the client: over the channel, and falling back to gRPC frames ---------------------------------
@pytest.fixture
def ps(grpc_servers: Callable[..., int]) -> Iterator[Callable[..., tuple[str, ParameterStore, BulkServer | None]]]:
    servers: list[BulkServer] = []

    def start(mode: str, bulk_port: int | None) -> tuple[str, ParameterStore, BulkServer | None]:
        """A PS: gRPC, and a bulk server when ``bulk_port`` is None; else the port it advertises."""
        store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=MODES[mode])))
        metrics = PSMetrics(CollectorRegistry(), 0)
        servicer = ParameterServerServicer(store, metrics=metrics)
        server = None
        if bulk_port is None:
            server = BulkServer(store, metrics, ServerLimits(), "127.0.0.1", 0)
            server.start()
            servers.append(server)
            servicer.bulk_port = server.port
        else:
            servicer.bulk_port = bulk_port
        return f"127.0.0.1:{grpc_servers(lambda s: add_ps(servicer, s))}", store, server

    yield start
    for server in servers:
        server.stop()


def model(size: int = 3000) -> dict[str, np.ndarray]:
    return {"a": np.linspace(-1, 1, size, dtype=np.float32), "b": np.full((10, 7), 0.25, np.float64)}


def gradient(scale: float, size: int = 3000) -> dict[str, np.ndarray]:
    return {name: np.full_like(value, scale) for name, value in model(size).items()}


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_pushes_and_pulls_over_the_bulk_channel_train_as_over_grpc(
    ps: Callable[..., tuple[str, ParameterStore, BulkServer | None]], mode: str
) -> None:
    address, store, server = ps(mode, None)
    clients = [PSClient([address], worker=f"w{i}", deadline_s=10) for i in range(2)]
    try:
        versions = clients[0].push_model(model(), OptimizerConfig("sgd", {"learning_rate": 0.5}))
        expected = model()
        for step in range(3):
            for i, client in enumerate(clients):
                pushed = client.push(PushRequest(gradient(0.1 * (i + 1)), versions, minibatch=f"m{step}.{i}")).result()
                assert pushed.all_accepted
            if mode == "sync":
                store.commit(versions[0], ["w0", "w1"])
                for name in expected:
                    mean = (expected[name].dtype.type(0.1) + expected[name].dtype.type(0.2)) * expected[name].dtype.type(0.5)
                    expected[name] = expected[name] - mean * expected[name].dtype.type(0.5)
            else:
                for i in range(2):
                    for name in expected:
                        expected[name] = expected[name] - expected[name].dtype.type(0.1 * (i + 1)) * expected[name].dtype.type(0.5)
            pulled = clients[1].pull(versions=[-1])
            versions = pulled.versions
            for name, value in expected.items():
                np.testing.assert_allclose(pulled.tensors[name], value, rtol=1e-6)
        assert server is not None and server.connections() >= 1  # it went over the channel
        assert all(route is not None and route.fallbacks == 0 for route in clients[0]._routes)
    finally:
        for client in clients:
            client.close()


def test_a_blocked_bulk_port_falls_back_to_grpc_frames(
    ps: Callable[..., tuple[str, ParameterStore, BulkServer | None]]
) -> None:
    blocked = socket.socket()  # bound, never listening: connecting is refused
    blocked.bind(("127.0.0.1", 0))
    try:
        address, store, _ = ps("async", blocked.getsockname()[1])
        client = PSClient([address], worker="w", deadline_s=10)
        try:
            versions = client.push_model(model(), OptimizerConfig("sgd", {"learning_rate": 0.5}))
            assert client.push(PushRequest(gradient(0.1), versions)).result().all_accepted
            pulled = client.pull(versions=[-1])
            np.testing.assert_allclose(pulled.tensors["a"], model()["a"] - np.float32(0.1) * np.float32(0.5), rtol=1e-6)
            route = client._routes[0]
            assert route is not None and route.fallbacks >= 2
            assert store.version == 1
        finally:
            client.close()
    finally:
        blocked.close()


def test_a_shard_without_a_bulk_channel_is_served_by_grpc_frames(
    ps: Callable[..., tuple[str, ParameterStore, BulkServer | None]]
) -> None:
    address, store, _ = ps("async", 0)
    client = PSClient([address], worker="w", deadline_s=10)
    try:
        versions = client.push_model(model(), OptimizerConfig("sgd", {"learning_rate": 0.5}))
        assert client.push(PushRequest(gradient(0.1), versions)).result().all_accepted
        assert store.version == 1
        route = client._routes[0]
        assert route is not None and route.fallbacks == 1  # asked once, then not for RETRY_AFTER_S
        # A pull asked behind a push is sent after it, over gRPC frames too.
        pushed = client.push(PushRequest(gradient(0.1), [1], pull_behind=PullBehind(0))).result()
        assert pushed.behind is not None and pushed.behind.sent == 0
        pulled = pushed.behind.result()
        assert pulled.versions == [2]
        np.testing.assert_allclose(pulled.tensors["a"], model()["a"] - 2 * np.float32(0.05), rtol=1e-6)
    finally:
        client.close()


@pytest.mark.parametrize("pull_behind_ms", [None, 0])
def test_a_refusal_over_the_bulk_channel_is_the_grpc_status(
    ps: Callable[..., tuple[str, ParameterStore, BulkServer | None]], pull_behind_ms: int | None
) -> None:
    """With a pull behind the refused push too: the server closes the connection, the pull is
    never answered, and the client's next push and pull are whole."""
    address, store, server = ps("async", None)
    client = PSClient([address], worker="w", deadline_s=10)
    behind = None if pull_behind_ms is None else PullBehind(pull_behind_ms)
    try:
        versions = client.push_model(model(), OptimizerConfig("sgd", {"learning_rate": 0.5}))
        bad = gradient(0.1)
        bad["a"][7] = np.nan
        with pytest.raises(grpc.RpcError) as caught:
            client.push(PushRequest(bad, versions, pull_behind=behind)).result()
        assert isinstance(caught.value, grpc.Call) and caught.value.code() is INVALID
        assert store.version == 0
        pushed = client.push(PushRequest(gradient(0.1), versions, pull_behind=behind)).result()
        assert pushed.all_accepted
        if pushed.behind is not None:
            assert pushed.behind.result().versions == [1]
    finally:
        client.close()


def test_received_payload_lands_in_the_buffer_given() -> None:
    head = pb.Frame(push=pb.PushHead(worker="w"))
    tensors = {"x": np.arange(10, dtype=np.float32)}
    first, views = frames.describe(head, tensors)
    header = frames.payload_frame_header(40)
    left, right = socket.socketpair()
    try:
        bulk.send(left, [bulk.LENGTH.pack(len(first.SerializeToString())), first.SerializeToString(),
                         bulk.LENGTH.pack(len(header) + 40), header, *views, bulk.LENGTH.pack(0)],
                  bulk.Deadline.within(5, 5))  # fmt: skip
        buffer = np.zeros(64, dtype=np.uint8)
        deadline = bulk.Deadline.within(5, 5)
        received = bulk.receive_head(right, deadline)
        assembly = frames.Assembly(received, buffer)
        bulk.receive_payload(right, deadline, received, assembly)
        decoded = assembly.finish()
    finally:
        left.close()
        right.close()
    assert np.array_equal(decoded.tensors["x"], tensors["x"])
    assert np.shares_memory(decoded.tensors["x"], buffer)


def test_the_route_asks_again_after_a_while() -> None:
    now = [0.0]
    asked: list[int] = []

    def describe() -> int:
        asked.append(1)
        return 0

    route = routes.BulkRoute("127.0.0.1:1", describe, 5.0, clock=lambda: now[0])
    assert route.take() is None and route.take() is None
    assert len(asked) == 1
    now[0] = routes.RETRY_AFTER_S + 1
    assert route.take() is None
    assert len(asked) == 2


def test_an_idle_connection_is_not_reused_once_the_server_may_have_closed_it() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    now = [0.0]
    route = routes.BulkRoute("127.0.0.1:1", lambda: int(listener.getsockname()[1]), 5.0, clock=lambda: now[0])
    try:
        first = route.take()
        assert first is not None
        route.give_back(first)
        now[0] = routes.IDLE_REUSE_S - 1
        assert route.take() is first  # still fresh
        route.give_back(first)
        now[0] += routes.IDLE_REUSE_S + 1
        second = route.take()
        assert second is not None and second is not first and first.broken  # the stale one was closed
        second.close()
    finally:
        listener.close()


def test_a_model_is_still_pushed_over_grpc(ps: Callable[..., tuple[str, ParameterStore, BulkServer | None]]) -> None:
    address, store, server = ps("async", None)
    client = PSClient([address], worker="w", deadline_s=10)
    try:
        client.push_model(model(), OptimizerConfig("sgd", {"learning_rate": 0.5}))
        assert store.initialized
    finally:
        client.close()


def test_a_staged_sync_gradient_keeps_its_buffer_while_the_connection_pushes_again(
    make_shard: Callable[..., Shard],
) -> None:
    shard = make_shard("sync")
    connection = bulk.BulkConnection("127.0.0.1", shard.server.port, 5.0, 10.0)
    try:
        ones = {"w": np.full_like(W, 1.0), "b": np.full_like(B, 1.0)}
        threes = {"w": np.full_like(W, 3.0), "b": np.full_like(B, 3.0)}
        for worker, gradient in (("a", ones), ("b", threes)):
            head = pb.Frame(push=pb.PushHead(worker=worker, version=1))
            assert connection.push(head, gradient, {}).accepted
    finally:
        connection.close()
    shard.store.commit(1, ["a", "b"])
    # Adam's first moment after rounds of mean gradient 0.5 and 2: had the second push overwritten
    # the first's staged bytes, the second mean would be 3.
    m = shard.store.optimizer.state()["slot/m/b"]
    assert np.allclose(m, 0.9 * (0.1 * 0.5) + 0.1 * 2.0, rtol=1e-5)


def test_stop_ends_the_server_and_its_connections(make_shard: Callable[..., Shard]) -> None:
    shard = make_shard("async")
    idle = socket.create_connection(("127.0.0.1", shard.server.port), timeout=30)
    try:
        deadline = time.monotonic() + 30
        while shard.server.connections() != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert shard.server.connections() == 1  # accepted and served: stop() must shut it
        shard.server.stop()
        shard.server._thread.join(5)
        assert not shard.server._thread.is_alive()
        try:
            assert idle.recv(1) == b""  # closed by the server
        except ConnectionResetError:
            pass  # or reset
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", shard.server.port), timeout=2)
    finally:
        idle.close()


def test_a_port_that_does_not_connect_is_tried_again_later_and_later() -> None:
    blocked = socket.socket()  # bound, never listening: connecting is refused
    blocked.bind(("127.0.0.1", 0))
    now = [0.0]
    asked: list[float] = []

    def describe() -> int:
        asked.append(now[0])
        return int(blocked.getsockname()[1])

    try:
        route = routes.BulkRoute("127.0.0.1:1", describe, 5.0, clock=lambda: now[0])
        for _ in range(40):
            assert route.take() is None
            now[0] += 10.0
    finally:
        blocked.close()
    gaps = [later - earlier for earlier, later in zip(asked, asked[1:])]
    assert gaps == [30.0, 60.0, 120.0]  # twice as long after each failure


def test_a_sync_pull_sends_the_variables_holds_no_commit_back_and_says_when_one_ran() -> None:
    """A sync pull is sent from the variables' own memory, no copy, without the store's lock: a
    puller that stalls mid-send does not hold the round back. The commit that ran while it was sent
    changed the bytes under it: the reply's last byte says so, and the client pulls again."""
    big = {"w": np.linspace(-1, 1, 4 << 20, dtype=np.float32)}  # 16 MiB: more than the sockets buffer
    store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.SYNC)))
    store.initialize(big, OptimizerConfig("sgd", {"learning_rate": 0.5}))
    server = BulkServer(store, PSMetrics(CollectorRegistry(), 0), ServerLimits(), "127.0.0.1", 0)
    server.start()
    request = pb.PullRequest(version=-1).SerializeToString()
    deadline = bulk.Deadline.within(10, 10, "pull")
    try:
        stalled = socket.create_connection(("127.0.0.1", server.port), timeout=10)  # asks, reads nothing yet
        bulk.send(stalled, [bulk.REQUEST.pack(bulk.MAGIC, bulk.PULL_DENSE), bulk.LENGTH.pack(len(request)), request],
                  deadline)  # fmt: skip
        code, message = bulk.read_reply(stalled, deadline)  # the head: version 0 read, its bytes on their way
        assert code is grpc.StatusCode.OK
        head = frames.read_head(message)
        assert head.first.model.version == 0
        assert store.push({"w": np.ones_like(big["w"])}, version=0, worker="a").accepted
        assert store.commit(0, ["a"]).version == 1  # not held back by the pull, stalled on the full socket
        assembly = frames.Assembly(head)
        size = head.total - assembly.received
        bulk.recv_into(stalled, assembly.space(size), deadline)
        assert bulk.INTACT.unpack(bulk.recv_bytes(stalled, 1, deadline)) == (False,)  # version 0 changed under it
        stalled.close()
        connection = bulk.BulkConnection("127.0.0.1", server.port, 5.0, 10.0)
        try:
            pulled = connection.pull(pb.PullRequest(version=-1))  # nothing runs now: intact
            assert pulled.first.model.version == 1
            np.testing.assert_array_equal(pulled.tensors["w"], big["w"] - np.float32(0.5))
        finally:
            connection.close()
    finally:
        server.stop()


def test_a_pull_whose_model_changed_while_sent_raises_torn_and_keeps_the_connection() -> None:
    """The client's side of the intact byte: 0 after the tensors raises Torn (UNAVAILABLE, retried
    by the client), the stream read to its end, so the connection serves the next call."""
    listener = socket.create_server(("127.0.0.1", 0))
    tensors = {"w": np.arange(6, dtype=np.float32)}

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for intact in (False, True):
                bulk.REQUEST.unpack(bulk.recv_bytes(conn, bulk.REQUEST.size, deadline))
                bulk.recv_bytes(conn, bulk.recv_length(conn, deadline), deadline)
                first, views = frames.describe(pb.Frame(model=pb.ModelHead(initialized=True, version=3)), tensors, {})
                bulk.send(conn, [*bulk.reply_parts(grpc.StatusCode.OK, first.SerializeToString()), *views,
                                 bulk.INTACT.pack(intact)], deadline)  # fmt: skip

    deadline = bulk.Deadline.within(10, 10, "fake server")
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    connection = bulk.BulkConnection("127.0.0.1", listener.getsockname()[1], 5.0, 10.0)
    try:
        with pytest.raises(bulk.Torn) as torn:
            connection.pull(pb.PullRequest(version=-1))
        assert torn.value.code() is grpc.StatusCode.UNAVAILABLE
        assert not connection.broken
        np.testing.assert_array_equal(connection.pull(pb.PullRequest(version=-1)).tensors["w"], tensors["w"])
    finally:
        connection.close()
        listener.close()
        thread.join(timeout=10)


# ---- a pull behind a push --------------------------------------------------------------------------
def test_an_async_pull_behind_a_push_brings_the_model_with_the_push_in_one_round_trip(
    ps: Callable[..., tuple[str, ParameterStore, BulkServer | None]]
) -> None:
    address, store, server = ps("async", None)
    client = PSClient([address], worker="w", deadline_s=10)
    try:
        versions = client.push_model(model(), OptimizerConfig("sgd", {"learning_rate": 0.5}))
        expected = model()
        for step in range(3):
            pushed = client.push(PushRequest(gradient(0.1), versions, pull_behind=PullBehind(0))).result()
            assert pushed.all_accepted and pushed.behind is not None and pushed.behind.sent == 1
            pulled = pushed.behind.result()
            assert pushed.behind.result() is pulled  # read once
            for name in expected:
                expected[name] = expected[name] - expected[name].dtype.type(0.1) * expected[name].dtype.type(0.5)
                np.testing.assert_allclose(pulled.tensors[name], expected[name], rtol=1e-6)
            assert pulled.versions == [step + 1] == [store.version]
            versions = pulled.versions
        assert server is not None and server.connections() == 1  # push and pull on one connection
        route = client._routes[0]
        assert route is not None and route.fallbacks == 0 and len(route._idle) == 1  # given back after reading
        assert not pushed.behind.cancel()  # read already: the pooled connection is not closed
        assert not route._idle[0][0].broken
    finally:
        client.close()


def test_a_sync_pull_behind_a_gradient_is_answered_when_the_round_is_committed(
    ps: Callable[..., tuple[str, ParameterStore, BulkServer | None]]
) -> None:
    address, store, _ = ps("sync", None)
    clients = [PSClient([address], worker=f"w{i}", deadline_s=10) for i in range(2)]
    try:
        versions = clients[0].push_model(model(), OptimizerConfig("sgd", {"learning_rate": 0.5}))
        behinds = []
        for i, client in enumerate(clients):
            request = PushRequest(gradient(0.1 * (i + 1)), versions, minibatch=f"m{i}", pull_behind=PullBehind(5_000))
            pushed = client.push(request).result()
            assert pushed.all_accepted and pushed.behind is not None
            behinds.append(pushed.behind)
        answers: list[object] = []
        reader = threading.Thread(target=lambda: answers.append(behinds[0].result()))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not answers  # the shard holds the answer until the round commits
        store.commit(0, ["w0", "w1"])
        reader.join(5)
        pulled = [answers[0], behinds[1].result()]
        for answer in pulled:
            assert isinstance(answer, Pulled) and answer.versions == [1]
            mean = np.float32(0.15) * np.float32(0.5)
            np.testing.assert_allclose(answer.tensors["a"], model()["a"] - mean, rtol=1e-6)
    finally:
        for client in clients:
            client.close()


@pytest.fixture
def sync_client(
    ps: Callable[..., tuple[str, ParameterStore, BulkServer | None]]
) -> Iterator[tuple[PSClient, ParameterStore, BulkServer]]:
    """A client of a sync shard holding the model at version 0 (worker ``w0``)."""
    address, store, server = ps("sync", None)
    assert server is not None
    client = PSClient([address], worker="w0", deadline_s=10)
    try:
        client.push_model(model(), OptimizerConfig("sgd", {"learning_rate": 0.5}))
        yield client, store, server
    finally:
        client.close()


def staged(client: PSClient, wait_ms: int) -> Behind:
    """A gradient staged for round 0, and the pull behind it."""
    pushed = client.push(PushRequest(gradient(0.1), [0], minibatch="m", pull_behind=PullBehind(wait_ms))).result()
    assert pushed.all_accepted and pushed.behind is not None
    return pushed.behind


def test_a_pull_behind_whose_long_poll_ends_first_is_asked_again(
    sync_client: tuple[PSClient, ParameterStore, BulkServer]
) -> None:
    client, store, _ = sync_client
    behind = staged(client, 50)
    time.sleep(0.2)  # the shard answered "still version 0" by now
    store.commit(0, ["w0"])
    assert behind.result().versions == [1]  # asked again, not taken as the round's model


def test_a_dropped_pull_behind_closes_its_connection_and_the_client_goes_on(
    sync_client: tuple[PSClient, ParameterStore, BulkServer]
) -> None:
    client, store, server = sync_client
    behind = staged(client, 5_000)
    assert behind.cancel()
    assert not behind.cancel()  # once
    deadline = time.monotonic() + 10
    while server.connections() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.connections() == 0  # its thread left its long poll: the connection is gone
    store.commit(0, ["w0"])
    assert client.pull(versions=[0]).versions == [1]  # a new connection


def test_dropping_a_pull_behind_while_it_is_read_ends_the_read(
    sync_client: tuple[PSClient, ParameterStore, BulkServer]
) -> None:
    client, store, _ = sync_client
    behind = staged(client, 5_000)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            behind.result()
        except BaseException as err:  # noqa: BLE001 - examined below
            errors.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)  # blocked on the shard's long poll
    started = time.monotonic()
    assert behind.cancel()
    reader.join(5)
    assert not reader.is_alive() and time.monotonic() - started < 2  # not the long poll's 5 s
    assert len(errors) == 1 and isinstance(errors[0], Dropped)
    assert store.version == 0  # nothing else changed: the round is still to be committed
    store.commit(0, ["w0"])
    assert client.pull(versions=[0]).versions == [1]
