"""Bytes per PS shard for the 23M MLP (784-8192-2048-10, 92 MB of float32): placement by name against by size.

    python -m bench.shard_bytes [--shards 2 3] [--processes]

For each number of shards, the bytes each shard holds under the rule before (sha256 of the name mod N,
rebuilt here as a placement by hand) and under ``ps/sharding.py``'s placement by size with row
slices (4 MiB threshold), from the placement itself. With ``--processes``, each placement is also
measured on real ``elasticps ps`` processes (async): the real ``PSClient`` pushes the model and one
gradient of it, and each shard's Prometheus counter of pushed tensor bytes
(``elasticps_ps_tensor_bytes_received``) and its resident memory (VmRSS) are read. Prints one JSON
line per (rule, shards).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.client import PSClient
from elasticps.ps.sharding import Piece, Placed, Placement, TensorInfo, place

F32 = np.dtype(np.float32)
MLP = [
    TensorInfo("mlp/dense/kernel", (784, 8192), F32),
    TensorInfo("mlp/dense/bias", (8192,), F32),
    TensorInfo("mlp/dense_1/kernel", (8192, 2048), F32),
    TensorInfo("mlp/dense_1/bias", (2048,), F32),
    TensorInfo("mlp/dense_2/kernel", (2048, 10), F32),
    TensorInfo("mlp/dense_2/bias", (10,), F32),
]


def by_name(num_shards: int) -> Placement:
    """The rule before placement by size: the first 8 bytes of sha256 of the name, mod N."""

    def shard(name: str) -> int:
        return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % num_shards

    return Placement(num_shards, [Placed(t, (Piece(t.name, shard(t.name)),)) for t in MLP])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def rss_bytes(pid: int) -> int:
    found = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found[1]) * 1024 if found else -1


def measure(placement: Placement, work: Path) -> dict[str, list[int]]:
    """Pushes the model and one gradient through real PS processes placed by ``placement``."""
    count = placement.num_shards
    ports, metrics = [free_port() for _ in range(count)], [free_port() for _ in range(count)]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    train = work / "train.npz"
    np.savez(train, x=np.zeros((8, 4), np.float32), y=np.zeros(8, np.int64))
    processes = []
    try:
        for shard in reversed(range(count)):
            port_file = work / f"ps-{shard}.port"
            port_file.unlink(missing_ok=True)
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "elasticps", "ps", "--host=127.0.0.1", f"--port={ports[shard]}",
                     f"--port_file={port_file}", f"--metrics_port={metrics[shard]}", f"--ps_id={shard}",
                     f"--num_ps={count}", f"--ps_addrs={','.join(addresses)}", "--use_async",
                     "--data_reader=npz", f"--training_data={train}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            )
            deadline = time.monotonic() + 60
            while not port_file.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PS {shard} did not start")
                time.sleep(0.05)
        rng = np.random.default_rng(0)
        model = {t.name: rng.standard_normal(t.shape).astype(np.float32) * 0.01 for t in MLP}
        client = PSClient(addresses, worker="bench", deadline_s=120.0, timeout_s=120.0, placement=placement)
        try:
            client.push_model(model, OptimizerConfig("sgd", {"learning_rate": 0.01}))
            gradient = {name: np.zeros_like(value) for name, value in model.items()}
            if not client.push_gradients(gradient, [0] * count).all_accepted:
                raise RuntimeError("a push was not accepted")
            pulled = client.pull([-1] * count)
            if any(not np.array_equal(pulled.tensors[n], v) for n, v in model.items()):
                raise RuntimeError("the pulled model differs from the pushed one")
        finally:
            client.close()
        received = []
        for shard, port in enumerate(metrics):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                text = response.read().decode()
            found = re.search(rf'elasticps_ps_tensor_bytes_received_total{{shard="{shard}"}} (\S+)', text)
            received.append(int(float(found[1])) if found else -1)
        rss = [rss_bytes(p.pid) for p in reversed(processes)]
        return {"metrics_bytes": received, "rss_bytes": rss}
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--processes", action="store_true", help="also measure on real PS processes")
    args = parser.parse_args()
    for count in args.shards:
        for rule, placement in (("by name", by_name(count)), ("by size", place(MLP, count))):
            loads = placement.shard_bytes()
            row: dict[str, object] = {
                "rule": rule,
                "shards": count,
                "placement_bytes": loads,
                "max_over_min": round(max(loads) / max(1, min(loads)), 4),
                "held": [placement.held_on(s) for s in range(count)],
            }
            if args.processes:
                with tempfile.TemporaryDirectory(prefix="elasticps-shard-bytes-") as work:
                    row.update(measure(placement, Path(work)))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
