"""PushModel as every worker sends it at start: the first model is kept as received, the others are
answered from their heads, and no two are held whole at once.

A shard of P bytes took 3P and more when two workers pushed the model together (two streams
buffered whole, then a copy of one): the 23M-parameter job's install was its PS's peak
(``bench/large_model.py``). Now one PushModel stream is received at a time, the first one's
buffer becomes the variables, and a later push of the same model is received a piece at a time,
each piece checked and dropped. Memory is counted with tracemalloc in this process, which runs the
servicer (numpy's and Python's allocations are traced).
"""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerConfig
from elasticps.psclient.client import ModelMismatch, PSClient
from elasticps.ps.servicer import ParameterServerServicer
from elasticps.ps.servicer import add_to_server as add_ps
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.ps.tables import DenseTable

SGD = OptimizerConfig("sgd", {"learning_rate": 0.1})
MIB = 1 << 20


def big_model() -> dict[str, np.ndarray]:
    return {"kernel": np.full((2048, 1024), 0.5, np.float32), "bias": np.linspace(-1, 1, 1024, dtype=np.float32)}


def serve(grpc_servers: Callable[..., int]) -> tuple[str, ParameterStore]:
    store = ParameterStore(StoreSettings())
    servicer = ParameterServerServicer(store)
    return f"127.0.0.1:{grpc_servers(lambda s: add_ps(servicer, s))}", store


def test_received_arrays_become_the_variables_and_others_are_copied() -> None:
    model = big_model()
    kept = DenseTable.create(model, received=True)
    assert all(np.shares_memory(kept.variables[name], model[name]) for name in model)
    copied = DenseTable.create(model)
    assert not any(np.shares_memory(copied.variables[name], model[name]) for name in model)
    read_only = {name: value.copy() for name, value in model.items()}
    for value in read_only.values():
        value.flags.writeable = False
    assert not any(np.shares_memory(v, read_only[n]) for n, v in DenseTable.create(read_only, received=True).variables.items())


def test_workers_pushing_the_model_together_hold_it_once(grpc_servers: Callable[..., int]) -> None:
    address, store = serve(grpc_servers)
    nbytes = sum(value.nbytes for value in big_model().values())
    models = [big_model() for _ in range(4)]  # made before tracing: what the workers hold anyway
    clients = [PSClient([address], worker=f"w{i}", deadline_s=30) for i in range(4)]
    barrier = threading.Barrier(len(clients))
    answers: list[list[int]] = []

    def push(client: PSClient, model: dict[str, np.ndarray]) -> None:
        barrier.wait()
        answers.append(client.push_model(model, SGD))

    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        threads = [threading.Thread(target=push, args=pair) for pair in zip(clients, models)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        for client in clients:
            client.close()
    assert answers == [[0]] * 4
    with store.reading() as (_, _, variables):
        np.testing.assert_array_equal(variables["kernel"], big_model()["kernel"])
    # One stream buffered whole (kept as the variables), the rest as pieces, and the four clients'
    # frames in flight (this process runs them too): 2.4x measured; 6.5x when every stream was
    # buffered whole and one of them copied.
    assert peak - start < 3.5 * nbytes, f"four pushes of a {nbytes / MIB:.0f} MiB model took {(peak - start) / MIB:.1f} MiB"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ("nan", grpc.StatusCode.INVALID_ARGUMENT),
        ("shape", None),  # FAILED_PRECONDITION, which the client raises as ModelMismatch
        ("integer", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_a_model_pushed_once_one_is_held_is_checked_as_before(
    grpc_servers: Callable[..., int], change: str, code: grpc.StatusCode | None
) -> None:
    address, store = serve(grpc_servers)
    client = PSClient([address], worker="w", deadline_s=10)
    try:
        assert client.push_model(big_model(), SGD) == [0]
        other = big_model()
        if change == "nan":
            other["kernel"][-1, -1] = np.nan  # in the last piece
        elif change == "shape":
            other["bias"] = np.zeros(1023, np.float32)
        else:
            other["bias"] = np.zeros(1024, np.int32)
        if code is None:
            with pytest.raises(ModelMismatch, match=r"'bias' is float32\[1023\] in the pushed model"):
                client.push_model(other, SGD)
        else:
            with pytest.raises(grpc.RpcError) as raised:
                client.push_model(other, SGD)
            assert raised.value.code() is code
    finally:
        client.close()
    with store.reading() as (_, _, variables):
        np.testing.assert_array_equal(variables["bias"], big_model()["bias"])
