"""Embedding rows over the bulk channel (issue 38): two real shards, each with its gRPC server and
its bulk server, and real PSClients.

A pull of rows goes to every shard over its bulk connection, written to all before any answer is
read, and brings the rows gRPC frames bring; rows asked behind a push come on the push's
connection with the push in them (async), ahead of a dense pull behind it; a shard whose bulk port
does not connect is served the same rows by gRPC frames. Hostile requests are refused with the
status the gRPC call gets, and make no row."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from bench import malformed
from elasticps.api.embedding import RowGrads, TableSpec, initial_rows
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.bulk import BulkServer
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.servicer import ParameterServerServicer, add_to_server
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.psclient.client import PSClient, PullBehind, PushRequest
from elasticps.rpc import bulk
from elasticps.rpc.limits import ServerLimits

SGD = OptimizerConfig("sgd", {"learning_rate": 1.0})
TABLE = TableSpec("items", 4, seed=3)
DENSE = {"w": np.zeros(3, np.float32)}
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@dataclass
class Shards:
    stores: list[ParameterStore]
    servers: list[BulkServer | None]
    addresses: list[str]

    def client(self, use_bulk: bool = True) -> PSClient:
        client = PSClient(self.addresses, worker="worker-0", deadline_s=10.0, timeout_s=30.0, use_bulk=use_bulk)
        client.declare_tables([TABLE])
        return client


@pytest.fixture
def make_shards(grpc_servers: Callable[..., int]) -> Iterator[Callable[..., Shards]]:
    started: list[BulkServer] = []

    def make(blocked: int | None = None) -> Shards:
        """Two async shards holding the model; ``blocked``: that shard's bulk port does not connect."""
        stores, servers, addresses = [], [], []
        for shard in range(2):
            store = ParameterStore(StoreSettings(shard=shard, mode=TrainingMode(rule=UpdateRule.ASYNC)))
            metrics = PSMetrics(CollectorRegistry(), shard)
            servicer = ParameterServerServicer(store, metrics=metrics)
            server = None
            if shard == blocked:
                closed = socket.socket()  # bound, never listening: connecting is refused
                closed.bind(("127.0.0.1", 0))
                servicer.bulk_port = closed.getsockname()[1]
            else:
                server = BulkServer(store, metrics, ServerLimits(), "127.0.0.1", 0)
                server.start()
                started.append(server)
                servicer.bulk_port = server.port
            stores.append(store)
            servers.append(server)
            addresses.append(f"127.0.0.1:{grpc_servers(lambda s, v=servicer: add_to_server(v, s))}")
        made = Shards(stores, servers, addresses)
        client = made.client()
        client.push_model(DENSE, SGD)
        client.close()
        return made

    yield make
    for server in started:
        server.stop()


IDS = np.array([7, 2, 11, -4, 2**40 + 1, 0, 9], np.int64)


def test_a_pull_of_rows_over_the_bulk_channel_brings_what_grpc_frames_bring(make_shards: Callable[..., Shards]) -> None:
    shards = make_shards()
    over_bulk, over_grpc = shards.client(), shards.client(use_bulk=False)
    try:
        pulled = over_bulk.pull_embeddings({"items": IDS})
        np.testing.assert_array_equal(pulled.rows["items"], initial_rows(TABLE, IDS))
        np.testing.assert_array_equal(over_grpc.pull_embeddings({"items": IDS}).rows["items"], pulled.rows["items"])
        assert pulled.versions == [0, 0]
        assert [s.rows_held() for s in shards.stores] == [{"items": 3}, {"items": 4}]  # 2, -4, 0 | 7, 11, 2^40+1, 9
        assert all(s is not None and s.connections() == 1 for s in shards.servers)  # each shard's bulk channel
        assert all(route is not None and route.fallbacks == 0 for route in over_bulk._routes)
        only_odd = over_bulk.pull_embeddings({"items": np.array([3, 5], np.int64)})  # shard 0 is asked nothing
        np.testing.assert_array_equal(only_odd.rows["items"], initial_rows(TABLE, np.array([3, 5], np.int64)))
        assert only_odd.versions == [-1, 0]
    finally:
        over_bulk.close()
        over_grpc.close()


