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

from node_kit import Kubectl, mnist_job, record, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]


def _phase(kubectl: Kubectl, ns: str, name: str) -> str:
    return str(kubectl.job(ns, name).get("status", {}).get("phase", ""))


@pytest.mark.timeout(1200)
def test_sync_mnist_trains_to_succeeded(kubectl: Kubectl, ns: str, data: Path) -> None:
    name = "mnist-sync"
    t0 = time.monotonic()
    kubectl.apply(ns, mnist_job(name, data))

    def running() -> bool:
        pods = kubectl.pods(ns, name)
        return len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods)

    wait_for(running, 300, "1 PS + 2 worker pods Running on the real node", interval=2)
    t_running = time.monotonic() - t0
    pods = kubectl.pods(ns, name)
    assert {p["spec"]["nodeName"] for p in pods} == {"real-node-0"}
    # Real pod IPs from the node's bridge (not kwok's bookkeeping range).
    assert all(p["status"]["podIP"].startswith("10.245.0.") for p in pods), [p["status"].get("podIP") for p in pods]

    # The kubelet runs the gRPC readiness probe: PS 0 turns Ready only once its health service answers.
    def ps_ready() -> bool:
        pod = kubectl.json("get", "pod", f"{name}-ps-0", "-n", ns)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))

    wait_for(ps_ready, 180, "PS 0 Ready (gRPC readiness probe run by the kubelet)", interval=1)
    ps_ip = kubectl.json("get", "pod", f"{name}-ps-0", "-n", ns)["status"]["podIP"]
    # Inside a worker, as its process sees it: the PS's DNS name (CoreDNS), the user, the read-only
    # root filesystem, the writable emptyDir at /tmp.
    probe = (
        "import os, socket\n"
        f"print('dns', socket.getaddrinfo('{name}-ps-0.{ns}.svc', 2222)[0][4][0])\n"
        "print('uid', os.getuid())\n"
        "try:\n    open('/home/elasticps/x', 'w')\n    print('rootfs writable')\n"
        "except OSError as e:\n    print('rootfs', e.errno, e.strerror)\n"
        "open('/tmp/x', 'w').write('ok'); print('tmp writable')\n"
    )
    seen = kubectl("exec", "-n", ns, f"{name}-worker-0", "-c", "elasticps", "--", "python3", "-c", probe, check=False)
    print(f"\nkubectl exec in worker-0:\n{seen.stdout}{seen.stderr}", file=sys.stderr)
    assert f"dns {ps_ip}" in seen.stdout, seen.stdout + seen.stderr
    assert "uid 1000" in seen.stdout
    assert "rootfs 30 Read-only file system" in seen.stdout
    assert "tmp writable" in seen.stdout

    def finished() -> str:
        phase = _phase(kubectl, ns, name)
        return phase if phase in ("Succeeded", "Failed") else ""

    phase = wait_for(finished, 900, f"{name} to finish", interval=3)
    elapsed = time.monotonic() - t0
    status = kubectl.job(ns, name)["status"]
    shown = kubectl.show(ns)
    print(f"\n{shown}\nstatus: {status}", file=sys.stderr)
    record(f"MNIST sync (1 PS + 2 workers, 4096 records, 1 epoch): pods Running after", t_running)
    record(f"MNIST sync: kubectl apply -> {phase}", elapsed)
    assert phase == "Succeeded", status
    metrics = status.get("metrics", {})
    accuracy = next((v for k, v in metrics.items() if "accuracy" in k.lower()), None)
    assert accuracy is not None, f"no accuracy in status.metrics: {metrics}"
    print(f"accuracy {accuracy:.4f}; metrics {metrics}", file=sys.stderr)
    assert accuracy > 0.5, metrics
