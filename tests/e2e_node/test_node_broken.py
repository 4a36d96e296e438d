"""Five jobs a user breaks, on the real node: each fails once, soon after its first pod starts, with
the failing replica's own line as the job's REASON/MESSAGE in ``kubectl get tj`` and in ``kubectl
describe`` (its condition and a Warning event). Issue 34's five: an image the node cannot pull, a
model module that does not exist, missing training data, an output nobody may write, a typo in a
pod template. The seconds from the first pod's start (or, with no pod, from the apply) to Failed
are printed in the session's summary; no test asserts wall-clock time.
"""

from __future__ import annotations

import calendar
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node_kit import Kubectl, mnist_job, record, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]


def _image(job: dict[str, Any]) -> None:
    job["spec"]["image"] = "elasticps:nope"


def _model(job: dict[str, Any]) -> None:
    job["spec"]["model"]["modelDef"] = "elasticps.backends.keras.zoo.mnist_cnnn"


def _data(job: dict[str, Any]) -> None:
    job["spec"]["data"]["training"] = "/data/mnist/trian"


def _output(job: dict[str, Any]) -> None:
    job["spec"]["output"] = "/out/mnist"  # no volume there: the root filesystem is read-only


def _template(job: dict[str, Any]) -> None:
    pod = job["spec"]["worker"]["template"]["spec"]
    pod["nodeSelectr"] = pod.pop("nodeSelector")


# (how the job is broken, the reason it must fail with, words of the replica's own line)
BROKEN: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "image": (_image, "ErrImagePull", "elasticps:nope"),
    "model": (_model, "UserError", "mnist_cnnn"),
    "data": (_data, "UserError", "trian"),
    "output": (_output, "UserError", "/out/mnist"),
    "template": (_template, "InvalidSpec", 'unknown field "spec.nodeSelectr"'),
}


def _epoch(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_job_fails_once_with_the_replicas_own_line(kubectl: Kubectl, ns: str, data: Path, broken: str) -> None:
    breaks, reason, words = BROKEN[broken]
    job = copy.deepcopy(mnist_job(f"broken-{broken}", data, workers=1))
    breaks(job)
    name = job["metadata"]["name"]
    applied = time.time()
    kubectl.apply(ns, job)

    def failed() -> dict[str, Any] | None:
        status: dict[str, Any] = kubectl.job(ns, name).get("status", {})
        return status if status.get("phase") in ("Failed", "Succeeded") else None

    status = wait_for(failed, 400, f"{name} to fail", interval=1)
    pods = kubectl.json("get", "pods", "-n", ns)["items"]
    starts = [_epoch(p["status"]["startTime"]) for p in pods if p.get("status", {}).get("startTime")]
    failed_at = next(_epoch(c["lastTransitionTime"]) for c in status["conditions"] if c["type"] == "Failed")
    since = min(starts) if starts else applied
    seconds = failed_at - since
    row = kubectl("get", "tj", name, "-n", ns).stdout
    described = kubectl("describe", "tj", name, "-n", ns).stdout
    events = [line.strip() for line in described.splitlines() if line.strip().startswith("Warning")]
    print(f"\n{row}\n{described}", file=sys.stderr)
    report(f"broken {broken}: Failed {seconds:.0f} s after {'its first pod started' if starts else 'the apply'}",
           row, status)  # fmt: skip
    record(f"broken job ({broken}): first pod start (or apply) -> Failed", seconds)
    assert status["phase"] == "Failed", status
    assert status["reason"] == reason, status
    assert words in status["message"], status
    assert status.get("restarts", 0) == 0, status  # once: nothing was replaced
    assert status["message"][:60] in row.replace("\n", " ") or reason in row, row  # REASON/MESSAGE columns
    assert any(reason in line and words in line for line in events), events  # the Warning event names the line
    kubectl("delete", "tj", name, "-n", ns, "--wait=false", check=False)
