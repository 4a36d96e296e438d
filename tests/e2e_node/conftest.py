"""TrainingJobs that really train: the control plane of hack/cluster plus one real node (containerd,
runc, CNI bridge, kubelet, kube-proxy, CoreDNS; ``cluster.py up --real-node``), the project's image
imported into the node's containerd, the operator installed with the Helm chart from that image, MNIST
on the node's disk mounted by hostPath, and ``kubectl`` for everything a user does.

Session fixtures: ``node_binaries`` (build.sh, a no-op when cached), ``node_cluster`` and
``operator``: the README's one-machine path as written (``make cluster-up REAL_NODE=1``, ``make
image`` unless ELASTICPS_REUSE_IMAGE=1 and Docker has the image, ``load-image``, ``helm install``
with ``values-real-node.yaml``; ``make cluster-down PURGE=1`` at the end), and ``data``. With
USE_EXISTING_CLUSTER=true the tests use the cluster of KUBECONFIG, which must have a node labelled
``elasticps.io/real-node=true`` with the image on it and the operator installed.

Skipped, with the reason printed, where a real node cannot run: not root, no containerd/runc/CNI
plugins, no Docker engine for the image, or no Go toolchain and no cached binaries. Timings of each
part are printed at the end of the session.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_kit import (
    IMAGE,
    NODE_LABEL,
    OPERATOR_NS,
    RELEASE,
    RESULTS,
    ROOT,
    TIMINGS,
    Kubectl,
    exports,
    full_data,
    node_data,
    readme_line,
    record,
    run_line,
    wait_for,
)

sys.path.insert(0, str(ROOT / "hack" / "cluster"))
import realnode  # noqa: E402



def _skip(reason: str) -> None:
    print(f"\nSKIPPING real-node tests: {reason}", file=sys.stderr)
    pytest.skip(reason)


def _timed(what: str, cmd: list[str], env: dict[str, str], timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    record(what, time.monotonic() - t0)
    return done


def _docker_env(env: dict[str, str]) -> dict[str, str]:
    started = subprocess.run(["bash", str(ROOT / "hack" / "image" / "engine.sh"), "start"], capture_output=True, text=True, timeout=600)
    if started.returncode == 3:
        _skip(f"no Docker engine to build the image: {started.stderr.strip()}")
    assert started.returncode == 0, started.stderr
    out = dict(env)
    for line in started.stdout.splitlines():
        if line.startswith("export DOCKER_HOST="):
            out["DOCKER_HOST"] = line.split("=", 1)[1]
    return out


@pytest.fixture(scope="session")
def node_binaries() -> dict[str, str]:
    """The environment, once this machine can run a real node and the cluster's binaries are built."""
    env = dict(os.environ)
    missing = realnode.preflight()
    if missing:
        _skip("this machine lacks " + "; ".join(missing))
    build = _timed("hack/cluster/build.sh (control plane + node binaries; ~0 s when cached)",
                   ["bash", str(ROOT / "hack" / "cluster" / "build.sh")], env)
    if build.returncode != 0:
        if shutil.which("go") is None:
            _skip("no cached Kubernetes binaries and no Go toolchain to build them (hack/cluster/build.sh)")
        pytest.fail(f"hack/cluster/build.sh failed:\n{build.stderr[-3000:]}")
    return env


