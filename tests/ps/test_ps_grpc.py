"""The PS over real gRPC: two in-process servers (two shards) with the real servicer, and PSClient."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
import pytest

from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc
from elasticps.psclient.client import ModelMismatch, PSClient, Pulled, PushRequest, ShardsUninitialized
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.servicer import ParameterServerServicer, add_to_server
from elasticps.psclient.sharding import Piece, Placed, Placement, place, tensor_infos
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc.channels import create_channel

SGD = OptimizerConfig("sgd", {"learning_rate": 0.1})
T = TypeVar("T")
NAMES = ("dense/kernel:0", "dense/bias:0", "embedding/embeddings:0", "conv2d/kernel:0")


def model() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "dense/kernel:0": rng.standard_normal((4, 3)).astype(np.float32),
        "dense/bias:0": rng.standard_normal(3).astype(np.float32),
        "embedding/embeddings:0": rng.standard_normal((10, 2)),
        "conv2d/kernel:0": rng.standard_normal((3, 3, 1, 2)).astype(np.float32),
    }


# With 2 shards, by size: the embedding (160 bytes) on shard 0, the other three on shard 1.
PLACEMENT = place(tensor_infos(model()), 2)


def home(name: str) -> int:
    """The shard the client places ``name`` on (the model has nothing big enough to split)."""
    (shard,) = PLACEMENT.shards_of(name)
    return shard


def gradients(scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {n: (rng.standard_normal(v.shape) * scale).astype(v.dtype) for n, v in model().items()}


def sgd_step(params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float) -> dict[str, np.ndarray]:
    return {n: p - grads[n] * p.dtype.type(lr) for n, p in params.items()}


def assert_tensors(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        assert got[name].shape == value.shape, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def stored(store: ParameterStore) -> dict[str, np.ndarray]:
    with store.reading() as (_, _, variables):
        return {n: v.copy() for n, v in variables.items()}


def ps_register(store: ParameterStore, chunk_bytes: int | None = None) -> Callable[[grpc.Server], None]:
    servicer = ParameterServerServicer(store) if chunk_bytes is None else ParameterServerServicer(store, chunk_bytes)
    return lambda server: add_to_server(servicer, server)


@dataclass
class Cluster:
    stores: list[ParameterStore]
    addresses: list[str]
    client: PSClient

    def commit(self, round_: int, workers: Sequence[str] = ("worker-0",), dry_run: bool = False) -> list[int]:
        """Sync: commits round ``round_`` on every shard through its CommitRound RPC; the versions."""
        return [commit_round(a, round_, workers, dry_run) for a in self.addresses]


def commit_round(address: str, round_: int, workers: Sequence[str], dry_run: bool = False) -> int:
    channel, stub = raw_stub(address)
    try:
        request = pb.CommitRequest(round=round_, workers=list(workers), dry_run=dry_run)
        reply: pb.CommitReply = stub.CommitRound(request, timeout=30)
        return reply.version
    finally:
        channel.close()


@pytest.fixture
def make_cluster(grpc_servers: Callable[..., int]) -> Iterator[Callable[..., Cluster]]:
    clients: list[PSClient] = []

    def make(shards: int = 2, rule: UpdateRule = UpdateRule.SYNC, chunk_bytes: int = 1 << 20) -> Cluster:
        mode = TrainingMode(rule=rule)
        stores = [ParameterStore(StoreSettings(shard=i, mode=mode)) for i in range(shards)]
        addresses = [f"127.0.0.1:{grpc_servers(ps_register(s))}" for s in stores]
        client = PSClient(addresses, worker="worker-0", chunk_bytes=chunk_bytes, deadline_s=30.0, timeout_s=60.0)
        clients.append(client)
        return Cluster(stores, addresses, client)

    yield make
    for client in clients:
        client.close()


def test_model_names_really_span_both_shards() -> None:
    assert sorted({home(n) for n in NAMES}) == [0, 1]


def test_push_model_then_pull_returns_it_split_across_shards(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    assert c.client.push_model(model(), SGD) == [0, 0]
    for shard, store in enumerate(c.stores):
        assert store.initialized
        want = {n: v for n, v in model().items() if home(n) == shard}
        assert want  # each shard holds some variables
        assert_tensors(stored(store), want)
        assert store.optimizer.config.name == "sgd"
        assert store.optimizer.learning_rate == 0.1
    pulled = c.client.pull([-1, -1])
    assert pulled.versions == [0, 0]
    assert pulled.uninitialized == []
    assert_tensors(pulled.tensors, model())


def test_pull_with_current_versions_returns_no_tensors(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD)
    pulled = c.client.pull([0, 0])
    assert pulled.versions == [0, 0]
    assert pulled.tensors == {}
    # One shard current, the other not: only the other's variables come.
    partly = c.client.pull([0, -1])
    assert_tensors(partly.tensors, {n: v for n, v in model().items() if home(n) == 1})


def test_second_push_model_keeps_the_first(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD)
    c.client.push(PushRequest(gradients(), [0, 0])).result()
    assert c.commit(0) == [1, 1]
    other = {n: v + 1 for n, v in model().items()}
    assert c.client.push_model(other, OptimizerConfig("adam", {})) == [1, 1]
    assert_tensors(c.client.pull([-1, -1]).tensors, sgd_step(model(), gradients(), 0.1))


def test_push_model_of_another_model_is_a_model_mismatch_naming_the_difference(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD)
    reshaped = {n: v.reshape(-1) for n, v in model().items()}
    with pytest.raises(ModelMismatch, match="in the pushed model"):
        c.client.push_model(reshaped, SGD)
    assert_tensors(c.client.pull([-1, -1]).tensors, model())


def test_a_push_updates_every_shard(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD)
    pushed = c.client.push(PushRequest(gradients(), [0, 0])).result()
    assert pushed.accepted == [True, True]
    assert pushed.all_accepted
    assert pushed.versions == [0, 0]  # staged: nothing moves before the round is committed
    assert c.client.pull([0, 0]).tensors == {}
    assert c.commit(0) == [1, 1]
    pulled = c.client.pull([0, 0])
    assert pulled.versions == [1, 1]
    expected = sgd_step(model(), gradients(), 0.1)
    assert_tensors(pulled.tensors, expected)

    # A stale gradient (sync, tolerance 0) is rejected by every shard and changes nothing.
    stale = c.client.push(PushRequest(gradients(5.0), [0, 0])).result()
    assert stale.accepted == [False, False]
    assert not stale.all_accepted
    assert stale.versions == [1, 1]
    assert_tensors(c.client.pull([-1, -1]).tensors, expected)

    # The push's learning rate travels.
    c.client.push(PushRequest(gradients(), [1, 1], learning_rate=0.5)).result()
    c.commit(1)
    assert_tensors(c.client.pull([-1, -1]).tensors, sgd_step(expected, gradients(), 0.5))


def test_background_pushes_many_in_flight(make_cluster: Callable[..., Cluster]) -> None:
    """More background pushes in flight than the client's fan-out threads: no deadlock, applied in order."""
    c = make_cluster(rule=UpdateRule.ASYNC)
    c.client.push_model(model(), SGD)
    pushes = 8  # > 2 x num_shards, the fan-out pool's size
    futures = [c.client.push(PushRequest(gradients(), [0, 0], background=True)) for _ in range(pushes)]
    results = [f.result(timeout=120) for f in futures]  # a deadlock fails here instead of hanging
    assert [r.versions for r in results] == [[i, i] for i in range(1, pushes + 1)]
    assert all(r.all_accepted for r in results)
    pulled = c.client.pull([-1, -1])
    assert pulled.versions == [pushes, pushes]
    expected = model()
    for _ in range(pushes):
        expected = sgd_step(expected, gradients(), 0.1)
    assert_tensors(pulled.tensors, expected)


