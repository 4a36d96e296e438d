"""A decentralized (Hop) job trained as pods on the real node: `kubectl apply` to Succeeded.

No PS: a coordinator pod hands out the data, three worker pods on a ring average their models with
their neighbours' through each one's headless Service (CoreDNS names), and `kubectl get tj` shows
the strategy (MODE) and the workers' lowest-highest iteration.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from node_kit import Kubectl, mnist_job, record, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]


@pytest.mark.timeout(1200)
def test_decentralized_ring_trains_to_succeeded(kubectl: Kubectl, ns: str, data: Path) -> None:
    name = "mnist-hop"
    t0 = time.monotonic()
    job = mnist_job(name, data, epochs=2, workers=3)
    job["spec"]["strategy"] = "decentralized"
    job["spec"]["decentralized"] = {"graph": "ring", "maxIterationGap": 4}
    del job["spec"]["ps"]
    kubectl.apply(ns, job)
    seen: list[str] = []

    def finished() -> str:
        status = kubectl.job(ns, name).get("status", {})
        if status.get("iterations"):
            seen.append(str(status["iterations"]))
        phase = str(status.get("phase", ""))
        return phase if phase in ("Succeeded", "Failed") else ""

    phase = wait_for(finished, 900, f"{name} to finish", interval=2)
    elapsed = time.monotonic() - t0
    status = kubectl.job(ns, name)["status"]
    shown = kubectl.show(ns)
    print(f"\n{shown}\nstatus: {status}\niterations seen: {seen}", file=sys.stderr)
    report(f"MNIST decentralized (ring of 3), apply -> {phase} in {elapsed:.1f} s", shown, status)
    record(f"MNIST decentralized (coordinator + 3 workers, 4096 records, 2 epochs): kubectl apply -> {phase}", elapsed)
    assert phase == "Succeeded", status
    assert status.get("mode") == "Decentralized", status
    # The coordinator, like a PS, never finishes by itself: it is stopped once the job succeeded
    # (deleted in the pass that sets Succeeded; gone once its deletion completes).
    workers = {f"{name}-worker-0", f"{name}-worker-1", f"{name}-worker-2"}

    def only_workers_left() -> set[str] | None:
        pods = {p["metadata"]["name"] for p in kubectl.pods(ns, name)}
        return pods if pods == workers else None

    wait_for(only_workers_left, 60, "the coordinator pod to be deleted once the job succeeded", interval=1)
    assert status["replicaStatuses"]["worker"]["succeeded"] == 3
    services = set(kubectl("get", "services", "-n", ns, "-o", "name").stdout.split())
    assert {f"service/{name}-worker-{i}" for i in range(3)} | {f"service/{name}-coordinator-0"} <= services, services
    assert seen and all(re.fullmatch(r"\d+-\d+", s) for s in seen), seen
    low, high = map(int, str(status["iterations"]).split("-"))
    assert 0 < low <= high == status["modelVersion"], status  # every worker ran; the highest is the version
    accuracy = status.get("metrics", {}).get("accuracy")
    assert accuracy is not None and accuracy > 0.5, status