@pytest.fixture(scope="session")
def node_cluster(node_binaries: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment (KUBECONFIG, PATH with kubectl/helm 1.34 first) of a cluster with a real node,
    brought up by the README's one-machine path as written (``readme_path``): ``make cluster-up
    REAL_NODE=1``, its ``eval``, ``make image`` (skipped when ELASTICPS_REUSE_IMAGE=1 and Docker
    has the image), ``load-image``; its last line, ``make cluster-down PURGE=1``, at the end."""
    env = dict(node_binaries)
    if os.environ.get("USE_EXISTING_CLUSTER") == "true":
        if not env.get("KUBECONFIG"):
            pytest.fail("USE_EXISTING_CLUSTER=true needs KUBECONFIG")
        yield env
        return
    if realnode.running_kubelet():
        pytest.fail(f"another cluster's {realnode.NODE_NAME} runs on this machine (one real node per machine)")
    env = _docker_env(env)
    # A short path: the containerd socket lives in it (unix socket paths are limited to 108 bytes).
    env["ELASTICPS_CLUSTER_DIR"] = str(tmp_path_factory.mktemp("node"))
    up = run_line(readme_line("make cluster-up"), env, timeout=1800)
    try:
        if up.returncode != 0:
            pytest.fail(f"{readme_line('make cluster-up')} failed:\n{up.stdout[-2000:]}{up.stderr[-4000:]}")
        print(up.stderr, file=sys.stderr)
        evaluated = readme_line("eval ")
        inner = re.fullmatch(r'eval "\$\((.+?)\)".*', evaluated)
        assert inner, f"the README's eval line changed: {evaluated}"
        shown = subprocess.run(["bash", "-c", inner.group(1)], cwd=ROOT, env=env, capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        env = exports(env, shown.stdout)
        have = subprocess.run(["docker", "image", "inspect", IMAGE], env=env, capture_output=True).returncode == 0
        if not (have and os.environ.get("ELASTICPS_REUSE_IMAGE") == "1"):
            image = run_line(readme_line("make image"), {**env, "PY": sys.executable})
            assert image.returncode == 0, image.stdout[-2000:] + image.stderr[-3000:]
        load = run_line(readme_line("python3 hack/cluster/cluster.py load-image"), env)
        assert load.returncode == 0, load.stderr[-3000:]
        print(load.stderr, file=sys.stderr)
        yield env
    finally:
        down = run_line(readme_line("make cluster-down"), env, timeout=300)
        print(down.stdout + down.stderr, file=sys.stderr)
        assert down.returncode == 0, f"{readme_line('make cluster-down')}: {down.stderr[-3000:]}"


@pytest.fixture(scope="session")
def kubectl(node_cluster: dict[str, str]) -> Kubectl:
    kubectl = Kubectl(node_cluster)
    nodes = kubectl.json("get", "nodes", "-l", f"{NODE_LABEL}=true")["items"]
    assert nodes, f"no node labelled {NODE_LABEL}=true"
    return kubectl


@pytest.fixture(scope="session")
def operator(kubectl: Kubectl) -> Iterator[str]:
    """The operator as users install it: the Helm chart (CRD included), the same image, running in
    the cluster on the real node. Yields its namespace."""
    if os.environ.get("USE_EXISTING_CLUSTER") == "true":
        yield OPERATOR_NS
        return
    # The README's line: the chart with helm/elasticps/values-real-node.yaml (the operator on the real node).
    line = readme_line("helm install")
    done = run_line(line, kubectl.env, timeout=400)
    if done.returncode != 0:
        pods = kubectl("get", "pods", "-n", OPERATOR_NS, "-o", "wide", check=False).stdout
        logs = kubectl("logs", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=elasticps", "--tail=50", check=False)
        pytest.fail(f"{line}: {done.stderr}\n{pods}\n{logs.stdout}{logs.stderr}")
    [pod] = kubectl.json("get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=elasticps")["items"]
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME, pod["spec"].get("nodeName")
    yield OPERATOR_NS
    subprocess.run(["helm", "uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", "--timeout", "2m"],
                   env=kubectl.env, capture_output=True, text=True, timeout=200)


@pytest.fixture(scope="session")
def data() -> Path:
    try:
        return node_data()
    except FileNotFoundError as err:
        _skip(str(err))
        raise


@pytest.fixture(scope="session")
def big_data(data: Path) -> Path:
    return full_data()


@pytest.fixture
def ns(kubectl: Kubectl, operator: str, request: pytest.FixtureRequest) -> Iterator[str]:
    words = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())[:40].strip("-")
    name = f"n-{words}-{uuid.uuid4().hex[:4]}"
    kubectl("create", "namespace", name)
    wait_for(lambda: kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
             30, f"the default ServiceAccount of {name}")  # fmt: skip
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


FIRST = "test_node_cluster.py"  # brings up and purges a cluster of its own: before the session's


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs FIRST's tests before the other real-node tests: one real node per machine, and the
    session's cluster (the README's path) lives from the first test that asks for it to the end."""
    here = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == Path(__file__).parent]
    if not here:
        return
    block = [items[i] for i in here]
    ordered = sorted(block, key=lambda item: Path(str(item.fspath)).name != FIRST)  # stable
    for i, item in zip(here, ordered):
        items[i] = item


def node_lines(kubectl: Kubectl, ns: str, keep: int = 30) -> str:
    """The last lines of the real node's kubelet and containerd logs that name ``ns``: why a pod
    stays ContainerCreating when its events do not say."""
    logs = Path(kubectl.env.get("ELASTICPS_CLUSTER_DIR", "")) / "logs"
    out = []
    for name in ("kubelet", "containerd"):
        path = logs / f"{name}.log"
        lines = [line for line in path.read_text(errors="replace").splitlines() if ns in line] if path.exists() else []
        out.append(f"--- {path} ({len(lines)} lines name {ns}; the last {keep}):")
        out.extend(line[:600] for line in lines[-keep:])
    # What the node did on its own: the kubelet's reclaims under pressure and image deletions.
    kubelet = logs / "kubelet.log"
    own = [line for line in kubelet.read_text(errors="replace").splitlines()
           if "eviction_manager" in line or "image_gc" in line or "Removing image" in line] if kubelet.exists() else []
    out.append(f"--- {kubelet}: eviction and image GC ({len(own)} lines; the last {keep}):")
    out.extend(line[:600] for line in own[-keep:])
    disk = subprocess.run(["df", "-h", str(realnode.CONTAINERD_ROOT.parent), str(logs.parent)], capture_output=True, text=True)
    out.append(f"--- df -h\n{disk.stdout}{disk.stderr}")
    return "\n".join(out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    kubectl, ns = funcargs.get("kubectl"), funcargs.get("ns")
    if report.when == "call" and report.failed and isinstance(kubectl, Kubectl):
        if ns:
            events = kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False).stdout
            report.sections.append(("cluster state", f"{kubectl.show(ns)}\n$ kubectl get events -n {ns}\n{events[-4000:]}"))
            report.sections.append(("the node's kubelet and containerd on this namespace", node_lines(kubectl, ns)))
            for pod in kubectl("get", "pods", "-n", ns, "-o", "name", check=False).stdout.split():
                logs = kubectl("logs", "-n", ns, pod, "--tail=40", check=False)
                report.sections.append((f"{pod} log (tail)", logs.stdout + logs.stderr))
        op = kubectl("logs", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=elasticps", "--tail=80", check=False)
        report.sections.append(("operator log (tail)", op.stdout + op.stderr))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("real-node timings")
        for line in TIMINGS:
            terminalreporter.write_line(line)
    if RESULTS:
        terminalreporter.section("real-node results")
        for text in RESULTS:
            terminalreporter.write_line(text)