def test_long_poll_pull_answers_when_the_version_moves(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(shards=1)
    c.client.push_model(model(), SGD)
    # Nothing moves: the poll ends (after wait_ms) with no tensors.
    idle = c.client.pull([0], wait_ms=50)
    assert (idle.versions, idle.tensors) == ([0], {})
    results: list[Pulled] = []

    def poll() -> None:
        results.append(c.client.pull([0], wait_ms=60_000))

    poller = threading.Thread(target=poll)
    poller.start()
    c.client.push(PushRequest(gradients(), [0])).result()
    c.commit(0)
    poller.join(60)
    assert not poller.is_alive()
    (pulled,) = results
    assert pulled.versions == [1]
    assert_tensors(pulled.tensors, sgd_step(model(), gradients(), 0.1))


def bad_everywhere(kind: str) -> dict[str, np.ndarray]:
    grads = gradients()
    if kind == "wrong shape":
        return {n: np.zeros((*g.shape, 2), dtype=g.dtype) for n, g in grads.items()}
    for g in grads.values():
        g.reshape(-1)[0] = np.nan
    return grads


@pytest.mark.parametrize("kind", ["wrong shape", "nan"])
def test_bad_gradient_is_invalid_argument_and_changes_nothing(make_cluster: Callable[..., Cluster], kind: str) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD)
    with pytest.raises(grpc.RpcError) as raised:
        c.client.push(PushRequest(bad_everywhere(kind), [0, 0])).result()
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    pulled = c.client.pull([-1, -1])
    assert pulled.versions == [0, 0]
    assert_tensors(pulled.tensors, model())


