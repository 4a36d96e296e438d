"""Where a PS round trip's time goes: the Python steps of one direction, timed in-process.

A push is: the client encodes tensors into serialized Frame messages (``frames.encode``; gRPC sends
those bytes as they are), the servicer parses them and reassembles the tensors (``frames.decode``) and
the store checks and applies them (SGD). A pull is the same two codec steps the other way, without
the store. Timed here in one process, one after the
other, with no network: what is left of a measured round trip is gRPC's own work (HTTP/2 framing,
copies into and out of its buffers, thread hand-offs) and the kernel's loopback copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from elasticps.proto import elasticps_pb2 as pb
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc import frames

MB = 1 << 20
REPS = 5


def _median_ms(step: Callable[[], object], reps: int = REPS) -> float:
    step()  # warm-up (first-touch page faults)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def measure(sizes_mb: list[int], chunk_bytes: int, num_variables: int = 4) -> list[dict[str, Any]]:
    out = []
    for size_mb in sizes_mb:
        elements = size_mb * MB // 4 // num_variables
        model = {f"layer{i}/kernel": np.full(elements, 0.5, dtype=np.float32) for i in range(num_variables)}
        grads = {name: np.full_like(value, 1e-3) for name, value in model.items()}
        store = ParameterStore(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC)))
        store.initialize(model, OptimizerConfig("sgd", {"learning_rate": 0.01}))
        head = pb.Frame(push=pb.PushHead(worker="bench", version=0))
        encoded = list(frames.encode(head, grads, chunk_bytes))
        decoded = frames.decode(encoded).tensors
        target = np.empty(size_mb * MB, dtype=np.uint8)
        source = np.concatenate([g.view(np.uint8) for g in grads.values()])
        steps = {
            "encode": _median_ms(lambda: list(frames.encode(head, grads, chunk_bytes))),
            "decode": _median_ms(lambda: frames.decode(encoded)),
            "store_push": _median_ms(lambda: store.push(decoded, store.version)),
            "memcpy": _median_ms(lambda: np.copyto(target, source)),
        }
        codec = steps["encode"] + steps["decode"]
        out.append(
            {
                "size_mb": size_mb,
                "chunk_bytes": chunk_bytes,
                "ms": steps,
                "codec_one_way_ms": codec,
                "python_round_trip_ms": 2 * codec + steps["store_push"],
            }
        )
    return out
