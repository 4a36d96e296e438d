"""Model state over real gRPC: two shards (real servers and servicers), real PSClients for two workers.

The state (BatchNorm-like moving statistics) travels beside the variables, marked in its metadata,
split across the shards by name: sent with the model and every push, returned by every full pull.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import PSClient, PushRequest
from elasticps.ps.servicer import ParameterServerServicer, add_to_server
from elasticps.psclient.sharding import place, tensor_infos
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc.channels import create_channel

SGD = OptimizerConfig("sgd", {"learning_rate": 0.1})
STATE_NAMES = ("bn/moving_mean", "bn/moving_variance", "bn_1/moving_mean", "bn_1/moving_variance")


def model() -> dict[str, np.ndarray]:
    return {"dense/kernel": np.ones((3, 2), np.float32), "dense/bias": np.zeros(2, np.float32)}


def grads(value: float = 1.0) -> dict[str, np.ndarray]:
    return {name: np.full_like(v, value) for name, v in model().items()}


def state(mean: float = 0.0, variance: float = 1.0) -> dict[str, np.ndarray]:
    out = {}
    for name in STATE_NAMES:
        out[name] = np.full(4, mean if name.endswith("mean") else variance, np.float32)
    return out


# With 2 shards, by size: dense/kernel, bn_1/moving_mean and dense/bias on shard 0, the others on 1.
PLACEMENT = place(tensor_infos(model(), state()), 2)


def home(name: str) -> int:
    (shard,) = PLACEMENT.shards_of(name)
    return shard


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, err_msg=name)


@dataclass
class Cluster:
    stores: list[ParameterStore]
    addresses: list[str]
    clients: dict[str, PSClient]

    def commit(self, round_: int, workers: Sequence[str]) -> list[int]:
        versions = []
        for address in self.addresses:
            channel = create_channel(address)
            try:
                stub = channel.unary_unary(
                    "/elasticps.v1.ParameterServer/CommitRound",
                    request_serializer=pb.CommitRequest.SerializeToString,
                    response_deserializer=pb.CommitReply.FromString,
                )
                versions.append(stub(pb.CommitRequest(round=round_, workers=list(workers)), timeout=30).version)
            finally:
                channel.close()
        return versions

    def held_state(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for store in self.stores:
            with store.reading_model() as found:
                out.update({n: v.copy() for n, v in found.state.items()})
        return out


@pytest.fixture
def make_cluster(grpc_servers: Callable[..., int]) -> Iterator[Callable[..., Cluster]]:
    made: list[PSClient] = []

    def make(rule: UpdateRule = UpdateRule.SYNC) -> Cluster:
        stores = [ParameterStore(StoreSettings(shard=i, mode=TrainingMode(rule=rule))) for i in range(2)]
        addresses = []
        for store in stores:
            servicer = ParameterServerServicer(store)
            addresses.append(f"127.0.0.1:{grpc_servers(lambda server, s=servicer: add_to_server(s, server))}")
        clients = {w: PSClient(addresses, worker=w, deadline_s=30.0, timeout_s=60.0) for w in ("a", "b")}
        made.extend(clients.values())
        return Cluster(stores, addresses, clients)

    yield make
    for client in made:
        client.close()


def test_state_names_really_span_both_shards() -> None:
    assert {home(name) for name in STATE_NAMES} == {0, 1}


def test_the_model_push_carries_the_state_and_a_pull_returns_it_apart(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.clients["a"].push_model(model(), SGD, state=state(0.0, 1.0))
    for index, store in enumerate(c.stores):
        with store.reading_model() as found:
            assert sorted(found.state) == sorted(n for n in STATE_NAMES if home(n) == index)
    pulled = c.clients["b"].pull([-1, -1])
    assert_same(pulled.tensors, model())
    assert_same(pulled.state, state(0.0, 1.0))
    assert c.clients["b"].pull(pulled.versions).state == {}  # current: nothing travels


def test_sync_a_round_of_two_members_averages_their_state_on_both_shards(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.clients["a"].push_model(model(), SGD, state=state())
    a = PushRequest(grads(1.0), [0, 0], minibatch="a/1", state=state(2.0, 3.0))
    b = PushRequest(grads(3.0), [0, 0], minibatch="b/1", state=state(4.0, 5.0))
    assert c.clients["a"].push(a).result().all_accepted
    assert c.clients["b"].push(b).result().all_accepted
    assert_same(c.held_state(), state())  # staged with the gradients, not applied
    assert c.commit(0, ["a", "b"]) == [1, 1]
    pulled = c.clients["a"].pull([0, 0])
    assert pulled.versions == [1, 1]
    assert_same(pulled.state, state(3.0, 4.0))  # the members' mean on every shard
    assert_same(pulled.tensors, {n: v - 0.1 * 2.0 for n, v in model().items()})  # gradients as before


def test_async_the_latest_push_sets_the_state(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(UpdateRule.ASYNC)
    c.clients["a"].push_model(model(), SGD, state=state())
    c.clients["a"].push(PushRequest(grads(), [0, 0], state=state(2.0, 3.0))).result()
    c.clients["b"].push(PushRequest(grads(), [0, 0], state=state(7.0, 8.0))).result()
    pulled = c.clients["a"].pull([-1, -1])
    assert pulled.versions == [2, 2]
    assert_same(pulled.state, state(7.0, 8.0))
    # The future-returning push carries it too.
    c.clients["a"].push(PushRequest(grads(), [2, 2], state=state(1.0, 1.5), background=True)).result(timeout=60)
    assert_same(c.clients["b"].pull([-1, -1]).state, state(1.0, 1.5))


def bad(kind: str) -> dict[str, np.ndarray]:
    values = state(2.0, 3.0)
    if kind == "shape":
        values["bn/moving_mean"] = np.zeros(5, np.float32)
    elif kind == "dtype":
        values["bn_1/moving_variance"] = np.zeros(4, np.float64)
    elif kind == "nan":
        values["bn/moving_variance"][1] = np.nan
    elif kind == "unknown":
        values["bn_2/moving_mean"] = np.zeros(4, np.float32)
    return values


@pytest.mark.parametrize("rule", [UpdateRule.SYNC, UpdateRule.ASYNC], ids=["sync", "async"])
@pytest.mark.parametrize("kind", ["shape", "dtype", "nan", "unknown"])
def test_a_bad_state_tensor_is_invalid_argument_and_its_shard_changes_nothing(
    make_cluster: Callable[..., Cluster], kind: str, rule: UpdateRule
) -> None:
    c = make_cluster(rule)
    c.clients["a"].push_model(model(), SGD, state=state())
    values = bad(kind)
    if kind == "unknown":  # the client places no tensor outside the model: refused before sending
        with pytest.raises(ValueError, match="bn_2/moving_mean"):
            c.clients["a"].push(PushRequest(grads(), [0, 0], state=values)).result()
        assert [s.version for s in c.stores] == [0, 0]
        return
    culprit = {home(n) for n, v in values.items() if v.dtype != np.float32 or v.shape != (4,) or not np.isfinite(v).all()}
    assert len(culprit) == 1
    (refusing,) = culprit
    with pytest.raises(grpc.RpcError) as raised:
        c.clients["a"].push(PushRequest(grads(), [0, 0], state=values)).result()
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert c.stores[refusing].version == 0
    with c.stores[refusing].reading_model() as found:
        assert_same(dict(found.variables), PLACEMENT.split(model())[refusing])
        assert_same({n: v.copy() for n, v in found.state.items()}, PLACEMENT.split(state())[refusing])
    if rule is UpdateRule.SYNC:
        assert c.stores[refusing].rule.staged == 0  # type: ignore[attr-defined]


def test_a_model_with_integer_state_is_invalid_argument(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    with pytest.raises(grpc.RpcError) as raised:
        c.clients["a"].push_model(model(), SGD, state={"bn/moving_mean": np.zeros(2, np.int64)})
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert not c.stores[1].initialized