def test_infinite_learning_rate_is_invalid_argument(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD)
    with pytest.raises(grpc.RpcError) as raised:
        c.client.push(PushRequest(gradients(), [0, 0], learning_rate=float("inf"))).result()
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert c.client.push(PushRequest(gradients(), [0, 0])).result().all_accepted
    c.commit(0)
    assert_tensors(c.client.pull([-1, -1]).tensors, sgd_step(model(), gradients(), 0.1))


def test_bad_gradient_for_one_shard_leaves_that_shard_unchanged(make_cluster: Callable[..., Cluster]) -> None:
    """Shards are independent: the shard with the bad variable refuses, the other stages its part;
    the dry run of a round naming the push then fails on shard 1, so no shard applies it."""
    c = make_cluster()
    c.client.push_model(model(), SGD)
    grads = gradients()
    grads["dense/bias:0"] = np.array([1.0, np.nan, 0.0], dtype=np.float32)  # shard 1
    with pytest.raises(grpc.RpcError) as raised:
        c.client.push(PushRequest(grads, [0, 0])).result()
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert commit_round(c.addresses[0], 0, ["worker-0"], dry_run=True) == 0
    with pytest.raises(grpc.RpcError) as refused:
        commit_round(c.addresses[1], 0, ["worker-0"], dry_run=True)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert [s.version for s in c.stores] == [0, 0]
    assert_tensors(c.client.pull([-1, -1]).tensors, model())
    # In async the shard that took its part applies it at once.
    a = make_cluster(rule=UpdateRule.ASYNC)
    a.client.push_model(model(), SGD)
    with pytest.raises(grpc.RpcError):
        a.client.push(PushRequest(grads, [0, 0])).result()
    assert [s.version for s in a.stores] == [1, 0]
    expected = {n: (sgd_step({n: v}, grads, 0.1)[n] if home(n) == 0 else v) for n, v in model().items()}
    assert_tensors(a.client.pull([-1, -1]).tensors, expected)


