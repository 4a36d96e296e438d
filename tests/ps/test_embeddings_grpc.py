"""Embedding tables over real gRPC (issue 17): two shards (real servers and servicers), real PSClients.

The tables go with the model to both shards; a pull asks each shard for its ids (id mod 2) at once
and puts the rows back in the order asked; a push's row gradients reach the shard of each id, over
gRPC frames and over the bulk channel alike. Hostile pulls and pushes are refused with a status
naming what is wrong, and change nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest

from elasticps.api.embedding import TableSpec, initial_rows
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.api.embedding import RowGrads
from elasticps.psclient.client import PSClient, PushRequest
from elasticps.ps.servicer import ParameterServerServicer, add_to_server
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc import frames
from elasticps.rpc.channels import create_channel

SGD = OptimizerConfig("sgd", {"learning_rate": 1.0})
TABLE = TableSpec("items", 4, seed=3)
DENSE = {"w": np.zeros(3, np.float32)}


@pytest.fixture
def cluster(grpc_servers: Callable[..., int]) -> Iterator[tuple[list[ParameterStore], list[str], PSClient]]:
    stores = [ParameterStore(StoreSettings(shard=i, mode=TrainingMode(rule=UpdateRule.ASYNC))) for i in range(2)]
    addresses = []
    for store in stores:
        servicer = ParameterServerServicer(store)
        addresses.append(f"127.0.0.1:{grpc_servers(lambda server, s=servicer: add_to_server(s, server))}")
    client = PSClient(addresses, worker="w", deadline_s=10.0, timeout_s=30.0, use_bulk=False)
    client.declare_tables([TABLE])
    client.push_model(DENSE, SGD)
    yield stores, addresses, client
    client.close()


def test_rows_come_from_the_shard_of_each_id_in_the_order_asked(cluster: tuple[list[ParameterStore], list[str], PSClient]) -> None:
    stores, _, client = cluster
    ids = np.array([7, 2, 11, -4, 2**40 + 1], np.int64)
    pulled = client.pull_embeddings({"items": ids})
    np.testing.assert_array_equal(pulled.rows["items"], initial_rows(TABLE, ids))
    assert [s.rows_held() for s in stores] == [{"items": 2}, {"items": 3}]  # 2, -4 | 7, 11, 2^40+1


def test_a_push_updates_each_row_on_its_shard(cluster: tuple[list[ParameterStore], list[str], PSClient]) -> None:
    stores, _, client = cluster
    ids = np.array([1, 2, 3, 4], np.int64)
    before = client.pull_embeddings({"items": ids}).rows["items"]
    grads = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert client.push(PushRequest({"w": np.ones(3, np.float32)}, [0, 0],
                                   embeddings={"items": RowGrads(ids, grads)})).result().all_accepted
    after = client.pull_embeddings({"items": ids})
    np.testing.assert_allclose(after.rows["items"], before - grads, rtol=1e-6)
    assert after.versions == [1, 1]


def pull_raw(address: str, request: bytes) -> grpc.RpcError:
    channel = create_channel(address)
    try:
        call = channel.unary_stream(f"/{frames.PS_SERVICE.full_name}/PullEmbeddings", request_serializer=None,
                                    response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            list(call(request, timeout=10))
        return caught.value
    finally:
        channel.close()


@pytest.mark.parametrize(
    "request_, message",
    [
        (pb.EmbeddingRequest(tables=[pb.EmbeddingIds(table="items", ids=b"\x01\x02\x03")]).SerializeToString(),
         "not a whole number of int64s"),
        (pb.EmbeddingRequest(tables=[pb.EmbeddingIds(table="nope", ids=np.int64(2).tobytes())]).SerializeToString(),
         "no embedding table 'nope'"),
        (pb.EmbeddingRequest(tables=[pb.EmbeddingIds(table="items", ids=np.int64(1).tobytes())]).SerializeToString(),
         "belongs to shard 1, not 0"),
        (pb.EmbeddingRequest(tables=[pb.EmbeddingIds(table="items", ids=b""), pb.EmbeddingIds(table="items", ids=b"")]
                             ).SerializeToString(), "twice"),
        (b"\xff\xff\xff", "not a valid message"),
    ],
)
def test_a_hostile_pull_is_refused_and_makes_no_row(cluster: tuple[list[ParameterStore], list[str], PSClient],
                                                    request_: bytes, message: str) -> None:
    stores, addresses, _ = cluster
    err = pull_raw(addresses[0], request_)
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert message in (err.details() or "")  # type: ignore[attr-defined]
    assert stores[0].rows_held() == {"items": 0}


def test_a_push_of_rows_with_nan_or_of_another_table_changes_nothing(
    cluster: tuple[list[ParameterStore], list[str], PSClient],
) -> None:
    stores, _, client = cluster
    ids = np.array([2, 4], np.int64)
    before = client.pull_embeddings({"items": ids}).rows["items"]
    for rows, message in (
        ({"items": RowGrads(ids, np.full((2, 4), np.nan, np.float32))}, "NaN or infinity"),
        ({"items": RowGrads(ids, np.ones((2, 3), np.float32))}, "expected float32[n, 4]"),
        ({"other": RowGrads(ids, np.ones((2, 4), np.float32))}, "no embedding table 'other'"),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            client.push(PushRequest({"w": np.ones(3, np.float32)}, [0, 0], embeddings=rows)).result()
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert message in (caught.value.details() or "")  # type: ignore[attr-defined]
    after = client.pull_embeddings({"items": ids})
    np.testing.assert_array_equal(after.rows["items"], before)
    assert after.versions[0] == 0  # shard 0 (ids 2, 4) applied nothing, its dense part neither


def test_frames_carry_table_parts_apart_from_the_variables() -> None:
    ids, grads = np.array([5, 9], np.int64), np.ones((2, 4), np.float32)
    head = pb.Frame(push=pb.PushHead(worker="w"))
    decoded = frames.decode(frames.encode(head, {"ids": np.zeros(1, np.float32)}, 7,
                                          embeddings={"items": {"ids": ids, "gradient": grads}}))
    assert list(decoded.tensors) == ["ids"]  # a variable may share a part's name: tables are apart
    np.testing.assert_array_equal(decoded.embeddings["items"]["ids"], ids)
    np.testing.assert_array_equal(decoded.embeddings["items"]["gradient"], grads)
    assert frames.tensor_bytes(decoded) == 4 + ids.nbytes + grads.nbytes



def push_model_raw(grpc_servers: Callable[..., int], table: pb.EmbeddingTable) -> tuple[ParameterStore, grpc.RpcError | None]:
    """A fresh shard, and the status of a PushModel declaring ``table`` as a peer sends it (None: accepted)."""
    store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.ASYNC)))
    port = grpc_servers(lambda server: add_to_server(ParameterServerServicer(store), server))
    head = pb.Frame(model=pb.ModelHead(initialized=True, optimizer=pb.OptimizerConfig(name="sgd"), tables=[table], shards=1))
    channel = create_channel(f"127.0.0.1:{port}")
    try:
        call = channel.stream_unary(f"/{frames.PS_SERVICE.full_name}/PushModel", request_serializer=None,
                                    response_deserializer=pb.ModelHead.FromString)
        call(frames.encode(head, DENSE, frames.CHUNK_BYTES), timeout=10)
        return store, None
    except grpc.RpcError as err:
        return store, err
    finally:
        channel.close()


def test_a_model_declaring_a_table_of_an_unknown_kind_is_refused_naming_it(grpc_servers: Callable[..., int]) -> None:
    table = pb.EmbeddingTable(name="items", dim=4, initializer="uniform", scale=0.05, seed=3, kind="frobnicated")
    store, err = push_model_raw(grpc_servers, table)
    assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "table kind 'frobnicated' is unknown" in (err.details() or "")  # type: ignore[attr-defined]
    assert store.layout is None  # nothing installed


def test_a_model_from_a_peer_before_kinds_declares_embedding_tables(grpc_servers: Callable[..., int]) -> None:
    table = pb.EmbeddingTable(name="items", dim=4, initializer="uniform", scale=0.05, seed=3)  # no kind
    store, err = push_model_raw(grpc_servers, table)
    assert err is None and store.layout is not None and store.layout.tables == {"items": TABLE}
