"""The Helm chart against the real API server: it renders objects the server accepts, installs, and
its RBAC is exactly enough.

Enough: the operator runs as a real process with the credentials of the chart's ServiceAccount (a
token from the TokenRequest API in a kubeconfig of its own), cluster-wide as the chart's default
Deployment runs it, and takes manifests/examples/mnist-sync.yaml to Running (PS Service and pods
created, Events posted, status patched) without a single 403 in its log. No more: with the same
credentials nodes cannot be deleted, Deployments not created, Secrets not read.

kwok runs no containers, so the chart's own Deployment never really starts; the session's operator
(cluster-admin, every namespace) is stopped while the ServiceAccount's operator runs, so no job is
handled by two operators, and started again afterwards.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster_kit import ROOT, Kubectl, Operator, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

CHART = ROOT / "helm" / "elasticps"
RELEASE = "elasticps"
SYSTEM = "elasticps-system"
ACCOUNT = "elasticps-operator"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def helm(kubectl: Kubectl) -> Any:
    binary = shutil.which("helm", path=kubectl.env.get("PATH"))
    if binary is None:
        pytest.fail("no helm on the cluster's PATH (hack/cluster/build.sh caches helm beside kubectl)")

    def run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([binary, *args], env=kubectl.env, input=input, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    return run


@pytest.mark.parametrize("sets", [(), ("watchNamespaces={default,kube-public}",)], ids=["all-namespaces", "namespaced"])
def test_rendered_chart_passes_server_side_dry_run(helm: Any, kubectl: Kubectl, sets: tuple[str, ...]) -> None:
    args = ["template", RELEASE, str(CHART), "--namespace", "default", "--include-crds"]
    for value in sets:
        args += ["--set", value]
    rendered = helm(*args).stdout
    done = kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    kinds = {line.split("/")[0] for line in done.stdout.splitlines()}
    assert "deployment.apps" in kinds and "serviceaccount" in kinds, done.stdout


def service_account_kubeconfig(kubectl: Kubectl, path: Path) -> Path:
    """A kubeconfig with the cluster's server and CA (from the admin's) and the ServiceAccount's token."""
    admin = kubectl.json("config", "view", "--raw", "--minify", "--flatten")
    [cluster] = admin["clusters"]
    token = kubectl("create", "token", ACCOUNT, "-n", SYSTEM, "--duration=1h").stdout.strip()
    assert token, "no token from the TokenRequest API"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster["cluster"]}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": ACCOUNT, "context": {"cluster": "cluster", "user": ACCOUNT, "namespace": "default"}}],
        "current-context": ACCOUNT,
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@pytest.fixture
def installed(helm: Any, kubectl: Kubectl) -> Iterator[None]:
    helm("install", RELEASE, str(CHART), "-n", SYSTEM, "--create-namespace")
    try:
        yield
    finally:
        helm("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "60s", check=False)
        kubectl("delete", "namespace", SYSTEM, "--wait=false", check=False)


def test_helm_install_grants_enough_and_no_more(
    installed: None, kubectl: Kubectl, operator: Operator, ns: str, tmp_path: Path
) -> None:
    # What the chart installed (the Deployment's pod is kwok's: it never runs the operator).
    deployment = kubectl.json("get", "deployment", ACCOUNT, "-n", SYSTEM)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == ACCOUNT
    kubectl("get", "serviceaccount", ACCOUNT, "-n", SYSTEM)
    role = kubectl.json("get", "clusterrole", ACCOUNT)
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in role["rules"])
    binding = kubectl.json("get", "clusterrolebinding", ACCOUNT)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": SYSTEM}]

    env = {**kubectl.env, "KUBECONFIG": str(service_account_kubeconfig(kubectl, tmp_path / "sa.kubeconfig"))}
    as_operator = Kubectl(env)
    assert as_operator("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == (
        f"system:serviceaccount:{SYSTEM}:{ACCOUNT}"
    )

    # Enough: the operator with these credentials takes the sync example to Running.
    coordinators = Path(f"/tmp/elasticps-helm-{uuid.uuid4().hex[:8]}")
    coordinators.mkdir()
    restricted = Operator(env=env, workdir=tmp_path, liveness_port=_free_port(), coordinator_dir=coordinators)
    name = f"sync-{uuid.uuid4().hex[:6]}"
    operator.stop()
    try:
        restricted.start()
        job = yaml.safe_load((ROOT / "manifests" / "examples" / "mnist-sync.yaml").read_text())
        job["metadata"]["name"] = name
        kubectl.apply(ns, job)
        workers, n_ps = job["spec"]["worker"]["replicas"], job["spec"]["ps"]["replicas"]
        expected = {f"{name}-ps-{i}" for i in range(n_ps)} | {f"{name}-worker-{i}" for i in range(workers)}
        wait_for(lambda: {p["metadata"]["name"] for p in kubectl.pods(ns, name)} == expected, 60, f"the pods of {name}")

        def is_running() -> dict[str, Any] | None:
            status = kubectl.job(ns, name).get("status", {})
            return status if status.get("phase") == "Running" else None

        status = wait_for(is_running, 60, f"{ns}/{name} Running")
        assert status is not None
        assert status["workers"] == f"{workers}/{workers}" and status["ps"] == f"{n_ps}/{n_ps}", status
        services = {s["metadata"]["name"] for s in kubectl.json("get", "services", "-n", ns)["items"]}
        assert {f"{name}-ps-{i}" for i in range(n_ps)} <= services
        reasons = {e["reason"] for e in kubectl.events(ns, name)}
        assert {"SuccessfulCreatePod", "SuccessfulCreateService"} <= reasons, reasons
        annotations = kubectl.job(ns, name)["metadata"].get("annotations", {})
        assert any(key.startswith("elasticps.io/") for key in annotations), annotations  # kopf's patch went through
        log = restricted.log_tail(100_000)
        for refused in ("Forbidden", "forbidden", "Not enough permissions"):
            assert refused not in log, f"the operator was refused something ({refused!r}):\n{restricted.log_tail(60)}"
    finally:
        restricted.stop()
        shutil.rmtree(coordinators, ignore_errors=True)
        kubectl("delete", "trainingjob", name, "-n", ns, "--wait=false", check=False)
        operator.start()

    # No more: nothing beyond what the operator calls.
    def can_i(*args: str) -> str:
        return as_operator("auth", "can-i", *args, check=False).stdout.strip()

    assert can_i("create", "pods", "-n", ns) == "yes"
    assert can_i("patch", "trainingjobs.elasticps.io/status", "-n", ns) == "yes"
    assert can_i("delete", "nodes") == "no"
    assert can_i("create", "deployments", "-n", "default") == "no"
    # Secrets: get, create and patch by name (each job's identity Secret), never list or watch.
    assert can_i("get", "secrets", "-n", ns) == "yes"
    assert can_i("list", "secrets", "-n", ns) == "no"
    assert can_i("delete", "secrets", "-n", ns) == "no"
    assert can_i("update", "pods", "-n", ns) == "no"
    assert can_i("delete", "services", "-n", ns) == "no"
    assert can_i("list", "namespaces") == "no"
    secrets = as_operator("get", "secrets", "-A", check=False)
    assert secrets.returncode != 0 and "Forbidden" in secrets.stderr, secrets.stderr