def test_uninitialised_shards(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    pulled = c.client.pull([-1, -1])
    assert pulled.uninitialized == [0, 1]
    assert pulled.tensors == {}
    with pytest.raises(ShardsUninitialized) as raised:
        c.client.push(PushRequest(gradients(), [0, 0])).result()
    assert raised.value.shards == [0, 1]
    assert [s.initialized for s in c.stores] == [False, False]


def test_one_uninitialised_shard_is_named(make_cluster: Callable[..., Cluster]) -> None:
    """Shard 1 lost its model (restarted without a checkpoint); shard 0 still has one."""
    c = make_cluster()
    c.stores[0].initialize(PLACEMENT.split(model())[0], SGD)
    assert c.client.pull([-1, -1]).uninitialized == [1]
    with pytest.raises(ShardsUninitialized) as raised:
        c.client.push(PushRequest(gradients(), [0, 0])).result()
    assert raised.value.shards == [1]
    # Re-pushing the model initialises shard 1 and leaves shard 0's model alone.
    assert c.client.push_model(model(), SGD) == [0, 0]
    assert c.client.push(PushRequest(gradients(), [0, 0])).result().accepted == [True, True]


def test_one_shard_client(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(shards=1)
    with pytest.raises(ShardsUninitialized) as raised:
        c.client.push(PushRequest(gradients(), [0])).result()
    assert raised.value.shards == [0]
    c.client.push_model(model(), SGD)
    assert_tensors(stored(c.stores[0]), model())
    assert c.client.push(PushRequest(gradients(), [0])).result().versions == [0]
    assert c.commit(0) == [1]


@pytest.mark.parametrize("rule", [UpdateRule.SYNC, UpdateRule.ASYNC], ids=["sync", "async"])
def test_a_20_mb_variable_round_trips_in_chunks(make_cluster: Callable[..., Cluster], rule: UpdateRule) -> None:
    c = make_cluster(rule=rule)
    big = np.arange(5_000_000, dtype=np.float32)  # 20 MB, on one shard
    small = np.ones(3, dtype=np.float32)
    tensors = {"big/kernel:0": big, "dense/bias:0": small}
    c.client.push_model(tensors, SGD)
    assert_tensors(c.client.pull([-1, -1]).tensors, tensors)
    grads = {"big/kernel:0": np.full(5_000_000, 2.0, dtype=np.float32), "dense/bias:0": np.ones(3, dtype=np.float32)}
    assert c.client.push(PushRequest(grads, [0, 0])).result().all_accepted
    if rule is UpdateRule.SYNC:
        c.commit(0)
    pulled = c.client.pull([-1, -1])
    assert_tensors(pulled.tensors, sgd_step(tensors, grads, 0.1))


def test_small_client_and_server_chunks(grpc_servers: Callable[..., int]) -> None:
    store = ParameterStore(StoreSettings())
    port = grpc_servers(ps_register(store, chunk_bytes=100))
    client = PSClient([f"127.0.0.1:{port}"], worker="w", chunk_bytes=64, deadline_s=30.0)
    try:
        client.push_model(model(), SGD)
        assert_tensors(client.pull([-1]).tensors, model())
    finally:
        client.close()


def all_on_last(num_shards: int) -> Placement:
    """A placement made by hand: every tensor whole on the last shard."""
    return Placement(num_shards, [Placed(t, (Piece(t.name, num_shards - 1),)) for t in tensor_infos(model())])


def test_client_with_a_placement_made_by_hand_pushes_and_pulls_through_it(grpc_servers: Callable[..., int]) -> None:
    stores = [ParameterStore(StoreSettings(shard=i)) for i in range(2)]
    addresses = [f"127.0.0.1:{grpc_servers(ps_register(s))}" for s in stores]
    placement = all_on_last(2)
    client = PSClient(addresses, worker="w", deadline_s=30.0, placement=placement)
    try:
        assert client.placement is placement
        assert placement.shards_of("dense/kernel:0") == (1,)
        assert client.push_model(model(), SGD) == [0, 0]
        assert_tensors(stored(stores[0]), {})  # shard 0 initialised with nothing
        assert_tensors(stored(stores[1]), model())
        assert_tensors(client.pull([-1, -1]).tensors, model())
        pushed = client.push(PushRequest(gradients(), [0, 0])).result()
        assert pushed.accepted == [True, True]
        assert [commit_round(a, 0, ["w"]) for a in addresses] == [1, 1]
        expected = sgd_step(model(), gradients(), 0.1)
        assert_tensors(stored(stores[1]), expected)
        pulled = client.pull([0, 0])
        assert pulled.versions == [1, 1]
        assert_tensors(pulled.tensors, expected)
        # A client placing by size finds shard 1 holding what it puts on shard 0: refused, named.
        other = PSClient(addresses, worker="x", deadline_s=30.0)
        try:
            other.place(model())
            with pytest.raises(ModelMismatch, match="placed by another rule"):
                other.pull([-1, -1])
        finally:
            other.close()
    finally:
        client.close()


def test_client_refuses_a_placement_for_another_number_of_shards() -> None:
    with pytest.raises(ValueError, match="3 shards"):
        PSClient(["127.0.0.1:1", "127.0.0.1:2"], worker="w", placement=all_on_last(3))


# ---- malformed streams with the raw stub --------------------------------------------------------


def raw_stub(address: str) -> tuple[grpc.Channel, pb_grpc.ParameterServerStub]:
    channel = create_channel(address)
    return channel, pb_grpc.ParameterServerStub(channel)


def claiming(head: pb.Frame, shape: list[int], payload: bytes) -> pb.Frame:
    head.tensors.add(name="dense/kernel:0", dtype=pb.DTYPE_FLOAT32, shape=shape)
    head.payload = payload
    return head


MALFORMED: dict[str, tuple[str, list[pb.Frame]]] = {
    "gradients: fewer bytes than claimed": (
        "PushGradients",
        [claiming(pb.Frame(push=pb.PushHead(version=0)), [4, 3], b"\x00" * 10)],
    ),
    "gradients: more bytes than claimed": (
        "PushGradients",
        [claiming(pb.Frame(push=pb.PushHead(version=0)), [4, 3], b"\x00" * 48), pb.Frame(payload=b"x")],
    ),
    "gradients: a model head": (
        "PushGradients",
        [claiming(pb.Frame(model=pb.ModelHead()), [4, 3], b"\x00" * 48)],
    ),
    "gradients: no frames": ("PushGradients", []),
    "gradients: impossible size": (
        "PushGradients",
        [claiming(pb.Frame(push=pb.PushHead(version=0)), [2**40, 2**20], b"")],
    ),
    "model: fewer bytes than claimed": (
        "PushModel",
        [claiming(pb.Frame(model=pb.ModelHead(optimizer=pb.OptimizerConfig(name="sgd"))), [4, 3], b"\x00")],
    ),
    "model: a push head": ("PushModel", [claiming(pb.Frame(push=pb.PushHead()), [4, 3], b"\x00" * 48)]),
    "model: unknown optimizer": (
        "PushModel",
        [claiming(pb.Frame(model=pb.ModelHead(optimizer=pb.OptimizerConfig(name="lion"))), [1], b"\x00" * 4)],
    ),
    "model: an integer variable": (
        "PushModel",
        [
            pb.Frame(
                model=pb.ModelHead(optimizer=pb.OptimizerConfig(name="sgd")),
                tensors=[pb.TensorMeta(name="steps", dtype=pb.DTYPE_INT64, shape=[1])],
                payload=b"\x00" * 8,
            )
        ],
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_stream_is_invalid_argument(make_cluster: Callable[..., Cluster], case: str) -> None:
    method, stream = MALFORMED[case]
    c = make_cluster(shards=1)
    if method == "PushGradients":
        c.client.push_model({"dense/kernel:0": model()["dense/kernel:0"]}, SGD)
    channel, stub = raw_stub(c.addresses[0])
    try:
        with pytest.raises(grpc.RpcError) as raised:
            getattr(stub, method)(iter(stream), timeout=30)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()
    assert c.stores[0].version == 0
    if method == "PushGradients":
        assert_tensors(stored(c.stores[0]), {"dense/kernel:0": model()["dense/kernel:0"]})
    else:
        assert c.stores[0].initialized is False


def test_pull_from_raw_stub_is_one_head_frame_when_current(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(shards=1)
    c.client.push_model(model(), SGD)
    channel, stub = raw_stub(c.addresses[0])
    try:
        replies = list(stub.PullDense(pb.PullRequest(worker="w", version=0), timeout=30))
    finally:
        channel.close()
    assert len(replies) == 1
    assert replies[0].model.initialized is True
    assert replies[0].model.version == 0
    assert len(replies[0].tensors) == 0
    assert replies[0].payload == b""


# ---- start-up race --------------------------------------------------------------------------------


def free_port() -> int:
    """A port that was free a moment ago: bind port 0, read it, close the socket."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_client_waits_for_a_server_that_starts_later(
    grpc_servers: Callable[..., int], caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that starts before its PS retries UNAVAILABLE until the PS serves."""
    port = free_port()
    store = ParameterStore(StoreSettings())
    failures: list[BaseException] = []

    def start_later() -> None:
        time.sleep(1.0)
        try:
            grpc_servers(ps_register(store), port)
        except BaseException as err:  # reported by the assertion below
            failures.append(err)

    starter = threading.Thread(target=start_later)
    client = PSClient([f"127.0.0.1:{port}"], worker="early", deadline_s=60.0, timeout_s=30.0)
    starter.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="elasticps.rpc.status"):
            assert client.push_model(model(), SGD) == [0]
        assert_tensors(client.pull([-1]).tensors, model())
    finally:
        starter.join(30)
        client.close()
    assert failures == []
    assert store.initialized
    # It really was refused first and retried.
    assert any("PushModel: UNAVAILABLE" in r.getMessage() for r in caplog.records)


# ---- sync rounds over the wire ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("round_", "workers"),
    [(1, ["worker-0"]), (0, []), (0, ["worker-0", "worker-0"]), (0, ["worker-0", "ghost"])],
    ids=["round ahead", "no workers", "a worker twice", "missing gradient"],
)
def test_a_commit_the_shard_refuses_is_failed_precondition_and_changes_nothing(
    make_cluster: Callable[..., Cluster], round_: int, workers: list[str]
) -> None:
    c = make_cluster(shards=1)
    c.client.push_model(model(), SGD)
    c.client.push(PushRequest(gradients(), [0])).result()
    with pytest.raises(grpc.RpcError) as raised:
        c.commit(round_, workers)
    assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert c.stores[0].version == 0
    assert_tensors(stored(c.stores[0]), model())
    assert c.commit(0) == [1]  # the staged gradient is still there


def test_commit_round_on_an_empty_shard_is_failed_precondition(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(shards=1)
    with pytest.raises(grpc.RpcError) as raised:
        c.commit(0)
    assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION


def test_a_retried_commit_round_answers_the_version_and_applies_nothing(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD)
    c.client.push(PushRequest(gradients(), [0, 0])).result()
    assert c.commit(0, dry_run=True) == [0, 0]
    assert c.commit(0) == [1, 1]
    assert c.commit(0) == [1, 1]
    assert_tensors(c.client.pull([-1, -1]).tensors, sgd_step(model(), gradients(), 0.1))


def test_describe_shard_tells_initialised_version_boot_incarnation_and_checkpoints(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster(shards=1)
    channel, stub = raw_stub(c.addresses[0])
    try:
        empty: pb.ShardState = stub.DescribeShard(pb.DescribeRequest(), timeout=30)
        assert (empty.initialized, empty.version, empty.incarnation) == (False, 0, 0)
        assert empty.boot == c.stores[0].boot != 0
        assert list(empty.checkpoints) == []  # this shard writes none
        c.client.push_model(model(), SGD)
        c.client.push(PushRequest(gradients(), [0])).result()
        c.commit(0)
        state: pb.ShardState = stub.DescribeShard(pb.DescribeRequest(), timeout=30)
        assert (state.initialized, state.version, state.boot, state.incarnation) == (True, 1, empty.boot, 0)
    finally:
        channel.close()
    assert ParameterStore(StoreSettings()).boot != c.stores[0].boot  # a restart gets a new one


def test_push_model_at_a_version_initialises_the_shard_there(make_cluster: Callable[..., Cluster]) -> None:
    """A worker repairing shard 1 (it lost its model) pushes its copy at the version shard 0 holds."""
    c = make_cluster()
    c.stores[0].initialize(PLACEMENT.split(model())[0], SGD, version=4)
    assert c.client.push_model(model(), SGD, versions=[4, 4]) == [4, 4]
    assert [s.version for s in c.stores] == [4, 4]
    assert c.client.push(PushRequest(gradients(), [4, 4])).result().all_accepted
    assert c.commit(4) == [5, 5]
    pulled = c.client.pull([-1, -1])
    assert pulled.versions == [5, 5]
    assert_tensors(pulled.tensors, sgd_step(model(), gradients(), 0.1))


def test_push_model_without_versions_starts_at_zero_and_minus_one_means_zero(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    assert c.client.push_model(model(), SGD, versions=[-1, 3]) == [0, 3]


def test_pull_only_asks_the_named_shards(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD)
    pulled = c.client.pull([-1, -1], only=[1])
    assert pulled.versions == [-1, 0]  # shard 0 not asked: the caller's version kept
    assert_tensors(pulled.tensors, {n: v for n, v in model().items() if home(n) == 1})


def test_the_pushed_minibatch_name_reaches_the_round_log(grpc_servers: Callable[..., int], tmp_path: Path) -> None:
    log_path = tmp_path / "ps-0.jsonl"
    store = ParameterStore(StoreSettings(round_log=log_path))
    address = f"127.0.0.1:{grpc_servers(ps_register(store))}"
    client = PSClient([address], worker="w-1", deadline_s=30.0)
    try:
        client.push_model(model(), SGD)
        assert client.push(PushRequest(gradients(), [0], minibatch="w-1/s/1")).result().all_accepted
    finally:
        client.close()
    assert commit_round(address, 0, ["w-1"]) == 1
    # Over gRPC frames (this shard has no bulk channel) the push was staged whole, not summed on arrival.
    assert json.loads(log_path.read_text()) == {"shard": 0, "round": 0, "minibatches": ["w-1/s/1"], "summed": 0}


# ---- incarnations ---------------------------------------------------------------------------------


def test_a_pull_at_the_same_version_of_another_incarnation_gets_the_tensors(
    make_cluster: Callable[..., Cluster],
) -> None:
    """After a rollback a version number comes back with other weights: only (incarnation, version)
    names one model, so a caller holding the same version of another incarnation is not current."""
    c = make_cluster()
    assert c.client.push_model(model(), SGD, versions=[3, 3], incarnation=2) == [3, 3]
    current = c.client.pull([3, 3], incarnations=[2, 2])
    assert (current.versions, current.incarnations, current.tensors) == ([3, 3], [2, 2], {})
    stale = c.client.pull([3, 3], incarnations=[1, 1])
    assert (stale.versions, stale.incarnations) == ([3, 3], [2, 2])
    assert_tensors(stale.tensors, model())
    default = c.client.pull([3, 3])  # no incarnations given: incarnation 0
    assert default.incarnations == [2, 2]
    assert_tensors(default.tensors, model())


def test_a_waiting_pull_of_another_incarnation_answers_at_once(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(shards=1)
    c.client.push_model(model(), SGD, versions=[3], incarnation=2)
    started = time.monotonic()
    pulled = c.client.pull([3], wait_ms=5000, incarnations=[1])
    assert time.monotonic() - started < 4
    assert_tensors(pulled.tensors, model())


def test_a_push_from_another_incarnation_is_refused_over_the_wire(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.client.push_model(model(), SGD, versions=[3, 3], incarnation=2)
    assert not any(c.client.push(PushRequest(gradients(), [3, 3], incarnations=[1, 1])).result().accepted)
    assert c.client.push(PushRequest(gradients(), [3, 3], incarnations=[2, 2])).result().all_accepted
    assert c.commit(3) == [4, 4]
    assert [(s.incarnation, s.version) for s in c.stores] == [(2, 4), (2, 4)]


I64_MAX = (1 << 63) - 1


@pytest.mark.parametrize(("version", "incarnation"), [(I64_MAX, 0), (0, I64_MAX), ((1 << 62) + 1, 0)])
def test_a_model_at_a_version_that_could_overflow_is_refused_and_the_shard_serves_on(
    make_cluster: Callable[..., Cluster], version: int, incarnation: int
) -> None:
    """Issue 35, Found 1: a first PushModel at version INT64_MAX was answered OK, and the next
    update's version + 1 left the shard answering UNKNOWN to every call, for good."""
    c = make_cluster(shards=1)
    with pytest.raises(grpc.RpcError) as raised:
        c.client.push_model(model(), SGD, versions=[version], incarnation=incarnation)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "must be 0 to 2^62" in str(raised.value.details())
    assert not c.stores[0].initialized
    c.client.push_model(model(), SGD)  # the job's own model still installs, at version 0
    assert c.client.push(PushRequest(gradients(), [0])).result().all_accepted
    assert c.commit(0) == [1]


def test_restore_shard_rolls_back_to_a_checkpoint_or_is_failed_precondition(
    grpc_servers: Callable[..., int], tmp_path: Path
) -> None:
    store = ParameterStore(StoreSettings(checkpoint_dir=tmp_path, checkpoint_steps=1))
    address = f"127.0.0.1:{grpc_servers(ps_register(store))}"
    client = PSClient([address], worker="w", deadline_s=30.0)
    channel, stub = raw_stub(address)
    try:
        client.push_model(model(), SGD)
        assert client.push(PushRequest(gradients(), [0])).result().all_accepted
        commit_round(address, 0, ["w"])
        store.flush_checkpoints()
        state: pb.ShardState = stub.RestoreShard(pb.RestoreRequest(version=1, incarnation=5), timeout=30)
        assert (state.version, state.incarnation, list(state.checkpoints)) == (1, 5, [1])
        with pytest.raises(grpc.RpcError) as raised:
            stub.RestoreShard(pb.RestoreRequest(version=0, incarnation=6), timeout=30)
        assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        for version, incarnation in ((I64_MAX, 7), (1, I64_MAX)):
            with pytest.raises(grpc.RpcError) as raised:
                stub.RestoreShard(pb.RestoreRequest(version=version, incarnation=incarnation), timeout=30)
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
        assert (store.version, store.incarnation) == (1, 5)
        pulled = client.pull([1], incarnations=[0])
        assert pulled.incarnations == [5]
        assert_tensors(pulled.tensors, sgd_step(model(), gradients(), 0.1))
    finally:
        channel.close()
        client.close()


def test_a_split_variable_joins_new_rows_from_the_newer_shard_with_the_rows_pulled_before(
    grpc_servers: Callable[..., int],
) -> None:
    """Sync, a round committed on shard 1 only: a pull that finds shard 0 current returns the split
    kernel whole, shard 1's rows updated and shard 0's as pulled before."""
    stores = [ParameterStore(StoreSettings(shard=i)) for i in range(2)]
    addresses = [f"127.0.0.1:{grpc_servers(ps_register(s))}" for s in stores]
    client = PSClient(addresses, worker="worker-0", deadline_s=30.0, split_bytes=100)
    try:
        kernel = np.arange(60, dtype=np.float32).reshape(20, 3)
        tensors = {"big/kernel": kernel, "big/bias": np.ones(3, np.float32)}
        placement = client.place(tensors)
        assert placement.shards_of("big/kernel") == (0, 1)
        cut = placement.tensors["big/kernel"].pieces[0].stop
        client.push_model(tensors, SGD)
        first = client.pull([-1, -1])
        np.testing.assert_array_equal(first.tensors["big/kernel"], kernel)
        kept = first.tensors["big/kernel"]
        grads = {name: np.ones_like(value) for name, value in tensors.items()}
        assert client.push(PushRequest(grads, [0, 0])).result().all_accepted
        assert commit_round(addresses[1], 0, ["worker-0"]) == 1  # shard 1 only
        pulled = client.pull([0, 0])
        assert pulled.versions == [0, 1]
        got = pulled.tensors["big/kernel"]
        assert got is kept  # the same buffer, refilled
        np.testing.assert_array_equal(got[:cut], kernel[:cut])
        np.testing.assert_array_equal(got[cut:], kernel[cut:] - np.float32(0.1))
        home_of_bias = placement.shards_of("big/bias")
        assert ("big/bias" in pulled.tensors) == (home_of_bias == (1,))
    finally:
        client.close()