def test_rows_behind_a_push_hold_the_push_and_come_on_its_connection_ahead_of_the_dense_pull(
    make_shards: Callable[..., Shards],
) -> None:
    shards = make_shards()
    client = shards.client()
    try:
        pushed_ids = np.array([1, 3, 5, 8], np.int64)  # none of IDS
        before = client.pull_embeddings({"items": IDS}).rows["items"]
        grads = np.arange(16, dtype=np.float32).reshape(4, 4)
        after_ids = np.concatenate([pushed_ids, IDS])
        pushed = client.push(PushRequest({"w": np.ones(3, np.float32)}, [0, 0],
                                         embeddings={"items": RowGrads(pushed_ids, grads)},
                                         rows_behind={"items": after_ids}, pull_behind=PullBehind())).result()  # fmt: skip
        assert pushed.all_accepted and pushed.rows is not None and pushed.behind is not None
        rows = pushed.rows.rows["items"]
        np.testing.assert_allclose(rows[:4], initial_rows(TABLE, pushed_ids) - grads, rtol=1e-6)  # the push is in them
        np.testing.assert_array_equal(rows[4:], before)
        assert pushed.rows.versions == [1, 1]
        dense = pushed.behind.result()  # the dense pull, read after the rows on the same connection
        np.testing.assert_allclose(dense.tensors["w"], -np.ones(3, np.float32))
        assert dense.versions == [1, 1]
        assert all(s is not None and s.connections() == 1 for s in shards.servers)
        assert all(route is not None and route.fallbacks == 0 and len(route._idle) == 1 for route in client._routes)
    finally:
        client.close()


def test_rows_of_a_shard_whose_bulk_port_does_not_connect_come_by_grpc_frames(make_shards: Callable[..., Shards]) -> None:
    shards = make_shards(blocked=1)
    client = shards.client()
    try:
        ids = np.array([1, 2, 3], np.int64)
        pushed = client.push(PushRequest({"w": np.ones(3, np.float32)}, [0, 0],
                                         embeddings={"items": RowGrads(ids, np.ones((3, 4), np.float32))},
                                         rows_behind={"items": IDS})).result()  # fmt: skip
        assert pushed.rows is not None
        np.testing.assert_array_equal(pushed.rows.rows["items"], client.pull_embeddings({"items": IDS}).rows["items"])
        np.testing.assert_allclose(client.pull_embeddings({"items": ids}).rows["items"],
                                   initial_rows(TABLE, ids) - 1, rtol=1e-6)  # fmt: skip
        blocked = client._routes[1]
        assert blocked is not None and blocked.fallbacks >= 1
        assert [s.version for s in shards.stores] == [1, 1]  # each push applied once
    finally:
        client.close()


def rows_request(*tables: pb.EmbeddingIds) -> bytes:
    return pb.EmbeddingRequest(worker="worker-0", tables=list(tables)).SerializeToString()


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (rows_request(pb.EmbeddingIds(table="items", ids=b"\x01\x02\x03")), INVALID, "not a whole number of int64s"),
        (rows_request(pb.EmbeddingIds(table="nope", ids=np.int64(2).tobytes())), INVALID, "no embedding table 'nope'"),
        (rows_request(pb.EmbeddingIds(table="items", ids=np.int64(1).tobytes())), INVALID, "belongs to shard 1, not 0"),
        (rows_request(pb.EmbeddingIds(table="items"), pb.EmbeddingIds(table="items")), INVALID, "twice"),
        (b"\xff\xff\xff", INVALID, "not a valid message"),
    ],
)
def test_a_hostile_pull_of_rows_over_the_bulk_channel_is_refused_and_makes_no_row(
    make_shards: Callable[..., Shards], request_: bytes, code: grpc.StatusCode, message: str
) -> None:
    shards = make_shards()
    server = shards.servers[0]
    assert server is not None
    got, said = malformed.bulk_call(server.port, "PullEmbeddings", request_)
    assert got is code and message.encode() in said, said
    assert shards.stores[0].rows_held() == {"items": 0}


def test_a_pull_of_rows_declaring_more_bytes_than_any_request_is_refused_before_they_come(
    make_shards: Callable[..., Shards],
) -> None:
    shards = make_shards()
    server = shards.servers[0]
    assert server is not None
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(bulk.REQUEST.pack(bulk.MAGIC, bulk.PULL_ROWS) + bulk.LENGTH.pack(bulk.MAX_ROWS_REQUEST_BYTES + 1))
        code, message = bulk.read_reply(sock, bulk.Deadline.within(10, 10))
    assert code is INVALID and b"a request of" in message
    assert shards.stores[0].rows_held() == {"items": 0}


def test_a_pull_of_rows_from_a_shard_without_a_model_is_failed_precondition() -> None:
    store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.ASYNC)))
    server = BulkServer(store, PSMetrics(CollectorRegistry(), 0), ServerLimits(), "127.0.0.1", 0)
    server.start()
    try:
        request = rows_request(pb.EmbeddingIds(table="items", ids=np.int64(2).tobytes()))
        code, _ = malformed.bulk_call(server.port, "PullEmbeddings", request)
        assert code is grpc.StatusCode.FAILED_PRECONDITION
    finally:
        server.stop()
