"""Bytes per PS shard for the 23M MLP (784-8192-2048-10, 92 MB of float32): placement by name against by size.

    python -m bench.shard_bytes [--shards 2 3] [--processes]

For each number of shards, the bytes each shard holds under the rule before (sha256 of the name mod N,
rebuilt here as a placement by hand) and under ``psclient/sharding.py``'s placement by size with row
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
import tempfile
from pathlib import Path

import numpy as np

from bench.ps_processes import PSProcesses
from elasticps.api.optimizer import OptimizerConfig
from elasticps.psclient.client import PSClient, PushRequest
from elasticps.psclient.sharding import Piece, Placed, Placement, TensorInfo, place

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


def rss_bytes(pid: int) -> int:
    found = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found[1]) * 1024 if found else -1


def measure(placement: Placement, work: Path) -> dict[str, list[int]]:
    """Pushes the model and one gradient through real PS processes placed by ``placement``."""
    count = placement.num_shards
    train = work / "train.npz"
    np.savez(train, x=np.zeros((8, 4), np.float32), y=np.zeros(8, np.int64))
    shards = PSProcesses(count, work, train)
    try:
        rng = np.random.default_rng(0)
        model = {t.name: rng.standard_normal(t.shape).astype(np.float32) * 0.01 for t in MLP}
        client = PSClient(shards.addresses, worker="bench", deadline_s=120.0, timeout_s=120.0, placement=placement)
        try:
            client.push_model(model, OptimizerConfig("sgd", {"learning_rate": 0.01}))
            gradient = {name: np.zeros_like(value) for name, value in model.items()}
            if not client.push(PushRequest(gradient, [0] * count)).result().all_accepted:
                raise RuntimeError("a push was not accepted")
            pulled = client.pull([-1] * count)
            if any(not np.array_equal(pulled.tensors[n], v) for n, v in model.items()):
                raise RuntimeError("the pulled model differs from the pushed one")
        finally:
            client.close()
        received = [int(b) for b in shards.bytes_received()]
        return {"metrics_bytes": received, "rss_bytes": [rss_bytes(pid) for pid in shards.pids()]}
    finally:
        shards.stop()


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
