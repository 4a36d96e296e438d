"""LocalSGD trained as pods on the real node, with a straggler made on purpose.

The same YAML fields as a local run (``localSGDSteps``, ``slowdown``): the MODE column of
``kubectl get tj`` names the mode, the job reaches Succeeded, the shards' version counts rounds of
averaged periods (fewer than sync's updates), and the slowed worker's own log shows it slept inside
its pod while the other did not.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from node_kit import Kubectl, mnist_job, record, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]

K = 4
RECORDS, MINIBATCH, RECORDS_PER_TASK, EPOCHS, WORKERS = 4096, 64, 512, 3, 2
TASKS = RECORDS // RECORDS_PER_TASK * EPOCHS  # 24 tasks of 8 minibatches
MINIBATCHES = TASKS * RECORDS_PER_TASK // MINIBATCH  # 192
SYNC_UPDATES = MINIBATCHES // WORKERS  # 96: what sync would commit


def _slept(log: str) -> float:
    found = re.search(r"done: Counters\(.*slowed_s=([0-9.e+-]+)\)", log)
    assert found, log[-2000:]
    return float(found.group(1))


@pytest.mark.timeout(1200)
def test_local_sgd_with_a_straggler_trains_to_succeeded(kubectl: Kubectl, ns: str, data: Path) -> None:
    name = "mnist-localsgd"
    t0 = time.monotonic()
    kubectl.apply(ns, mnist_job(name, data, epochs=EPOCHS, workers=WORKERS,
                                training={"localSGDSteps": K, "slowdown": "1:2"}))

    def finished() -> str:
        phase = str(kubectl.job(ns, name).get("status", {}).get("phase", ""))
        return phase if phase in ("Succeeded", "Failed") else ""

    phase = wait_for(finished, 900, f"{name} to finish", interval=2)
    elapsed = time.monotonic() - t0
    status = kubectl.job(ns, name)["status"]
    shown = kubectl.show(ns)
    print(f"\n{shown}\nstatus: {status}", file=sys.stderr)
    report(f"MNIST LocalSGD{K} with worker 1 2x slower, apply -> {phase} in {elapsed:.1f} s", shown, status)
    record(f"MNIST LocalSGD{K}, worker 1 2x slower: kubectl apply -> {phase}", elapsed)
    assert phase == "Succeeded", status

    assert status.get("mode") == f"LocalSGD{K}", status
    row = next(line for line in shown.splitlines() if line.startswith(name))
    assert f"LocalSGD{K}" in row.split(), shown  # the MODE column

    # Every task's 8 minibatches make 2 periods of K (a worker's first task 3: its first period is one
    # step, before the coordinator's K reaches it), and a round averages at most one period per worker.
    periods_most = TASKS * (RECORDS_PER_TASK // MINIBATCH // K) + WORKERS
    rounds = int(status.get("modelVersion") or 0)
    assert TASKS * 2 // WORKERS <= rounds <= periods_most < SYNC_UPDATES, status

    worker0 = kubectl("logs", f"{name}-worker-0", "-n", ns, check=False).stdout
    worker1 = kubectl("logs", f"{name}-worker-1", "-n", ns, check=False).stdout
    slept0, slept1 = _slept(worker0), _slept(worker1)
    print(f"rounds {rounds}; worker 0 slept {slept0:.2f} s, worker 1 slept {slept1:.2f} s", file=sys.stderr)
    assert slept0 == 0.0 and slept1 > 0.0

    accuracy = status.get("metrics", {}).get("accuracy")
    assert accuracy is not None and accuracy > 0.5, status
