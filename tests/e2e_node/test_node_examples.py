"""The shipped cluster example of asynchronous training, applied as it is, on the real node.

``manifests/examples/mnist-async.yaml`` is what a user applies first for async: its training
settings (the default staleness compensation, the model's learning rate) are trained here
unchanged on the whole of MNIST. Only what ties it to this cluster changes: the node it runs on
(selected and tolerated), MNIST from the node's disk in place of the example's /data volume the
user provides, and CPU requests that fit the node's 2 cores (the example asks 1 CPU a pod).
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from node_kit import ROOT, Kubectl, on_real_node, record, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]

EXAMPLE = ROOT / "manifests" / "examples" / "mnist-async.yaml"


def on_this_node(document: dict[str, Any], data: Path) -> dict[str, Any]:
    job = copy.deepcopy(document)
    volumes = [{"name": "mnist", "hostPath": {"path": str(data), "type": "Directory"}}]
    mounts = [{"name": "mnist", "mountPath": "/data/mnist", "readOnly": True}]
    for role in ("ps", "worker"):
        replica = job["spec"][role]
        replica["template"] = on_real_node(volumes, mounts)
        replica.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "100m"
    return job


@pytest.mark.timeout(1200)
def test_the_async_example_trains_a_model_on_the_real_node(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    training = document["spec"]["training"]
    assert training["useAsync"] is True
    assert document["spec"]["data"]["training"] == "/data/mnist/train"  # the volume this test fills
    name = document["metadata"]["name"]
    t0 = time.monotonic()
    kubectl.apply(ns, on_this_node(document, big_data))

    def finished() -> str:
        phase = str(kubectl.job(ns, name).get("status", {}).get("phase", ""))
        return phase if phase in ("Succeeded", "Failed") else ""

    phase = wait_for(finished, 1100, f"{name} to finish", interval=2)
    elapsed = time.monotonic() - t0
    status = kubectl.job(ns, name)["status"]
    shown = kubectl.show(ns)
    print(f"\n{shown}\nstatus: {status}", file=sys.stderr)
    report(f"the async example on the real node, apply -> {phase} in {elapsed:.1f} s", shown, status)
    record(f"manifests/examples/mnist-async.yaml (60,000 records, {training['numEpochs']} epochs): apply -> {phase}", elapsed)
    assert phase == "Succeeded", status
    accuracy = status.get("metrics", {}).get("accuracy")
    print(f"the async example's accuracy on the real node: {accuracy}", file=sys.stderr)
    # Issue 33 asks 98%; the bar here is a trained model at the sync job's learning rate and
    # momentum (uncompensated, this setting ended at 0.1135 in 3 of 5 runs), below the spread of
    # finals measured locally (docs/convergence.md) so that the test says a regression, not noise.
    assert accuracy is not None and accuracy >= 0.97, status
    assert status.get("mode", "").startswith("Async"), status
