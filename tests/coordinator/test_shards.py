"""Committing a sync round on every shard (``coordinator/shards.py``): two real PS shards served over
in-process gRPC, reached through RemoteShard, and pushed to by the real PSClient."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerConfig
from elasticps.coordinator.shards import RemoteShard, RoundAborted, ShardRefused, Shards, ShardView
from elasticps.psclient.client import PSClient, PushRequest
from elasticps.ps.servicer import ParameterServerServicer, add_to_server
from elasticps.psclient.sharding import place, tensor_infos
from elasticps.ps.store import ParameterStore, StoreSettings

SGD = OptimizerConfig("sgd", {"learning_rate": 0.5})
# With 2 shards, by size: "dense/kernel:0" (the larger) lives on shard 0, "dense/bias:0" on shard 1.
MODEL = {"dense/kernel:0": np.array([1.0, 2.0], dtype=np.float32), "dense/bias:0": np.array([4.0], dtype=np.float32)}


def ones(scale: float) -> dict[str, np.ndarray]:
    return {n: np.full_like(v, scale) for n, v in MODEL.items()}


@dataclass
class Job:
    stores: list[ParameterStore]
    addresses: list[str]
    shards: Shards
    clients: dict[str, PSClient]

    def client(self, worker: str) -> PSClient:
        if worker not in self.clients:
            self.clients[worker] = PSClient(self.addresses, worker=worker, deadline_s=10.0, timeout_s=10.0)
        return self.clients[worker]

    def params(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for store in self.stores:
            with store.reading() as (_, _, variables):
                out.update({n: v.copy() for n, v in variables.items()})
        return out


@pytest.fixture
def job(grpc_servers: Callable[..., int]) -> Iterator[Job]:
    stores = [ParameterStore(StoreSettings(shard=i)) for i in range(2)]
    addresses = []
    for store in stores:
        servicer = ParameterServerServicer(store)
        addresses.append(f"127.0.0.1:{grpc_servers(lambda server, s=servicer: add_to_server(s, server))}")
    links = [RemoteShard(i, address) for i, address in enumerate(addresses)]
    made = Job(stores, addresses, Shards(links), {})
    assert [place(tensor_infos(MODEL), 2).shards_of(n) for n in MODEL] == [(0,), (1,)]
    made.client("setup").push_model(MODEL, SGD)
    yield made
    for client in made.clients.values():
        client.close()
    made.shards.close()


def test_a_round_is_applied_on_every_shard(job: Job) -> None:
    assert job.client("a").push(PushRequest(ones(1.0), [0, 0])).result().all_accepted
    assert job.client("b").push(PushRequest(ones(3.0), [0, 0])).result().all_accepted
    assert job.shards.commit(0, ["a", "b"]) == [1, 1]
    assert [s.version for s in job.stores] == [1, 1]
    for name, value in job.params().items():
        np.testing.assert_array_equal(value, MODEL[name] - np.float32(0.5) * np.float32(2.0), err_msg=name)


def test_a_shard_missing_a_members_gradient_aborts_the_round_and_no_shard_applies_it(job: Job) -> None:
    job.client("a").push(PushRequest(ones(1.0), [0, 0])).result()
    # b's gradient reached shard 0 only (its push to shard 1 was lost).
    job.stores[0].push({"dense/kernel:0": ones(5.0)["dense/kernel:0"]}, version=0, worker="b")
    with pytest.raises(RoundAborted, match="shard 1"):
        job.shards.commit(0, ["a", "b"])
    assert [s.version for s in job.stores] == [0, 0]
    for name, value in job.params().items():
        np.testing.assert_array_equal(value, MODEL[name], err_msg=name)
    # Its members train again: a's gradient, received by shard 0 and summed into by its dry run, is
    # gone there, and a round naming a is refused until a pushes again; then it commits everywhere.
    with pytest.raises(RoundAborted, match="shard 0.*no staged gradient of \\['a'\\]"):
        job.shards.commit(0, ["a"])
    job.client("a").push(PushRequest(ones(1.0), [0, 0])).result()
    assert job.shards.commit(0, ["a"]) == [1, 1]
    for name, value in job.params().items():
        np.testing.assert_array_equal(value, MODEL[name] - np.float32(0.5), err_msg=name)


def test_a_shard_behind_the_round_aborts_it(job: Job) -> None:
    job.client("a").push(PushRequest(ones(1.0), [0, 0])).result()
    with pytest.raises(RoundAborted, match="ahead"):
        job.shards.commit(1, ["a"])
    assert [s.version for s in job.stores] == [0, 0]


def test_a_retried_commit_is_idempotent(job: Job) -> None:
    job.client("a").push(PushRequest(ones(1.0), [0, 0])).result()
    assert job.shards.commit(0, ["a"]) == [1, 1]
    after = job.params()
    assert job.shards.commit(0, ["a"]) == [1, 1]
    assert [s.version for s in job.stores] == [1, 1]
    for name, value in job.params().items():
        np.testing.assert_array_equal(value, after[name], err_msg=name)


def test_a_commit_that_reached_one_shard_is_completed_by_its_retry(job: Job) -> None:
    """The coordinator lost its answer after shard 0 applied the round: retrying it applies the round
    on shard 1 and leaves shard 0 alone."""
    job.client("a").push(PushRequest(ones(1.0), [0, 0])).result()
    job.stores[0].commit(0, ["a"])
    assert [s.version for s in job.stores] == [1, 0]
    assert job.shards.commit(0, ["a"]) == [1, 1]
    for name, value in job.params().items():
        np.testing.assert_array_equal(value, MODEL[name] - np.float32(0.5), err_msg=name)


def test_remote_shard_refusals_name_the_shard(job: Job) -> None:
    link = RemoteShard(1, job.addresses[1])
    try:
        with pytest.raises(ShardRefused, match="PS shard 1") as refused:
            link.commit(0, ["ghost"], dry_run=True)
        assert refused.value.shard == 1
    finally:
        link.close()


def test_describe_tells_every_shards_state(job: Job) -> None:
    job.client("a").push(PushRequest(ones(1.0), [0, 0])).result()
    job.shards.commit(0, ["a"])
    views = job.shards.describe()
    kernel, bias = MODEL["dense/kernel:0"].nbytes, MODEL["dense/bias:0"].nbytes  # the push's tensor bytes
    assert views == [
        ShardView(True, 1, job.stores[0].boot, bytes_received=kernel),
        ShardView(True, 1, job.stores[1].boot, bytes_received=bias),
    ]


def test_describe_answers_none_for_a_shard_that_does_not_answer(grpc_servers: Callable[..., int]) -> None:
    store = ParameterStore(StoreSettings())
    servicer = ParameterServerServicer(store)
    port = grpc_servers(lambda server: add_to_server(servicer, server))
    # 127.0.0.1:1: nothing listens there.
    shards = Shards([RemoteShard(0, f"127.0.0.1:{port}"), RemoteShard(1, "127.0.0.1:1")])
    try:
        assert shards.describe() == [ShardView(False, 0, store.boot), None]
    finally:
        shards.close()


def test_shards_need_at_least_one_link() -> None:
    with pytest.raises(ValueError):
        Shards([])
