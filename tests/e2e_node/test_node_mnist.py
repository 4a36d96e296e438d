"""MNIST trained for real on the real node: `kubectl apply` of a TrainingJob to `Succeeded`.

What only a real node shows: the pods start from the image in the node's containerd, workers find the
PS and the operator finds PS 0's coordinator through the headless Services' DNS names (CoreDNS), the
kubelet runs the gRPC probes, and everything runs non-root with a read-only root filesystem and the
emptyDir at /tmp.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from node_kit import Kubectl, mnist_job, record, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]


def _phase(kubectl: Kubectl, ns: str, name: str) -> str:
    return str(kubectl.job(ns, name).get("status", {}).get("phase", ""))


@pytest.mark.timeout(1200)
def test_sync_mnist_trains_to_succeeded(kubectl: Kubectl, ns: str, data: Path) -> None:
    name = "mnist-sync"
    t0 = time.monotonic()
    # 3 epochs of 4,096 records: 96 sync updates, enough to be far from chance on every run (one epoch,
    # 32 updates, ended between 0.32 and 0.83).
    kubectl.apply(ns, mnist_job(name, data, epochs=3))

    seen: dict[str, dict] = {}

    def running() -> bool:
        for p in kubectl.pods(ns, name):
            seen[p["metadata"]["name"]] = p
        return len(seen) == 3 and all(p["status"].get("podIP") for p in seen.values())

    wait_for(running, 300, "1 PS + 2 worker pods with IPs on the real node", interval=0.5)
    t_running = time.monotonic() - t0
    pods = list(seen.values())
    assert {p["spec"]["nodeName"] for p in pods} == {"real-node-0"}
    # Real pod IPs from the node's bridge (not kwok's bookkeeping range).
    assert all(p["status"]["podIP"].startswith("10.245.0.") for p in pods), [p["status"].get("podIP") for p in pods]

    def finished() -> str:
        phase = _phase(kubectl, ns, name)
        return phase if phase in ("Succeeded", "Failed") else ""

    phase = wait_for(finished, 900, f"{name} to finish", interval=1)
    elapsed = time.monotonic() - t0
    status = kubectl.job(ns, name)["status"]
    shown = kubectl.show(ns)
    print(f"\n{shown}\nstatus: {status}", file=sys.stderr)
    report(f"MNIST sync on the real node, apply -> {phase} in {elapsed:.1f} s", shown, status)
    record(f"MNIST sync (1 PS + 2 workers, 4096 records, 3 epochs): all pods have IPs after", t_running)
    record(f"MNIST sync: kubectl apply -> {phase}", elapsed)
    assert phase == "Succeeded", status
    metrics = status.get("metrics", {})
    accuracy = next((v for k, v in metrics.items() if "accuracy" in k.lower()), None)
    assert accuracy is not None, f"no accuracy in status.metrics: {metrics}"
    print(f"accuracy {accuracy:.4f}; metrics {metrics}", file=sys.stderr)
    assert accuracy > 0.5, metrics
