"""The operator against a real control plane: kube-apiserver, controller-manager, scheduler and etcd
(hack/cluster, Kubernetes 1.34) with kwok playing the nodes, the operator as a real process, kubectl
for real.

Session fixtures: ``cluster`` (``hack/cluster/build.sh`` - a no-op when the binaries are cached - then
``cluster.py up`` in a state dir of its own, ``down`` at the end; or, with USE_EXISTING_CLUSTER=true,
the cluster of the current KUBECONFIG), the CRD applied, and ``operator`` (``python -m elasticps
operator``). Each test gets a fresh namespace. A failed test's report carries the operator's log tail.

The module is skipped (with the reason printed) only when the control plane cannot be built at all
(no Go toolchain and no cached binaries); any other failure to build or start is a test failure.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster_kit import ROOT, FakeCoordinator, Kubectl, Operator, wait_for

CLUSTER_PY = ROOT / "hack" / "cluster" / "cluster.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment (KUBECONFIG, PATH with the cached kubectl first) of a running cluster."""
    env = dict(os.environ)
    if os.environ.get("USE_EXISTING_CLUSTER") == "true":
        if not env.get("KUBECONFIG"):
            pytest.fail("USE_EXISTING_CLUSTER=true needs KUBECONFIG")
        yield env
        return
    build = subprocess.run(["bash", str(ROOT / "hack" / "cluster" / "build.sh")], capture_output=True, text=True)
    if build.returncode != 0:
        if shutil.which("go") is None:
            reason = "no cached control-plane binaries and no Go toolchain to build them (hack/cluster/build.sh)"
            print(f"\nSKIPPING cluster tests: {reason}", file=sys.stderr)
            pytest.skip(reason)
        pytest.fail(f"hack/cluster/build.sh failed:\n{build.stderr[-3000:]}")
    env["ELASTICPS_CLUSTER_DIR"] = str(tmp_path_factory.mktemp("cluster"))
    up = subprocess.run([sys.executable, str(CLUSTER_PY), "up"], env=env, capture_output=True, text=True)
    try:
        if up.returncode != 0:
            pytest.fail(f"cluster.py up failed:\n{up.stderr[-3000:]}")
        for line in up.stdout.splitlines():  # export KUBECONFIG=...; export PATH=BIN:$PATH
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
        yield env
    finally:
        subprocess.run([sys.executable, str(CLUSTER_PY), "down"], env=env, capture_output=True, text=True)


@pytest.fixture(scope="session")
def kubectl(cluster: dict[str, str]) -> Kubectl:
    kubectl = Kubectl(cluster)
    kubectl("apply", "-f", str(ROOT / "manifests" / "crd.yaml"))
    # Polled, not `kubectl wait`: that fails at once ("accessor error: <nil>") when it asks before the
    # API server wrote the new CRD's first condition.
    established = '{.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + 60
    while kubectl("get", "crd/trainingjobs.elasticps.io", "-o", f"jsonpath={established}", check=False).stdout != "True":
        assert time.monotonic() < deadline, "the TrainingJob CRD was not Established within 60 s"
        time.sleep(0.2)
    return kubectl


@pytest.fixture(scope="session")
def operator(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    workdir = tmp_path_factory.mktemp("operator")
    coordinators = Path(f"/tmp/elasticps-coord-{uuid.uuid4().hex[:8]}")  # short: a unix socket path
    coordinators.mkdir()
    op = Operator(
        env=kubectl.env, workdir=workdir, liveness_port=_free_port(), coordinator_dir=coordinators,
        metrics_port=_free_port(),
    )
    op.start()
    try:
        yield op
    finally:
        op.stop()
        shutil.rmtree(coordinators, ignore_errors=True)


@pytest.fixture
def ns(kubectl: Kubectl, operator: Operator, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (deleted afterwards, without waiting), with its default ServiceAccount."""
    words = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())[:40].strip("-")
    name = f"t-{words}-{uuid.uuid4().hex[:4]}"
    kubectl("create", "namespace", name)
    wait_for(lambda: kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
             30, f"the default ServiceAccount of {name}")  # fmt: skip
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def coordinator(operator: Operator) -> Iterator[Any]:
    """``coordinator(namespace, job)`` plays PS 0's coordinator for that job until the test ends."""
    started: list[FakeCoordinator] = []

    def start(namespace: str, job: str) -> FakeCoordinator:
        fake = FakeCoordinator(operator.coordinator_dir / f"{namespace}.{job}.sock").start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    op = getattr(item, "funcargs", {}).get("operator")
    if report.failed and isinstance(op, Operator):
        report.sections.append(("operator log (tail)", op.log_tail(120)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = getattr(terminalreporter.config, "_elasticps_measurements", [])
    if lines:
        terminalreporter.section("operator measurements")
        for line in lines:
            terminalreporter.write_line(line)
