"""A PS's memory under strangers' connections and calls (issue 35, Found 8), against a real
``elasticps ps`` process holding a 64 MB model: 512 connections to its bulk port that declare a
16 MiB head and send nothing more, and 8 unary calls of 200 MB each, at once. Before: 128 such
connections took a PS from 59 MB to 2.1 GB (a head's declared length was allocated before its
bytes came), and eight 200 MB calls left it at 1.9 GB (every method took 256 MiB messages).

Counted: the PS's resident memory (``/proc/PID/status``, sampled throughout) against what it held
with its model and nothing else; a worker's push and pull are served meanwhile (over gRPC frames:
the bulk port is full, and the client falls back instead of retrying it).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from bench.ps_processes import PSProcesses
from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import PSClient, PushRequest
from elasticps.rpc import bulk
from elasticps.rpc.channels import create_channel

MB = 1 << 20
SILENT = 512
OVERSIZED = 8


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_silent_connections_and_oversized_calls_cost_the_ps_nearly_nothing(tmp_path: Path) -> None:
    train = tmp_path / "train.npz"
    np.savez(train, x=np.zeros((10, 4), np.float32), y=np.zeros(10, np.int64))
    shards = PSProcesses(1, tmp_path, train)
    [pid], [address] = shards.pids(), shards.addresses
    model = {f"w{i}": np.full(4 * MB, 0.5, np.float32) for i in range(4)}  # 64 MB
    client = PSClient([address], worker="w", deadline_s=60)
    held: list[socket.socket] = []
    try:
        versions = client.push_model(model, OptimizerConfig("sgd", {"learning_rate": 0.1}))
        assert client.push(PushRequest({k: np.full_like(v, 0.01) for k, v in model.items()}, versions)).result().all_accepted
        time.sleep(1.0)
        with_model = rss(pid)
        channel = create_channel(address, "")
        describe = channel.unary_unary("/elasticps.v1.ParameterServer/DescribeShard")
        bulk_port = pb.ShardState.FromString(describe(b"", timeout=10)).bulk_port

        peak = [with_model]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], rss(pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        head = bulk.REQUEST.pack(bulk.MAGIC, bulk.PUSH_GRADIENTS) + bulk.LENGTH.pack(bulk.MAX_HEAD_BYTES)
        assert len(head) == 13
        for _ in range(SILENT):
            sock = socket.create_connection(("127.0.0.1", bulk_port))
            sock.sendall(head)
            held.append(sock)
        garbage = b"\x01" * (200 * MB)
        codes: list[grpc.StatusCode] = []

        def oversized() -> None:
            try:
                describe(garbage, timeout=30)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                codes.append(err.code())  # type: ignore[attr-defined]

        callers = [threading.Thread(target=oversized) for _ in range(OVERSIZED)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        del garbage
        time.sleep(1.0)  # the silent connections still open: their threads wait on the head
        sampling.set()
        sampler.join()
        after = rss(pid)

        # A worker is served meanwhile: its bulk connection is turned away, its calls go as gRPC frames.
        worker = PSClient([address], worker="w2", deadline_s=60)
        try:
            pushed = worker.push(PushRequest({k: np.full_like(v, 0.01) for k, v in model.items()}, versions)).result()
            pulled = worker.pull([-1])
            route = worker._routes[0]
            assert route is not None and route.fallbacks >= 1
        finally:
            worker.close()
        channel.close()
    finally:
        for sock in held:
            sock.close()
        client.close()
        shards.stop()
    print(f"\nPS resident: {with_model / MB:.0f} MB with its model, at most {peak[0] / MB:.0f} MB under {SILENT} "
          f"silent bulk connections and {OVERSIZED} calls of 200 MB ({peak[0] / with_model:.2f}x), "
          f"{after / MB:.0f} MB after the calls")
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * OVERSIZED
    assert pushed.all_accepted and pulled.versions == [2]
    np.testing.assert_allclose(pulled.tensors["w0"], 0.5 - 2 * 0.01 * 0.1, rtol=1e-6)
    assert peak[0] <= 1.2 * with_model
