"""PyTorch workers on the real node (issue 36): the torch image (``make image VARIANT=torch``:
elasticps with torch and without TensorFlow, ``elasticps:latest-torch``) imported into the node's
containerd, and a TrainingJob whose model is the torch ``mnist_cnn`` taken from ``kubectl apply``
to ``Succeeded``: the operator (from the session's image) runs its PS and workers from the torch
image, which cannot import TensorFlow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from node_kit import ROOT, Kubectl, mnist_job, record, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]

TORCH_IMAGE = "elasticps:latest-torch"


@pytest.fixture(scope="module")
def torch_image(kubectl: Kubectl) -> str:
    """The torch image, built (unless ELASTICPS_REUSE_IMAGE=1 and Docker has it) and loaded into
    the real node's containerd."""
    if os.environ.get("USE_EXISTING_CLUSTER") == "true":
        return TORCH_IMAGE  # the cluster must have it on its real node
    env = kubectl.env
    have = subprocess.run(["docker", "image", "inspect", TORCH_IMAGE], env=env, capture_output=True).returncode == 0
    t0 = time.monotonic()
    if not (have and os.environ.get("ELASTICPS_REUSE_IMAGE") == "1"):
        built = subprocess.run(["make", "image", "VARIANT=torch", f"PY={sys.executable}"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=1800)  # fmt: skip
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    record("the torch image: make image VARIANT=torch", time.monotonic() - t0)
    without_tf = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", TORCH_IMAGE, "-c",
         "import importlib.util as u; assert u.find_spec('torch') and not u.find_spec('tensorflow')"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert without_tf.returncode == 0, without_tf.stderr[-2000:]
    t0 = time.monotonic()
    load = subprocess.run([sys.executable, "hack/cluster/cluster.py", "load-image", TORCH_IMAGE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert load.returncode == 0, load.stderr[-3000:]
    record("the torch image: load-image into the node's containerd", time.monotonic() - t0)
    return TORCH_IMAGE


@pytest.mark.timeout(3600)
def test_a_torch_mnist_job_trains_to_succeeded_on_the_real_node(kubectl: Kubectl, ns: str, data: Path, torch_image: str) -> None:
    name = "mnist-torch"
    job = mnist_job(name, data, epochs=3)
    job["spec"]["image"] = torch_image
    job["spec"]["model"] = {"framework": "torch", "modelDef": "elasticps.backends.pytorch.zoo.mnist_cnn"}
    t0 = time.monotonic()
    kubectl.apply(ns, job)

    seen: dict[str, dict[str, Any]] = {}  # every pod of the job while it runs (the PS's is deleted at the end)

    def finished() -> str:
        seen.update({p["metadata"]["name"]: p for p in kubectl.pods(ns, name)})
        phase = str(kubectl.job(ns, name).get("status", {}).get("phase", ""))
        return phase if phase in ("Succeeded", "Failed") else ""

    phase = wait_for(finished, 900, f"{name} to finish", interval=1)
    elapsed = time.monotonic() - t0
    status = kubectl.job(ns, name)["status"]
    shown = kubectl.show(ns)
    print(f"\n{shown}\nstatus: {status}", file=sys.stderr)
    report(f"MNIST with torch workers on the real node, apply -> {phase} in {elapsed:.1f} s", shown, status)
    record(f"MNIST torch (1 PS + 2 workers, 3 epochs): kubectl apply -> {phase}", elapsed)
    assert phase == "Succeeded", status
    pods = list(seen.values())
    assert len(pods) == 3 and {p["spec"]["nodeName"] for p in pods} == {"real-node-0"}
    assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {torch_image}
    accuracy = status.get("metrics", {}).get("accuracy")
    assert accuracy is not None, status.get("metrics")
    print(f"torch on the real node: accuracy {accuracy:.4f}", file=sys.stderr)
    assert accuracy > 0.5, status["metrics"]  # chance: 0.1 (the Keras job's bar on the same 3 epochs)
