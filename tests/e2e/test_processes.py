"""`elasticps ps` as a real process: its port file, health service and Prometheus endpoint."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from elasticps.api.optimizer import OptimizerConfig
from elasticps.coordinator.client import CoordinatorClient
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import PSClient, PullBehind, PushRequest

from local_jobs import write_data

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_ps(tmp_path: Path) -> tuple[subprocess.Popen[str], str, int]:
    """`elasticps ps` (PS 0 of a sync job) on 100 records: the process, its address and metrics port."""
    train, _ = write_data(tmp_path, records=100)
    port_file, metrics_port = tmp_path / "port", free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "elasticps", "ps", "--host=127.0.0.1", "--port=0", f"--port_file={port_file}",
         f"--metrics_port={metrics_port}", "--data_reader=npz", f"--training_data={train}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the PS did not start: {process.communicate()[1]}")
        time.sleep(0.05)
    return process, f"127.0.0.1:{int(port_file.read_text())}", metrics_port


def test_ps_serves_health_and_metrics(tmp_path: Path) -> None:
    process, address, metrics_port = start_ps(tmp_path)
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert 'elasticps_ps_model_version{shard="0"} 0.0' in text
        assert "elasticps_ps_gradient_staleness_bucket" in text
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0  # SIGTERM: a clean stop


def test_worker_serves_health_while_training(tmp_path: Path) -> None:
    train, _ = write_data(tmp_path, records=20000)
    port_file, health_port = tmp_path / "port", free_port()
    ps = subprocess.Popen(
        [sys.executable, "-m", "elasticps", "ps", "--host=127.0.0.1", "--port=0", f"--port_file={port_file}",
         "--data_reader=npz", f"--training_data={train}", "--num_epochs=20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert ps.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        worker = subprocess.Popen(
            [sys.executable, "-m", "elasticps", "worker", f"--ps_addrs=127.0.0.1:{int(port_file.read_text())}",
             "--model_def=elasticps.backends.keras.zoo.mlp", "--data_reader=npz", f"--training_data={train}",
             f"--health_port={health_port}", "--num_epochs=20"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        status = None
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while status is None:
                assert worker.poll() is None and time.monotonic() < deadline + 60, worker.stderr
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                except grpc.RpcError:
                    time.sleep(0.1)
        assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        for process in (worker, ps):
            if process is not None:
                process.kill()
                process.wait()


def test_ps_0_takes_a_sync_join_behind_a_push_on_its_bulk_channel(tmp_path: Path) -> None:
    """`elasticps ps` wires its coordinator to its bulk channel: a worker's join written behind its
    push is answered there (no JoinRound call over gRPC), and the round's model comes behind it."""
    process, address, metrics_port = start_ps(tmp_path)
    try:
        model = {"w": np.linspace(-1, 1, 1000, dtype=np.float32)}
        ps = PSClient([address], worker="w0", deadline_s=30)
        coordinator = CoordinatorClient(address, worker="w0", deadline_s=30)
        try:
            ps.push_model(model, OptimizerConfig("sgd", {"learning_rate": 0.5}))
            assert coordinator.get_task().type == pb.TASK_TYPE_TRAINING  # live: the round waits for w0 alone
            pushed = ps.push(PushRequest({"w": np.full(1000, 0.1, np.float32)}, [0], minibatch="m",
                                         pull_behind=PullBehind(5_000, join=True))).result()  # fmt: skip
            assert pushed.all_accepted and pushed.behind is not None
            reply = pushed.behind.join(pb.JoinRequest(worker="w0", version=0, wait_ms=5_000))
            assert reply is not None and (reply.outcome, reply.version) == (pb.JOIN_OUTCOME_COMMITTED, 1)
            pulled = pushed.behind.result()
            assert pulled.versions == [1]
            np.testing.assert_allclose(pulled.tensors["w"], model["w"] - np.float32(0.05), rtol=1e-6)
        finally:
            ps.close()
            coordinator.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert 'elasticps_ps_bulk_joins_total{outcome="committed",shard="0"} 1.0' in text
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0
