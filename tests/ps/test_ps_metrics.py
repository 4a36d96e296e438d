"""The PS's Prometheus metrics, recorded by the real servicer over real gRPC."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc
from elasticps.psclient.client import PSClient, PushRequest
from elasticps.ps.metrics import PSMetrics
from elasticps.api.optimizer import OptimizerConfig
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.ps.servicer import ParameterServerServicer, add_to_server
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc.channels import create_channel


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, {"shard": "0", **labels})
    return 0.0 if found is None else found


def test_pushes_pulls_staleness_and_bytes_are_counted(grpc_servers: Callable[..., int]) -> None:
    registry = CollectorRegistry()
    store = ParameterStore(StoreSettings())
    servicer = ParameterServerServicer(store, metrics=PSMetrics(registry, 0))
    port = grpc_servers(lambda server: add_to_server(servicer, server))
    client = PSClient([f"127.0.0.1:{port}"], worker="w", deadline_s=5)
    model = {"w": np.zeros(1000, dtype=np.float32)}
    gradient = {"w": np.ones(1000, dtype=np.float32)}
    try:
        client.push_model(model, OptimizerConfig("sgd", {"learning_rate": 0.1}))
        client.pull([-1])  # full
        client.pull([0])  # current
        assert client.push(PushRequest(gradient, [0])).result().all_accepted  # staged for round 0
        assert value(registry, "elasticps_ps_model_version") == 0
        channel = create_channel(f"127.0.0.1:{port}")
        try:
            stub = pb_grpc.ParameterServerStub(channel)
            assert stub.CommitRound(pb.CommitRequest(round=0, workers=["w"]), timeout=30).version == 1
        finally:
            channel.close()
        assert not client.push(PushRequest(gradient, [0])).result().all_accepted  # stale by one: rejected
        with pytest.raises(grpc.RpcError):
            client.push(PushRequest({"w": np.full(1000, np.nan, dtype=np.float32)}, [1])).result()
    finally:
        client.close()
    assert value(registry, "elasticps_ps_pulls_total", kind="full") == 1
    assert value(registry, "elasticps_ps_pulls_total", kind="current") == 1
    assert value(registry, "elasticps_ps_pushes_total", outcome="accepted") == 1
    assert value(registry, "elasticps_ps_pushes_total", outcome="rejected") == 1
    assert value(registry, "elasticps_ps_pushes_total", outcome="invalid") == 1
    assert value(registry, "elasticps_ps_gradient_staleness_count") == 2
    assert value(registry, "elasticps_ps_gradient_staleness_sum") == 1  # 0 for the first, 1 for the stale
    assert value(registry, "elasticps_ps_model_version") == 1
    assert value(registry, "elasticps_ps_tensor_bytes_received_total") == 3 * 4000
    assert value(registry, "elasticps_ps_tensor_bytes_sent_total") >= 4000


def test_the_learning_rate_of_the_latest_accepted_push_is_a_gauge(grpc_servers: Callable[..., int]) -> None:
    registry = CollectorRegistry()
    metrics = PSMetrics(registry, 0)
    store = ParameterStore(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC)))
    port = grpc_servers(lambda server: add_to_server(ParameterServerServicer(store, metrics=metrics), server))
    client = PSClient([f"127.0.0.1:{port}"], worker="w", deadline_s=5)
    gradient = {"w": np.ones(10, dtype=np.float32)}
    try:
        client.push_model({"w": np.zeros(10, dtype=np.float32)}, OptimizerConfig("sgd", {"learning_rate": 0.5}))
        assert value(registry, "elasticps_ps_learning_rate") == 0  # nothing pushed yet
        for version, rate in enumerate([0.1, 0.1, 0.01]):  # a schedule's rates, by version
            assert client.push(PushRequest(gradient, [version], rate)).result().all_accepted
            assert value(registry, "elasticps_ps_learning_rate") == pytest.approx(rate)
            assert metrics.last_learning_rate == pytest.approx(rate)
        assert client.push(PushRequest(gradient, [3])).result().all_accepted  # no rate: the PS's own
        assert value(registry, "elasticps_ps_learning_rate") == pytest.approx(0.5)
        np.testing.assert_allclose(client.pull([-1]).tensors["w"], -(0.1 + 0.1 + 0.01 + 0.5), rtol=1e-6)
    finally:
        client.close()
