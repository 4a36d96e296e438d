"""The README's one-machine path, to its end: MNIST and the job's folder on the node's disk, the
real-node example applied, ``kubectl wait`` until it Succeeded. The session fixtures ran its first
lines (``make cluster-up REAL_NODE=1``, ``make image``, ``load-image``, ``helm install`` with
``values-real-node.yaml``); its last, ``make cluster-down PURGE=1``, ends the session.

``manifests/examples/mnist-async-real-node.yaml`` trains what ``manifests/examples/mnist-async.yaml``
trains (``tests/api/test_manifests_files.py`` keeps the two alike): asynchronous SGD at the model's
own learning rate and momentum with the default staleness compensation, on the whole of MNIST.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from node_kit import ROOT, Kubectl, readme_path, record, report, run_line

pytestmark = [pytest.mark.slow, pytest.mark.node]

EXAMPLE = ROOT / "manifests" / "examples" / "mnist-async-real-node.yaml"
FOLDERS = Path("/var/lib/elasticps")


def the_jobs_lines() -> list[str]:
    """The lines after ``helm install`` and before ``make cluster-down``: data, apply, wait."""
    lines = readme_path()
    start = next(i for i, line in enumerate(lines) if line.startswith("helm install")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("make cluster-down"))
    return lines[start:end]


@pytest.mark.timeout(2400)
def test_the_readme_path_trains_the_real_node_example_to_succeeded(kubectl: Kubectl, operator: str, big_data: Path) -> None:
    lines = the_jobs_lines()
    assert [line.split()[:2] for line in lines] == [["mkdir", "-p"], ["cp", '"$MNIST"/*-ubyte.gz'],
                                                    ["kubectl", "apply"], ["kubectl", "wait"]], lines  # fmt: skip
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    # A folder of an earlier run holds its checkpoints: the job would resume from them.
    shutil.rmtree(FOLDERS / "jobs" / name, ignore_errors=True)
    env = {**kubectl.env, "MNIST": os.environ.get("MNIST_DIR") or str(big_data)}
    t0 = time.monotonic()
    try:
        for line in lines:
            done = run_line(line, env, timeout=2000)
            if done.returncode != 0:
                described = kubectl("describe", "trainingjob", name, "-n", "default", check=False).stdout
                pytest.fail(f"{line}: exit {done.returncode}: {done.stdout}{done.stderr}\n{kubectl.show('default')}\n{described}")
        elapsed = time.monotonic() - t0
        status = kubectl.job("default", name)["status"]
        shown = kubectl.show("default")
        print(f"\n{shown}\nstatus: {status}", file=sys.stderr)
        report(f"the README's real-node example, mkdir -> Succeeded in {elapsed:.1f} s", shown, status)
        record("README: the real-node example (60,000 records, 3 epochs), apply -> Succeeded", elapsed)
        assert status["phase"] == "Succeeded", status
        accuracy = status.get("metrics", {}).get("accuracy")
        print(f"the real-node example's accuracy: {accuracy}", file=sys.stderr)
        # Issue 33 asks 98%; the bar here is a trained model (uncompensated, this setting ended at
        # 0.1135 in 3 of 5 runs), below the spread of finals measured locally (docs/convergence.md)
        # so that the test says a regression, not noise. The figure is printed in the summary.
        assert accuracy is not None and accuracy >= 0.97, status
        assert status.get("mode", "").startswith("Async"), status
        checkpoints = sorted(p.name for p in (FOLDERS / "jobs" / name / "checkpoints").iterdir())
        assert "ps-0" in checkpoints and "ps-1" in checkpoints, checkpoints  # checkpoints on, on the node's disk
        assert (FOLDERS / "jobs" / name / "model" / "job.json").exists()  # the model exported there
    finally:
        kubectl("delete", "trainingjob", name, "-n", "default", "--wait=false", check=False)
