"""Helpers of the real-node tests: kubectl for real, polling waits, the MNIST data a user would place
on the node, the TrainingJob a user would write for it, and timings collected for the summary.

Imported by ``conftest.py`` and the tests (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("ELASTICPS_CACHE") or Path.home() / ".cache" / "elasticps")
NODE_LABEL = "elasticps.io/real-node"
IMAGE = "elasticps:latest"
RELEASE = "elasticps"  # the operator's Helm release, as the README installs it
OPERATOR_NS = "elasticps-system"
T = TypeVar("T")

# Figures printed at the end of the session (build, image import, each scenario).
TIMINGS: list[str] = []


# What a user would look at after each scenario (kubectl output, the job's figures), printed at the end.
RESULTS: list[str] = []


def record(what: str, seconds: float) -> None:
    TIMINGS.append(f"{what}: {seconds:.1f} s")


def figures(status: dict[str, Any]) -> str:
    """The job's status in one line: phase, accuracy, records trained (progress), restarts, version."""
    accuracy = next((v for k, v in status.get("metrics", {}).items() if "accuracy" in k.lower()), None)
    shown = "none" if accuracy is None else f"{accuracy:.4f}"
    return (
        f"phase {status.get('phase')}, accuracy {shown}, progress {status.get('progress')}, "
        f"restarts {status.get('restarts', 0)}, modelVersion {status.get('modelVersion')}"
    )


def report(title: str, shown: str, status: dict[str, Any]) -> None:
    RESULTS.append(f"--- {title}: {figures(status)}\n{shown.rstrip()}")


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 1.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@dataclass
class Kubectl:
    env: dict[str, str]

    def __call__(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["kubectl", *args], env=self.env, input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json").stdout)

    def apply(self, namespace: str, manifest: dict[str, Any]) -> None:
        self("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.json("get", "trainingjob", name, "-n", namespace)
        return found

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.json("get", "pods", "-n", namespace, "-l", f"elasticps.io/job-name={job}")["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def show(self, namespace: str) -> str:
        """What a user looks at: the jobs and the pods with their nodes and IPs."""
        tj = self("get", "trainingjobs", "-n", namespace, check=False).stdout
        pods = self("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        return f"$ kubectl get tj -n {namespace}\n{tj}\n$ kubectl get pods -n {namespace} -o wide\n{pods}"


def _idx_subset(src: Path, dst: Path, count: int) -> None:
    """The first ``count`` records of an idx(.gz) file, as another idx.gz file."""
    with gzip.open(src, "rb") as f:
        magic, n = struct.unpack(">II", f.read(8))
        ndim = magic & 0xFF
        dims = struct.unpack(">" + "I" * (ndim - 1), f.read(4 * (ndim - 1)))
        record = 1
        for d in dims:
            record *= d
        count = min(count, n)
        body = f.read(record * count)
    with gzip.open(dst, "wb") as f:
        f.write(struct.pack(">II", magic, count) + struct.pack(">" + "I" * (ndim - 1), *dims) + body)


def full_data() -> Path:
    """The whole MNIST (60000 training records) on the node's disk: for jobs that must still be
    training when a test disturbs them."""
    node_data()
    return CACHE / "data" / "mnist"


def node_data(train: int = 4096, test: int = 1024) -> Path:
    """MNIST on the node's disk, outside the repo, as a user would place it for a hostPath volume:
    the full set copied from MNIST_DIR (default ../shared/data/mnist) to ~/.cache/elasticps/data/mnist,
    and a small cut of it (``train``/``test`` records) beside it. Readable by the pods' uid 1000."""
    src = Path(os.environ.get("MNIST_DIR") or ROOT.parent / "shared" / "data" / "mnist")
    full = CACHE / "data" / "mnist"
    small = CACHE / "data" / f"mnist-{train}-{test}"
    files = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    if not all((full / f).exists() for f in files):
        if not all((src / f).exists() for f in files):
            raise FileNotFoundError(f"no MNIST idx files in {src} (set MNIST_DIR)")
        full.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(src / f, full / f)
    if not all((small / f).exists() for f in files):
        small.mkdir(parents=True, exist_ok=True)
        for f in files:
            _idx_subset(full / f, small / f, train if f.startswith("train") else test)
    for d in (full, small):
        os.chmod(d, 0o755)
        for path in d.iterdir():
            os.chmod(path, 0o644)
    return small


def on_real_node(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod template as a user writes it for this cluster: run on the real node (select it, tolerate
    its taint), mount the data. No imagePullPolicy: the operator's default (IfNotPresent) runs the
    image the node already has."""
    return {
        "spec": {
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 30,
            "volumes": volumes,
            "containers": [{"name": "elasticps", "volumeMounts": mounts}],
        }
    }


def mnist_job(name: str, data: Path, *, use_async: bool = False, workers: int = 2, epochs: int = 1,
              ps_volumes: list[dict[str, Any]] | None = None, ps_mounts: list[dict[str, Any]] | None = None,
              training: dict[str, Any] | None = None) -> dict[str, Any]:
    volumes = [{"name": "mnist", "hostPath": {"path": str(data), "type": "Directory"}}]
    mounts = [{"name": "mnist", "mountPath": "/data/mnist", "readOnly": True}]
    return {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": IMAGE,
            "model": {"modelDef": "elasticps.backends.keras.zoo.mnist_cnn"},
            "data": {"reader": "idx", "training": "/data/mnist/train", "validation": "/data/mnist/t10k"},
            "training": {
                "useAsync": use_async, "learningRate": 0.05, "minibatchSize": 64, "numEpochs": epochs,
                "recordsPerTask": 512, "evaluationSteps": 0, **(training or {}),
            },
            "ps": {
                "replicas": 1,
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                "template": on_real_node(volumes + (ps_volumes or []), mounts + (ps_mounts or [])),
            },
            "worker": {
                "replicas": workers,
                "restartPolicy": "OnFailure",
                "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
                "template": on_real_node(volumes, mounts),
            },
            "runPolicy": {"backoffLimit": 3, "cleanPodPolicy": "None"},
        },
    }


README = ROOT / "README.md"
PATH_START = "<!-- one-machine path:"
PATH_END = "<!-- end of the one-machine path -->"


def readme_path() -> list[str]:
    """The README's one-machine path ("On one machine, with a real node"), its lines as written:
    the shell lines of the fenced block between its two markers."""
    text = README.read_text()
    start = text.index(PATH_START)
    block = text[start : text.index(PATH_END, start)]
    lines = block.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    return [line for line in lines if line.strip()]


def readme_line(starting: str) -> str:
    """The one line of the README's path that starts with ``starting``."""
    [line] = [line for line in readme_path() if line.startswith(starting)]
    return line


def run_line(line: str, env: dict[str, str], timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """One README line, as a user's shell runs it (bash, in the repository), its time recorded."""
    t0 = time.monotonic()
    done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    record(f"README: {line.split('  #')[0].strip()}", time.monotonic() - t0)
    return done


def exports(env: dict[str, str], text: str) -> dict[str, str]:
    """``env`` after the shell ran the ``export K=V`` lines of ``text`` (what ``eval "$(...)"`` does)."""
    out = dict(env)
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            out[key] = value.replace("$PATH", out.get("PATH", ""))
    return out


def observer_token(kubectl: Kubectl, ns: str, job: str) -> str:
    """A token that may read the job's status: an observer's, made with the key of the job's identity
    Secret (what the operator does for its own probe)."""
    import base64

    from elasticps import identity

    data = kubectl.json("get", "secret", f"{job}-identity", "-n", ns)["data"]
    key = identity.parse_key(base64.b64decode(data["key"]).decode())
    return identity.token_for(key, identity.member_name(identity.OBSERVER, "node-test"))
