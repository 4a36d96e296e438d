"""The one-machine cluster itself: ``cluster.py up --real-node`` on a cluster already up adds the
real node to it (before: "already running", no node), and ``down --purge`` leaves the host as it
found it (before: the bridge and the kubelet's and CNI's iptables chains stayed).

Runs before the other real-node tests (this file sorts first) with a cluster of its own: one real
node per machine, so it refuses to run beside another's.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from node_kit import ROOT, Kubectl, exports, record

pytestmark = [pytest.mark.slow, pytest.mark.node]

sys.path.insert(0, str(ROOT / "hack" / "cluster"))
import realnode  # noqa: E402

CLUSTER_PY = ROOT / "hack" / "cluster" / "cluster.py"


def node_chains() -> list[str]:
    """The host's iptables chains of a real node (the kubelet's, kube-proxy's, CNI's), IPv4 and IPv6."""
    found = []
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            listing = subprocess.run([tool, "-t", table, "-S"], capture_output=True, text=True)
            found += [f"{tool} -t {table} {line.split()[1]}" for line in listing.stdout.splitlines()
                      if line.startswith("-N ") and line.split()[1].startswith(realnode.LEFTOVER_CHAIN_PREFIXES)]
    return found


def bridge_exists() -> bool:
    return subprocess.run(["ip", "link", "show", realnode.BRIDGE], capture_output=True).returncode == 0


@pytest.mark.timeout(900)
def test_a_real_node_joins_a_running_cluster_and_purge_leaves_the_host_clean(
    node_binaries: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    if realnode.running_kubelet():
        pytest.skip(f"another cluster's {realnode.NODE_NAME} runs on this machine")
    env = {**node_binaries, "ELASTICPS_CLUSTER_DIR": str(tmp_path_factory.mktemp("life"))}

    def cluster(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(CLUSTER_PY), *args], env=env, capture_output=True, text=True, timeout=600)

    up = cluster("up")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        env = exports(env, up.stdout)
        kubectl = Kubectl(env)
        kubectl("create", "configmap", "kept", "--from-literal=installed=before")
        fake = {n["metadata"]["name"] for n in kubectl.json("get", "nodes")["items"]}
        assert realnode.NODE_NAME not in fake

        t0 = time.monotonic()
        added = cluster("up", "--real-node")
        other = realnode.running_kubelet()
        if added.returncode and other:
            print(subprocess.run(["ps", "-o", "pid,ppid,etime,args", "-p", str(other)], capture_output=True, text=True).stdout)
        record("cluster.py up --real-node on a running cluster: the real node joins, Ready", time.monotonic() - t0)
        assert added.returncode == 0, added.stderr[-3000:]
        assert f"adding {realnode.NODE_NAME} to the running cluster" in added.stderr, added.stderr
        assert "already running" not in added.stderr
        node = kubectl.json("get", "node", realnode.NODE_NAME)
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]), node["status"]
        nodes = {n["metadata"]["name"] for n in kubectl.json("get", "nodes")["items"]}
        assert nodes == fake | {realnode.NODE_NAME}, nodes  # the fake nodes stay
        kept = kubectl.json("get", "configmap", "kept")
        assert kept["data"] == {"installed": "before"}  # what was in the cluster stays
        again = cluster("up", "--real-node")
        assert again.returncode == 0 and f"already running with {realnode.NODE_NAME}" in again.stderr, again.stderr
        assert bridge_exists() and node_chains()  # what purge must take away
    finally:
        down = cluster("down", "--purge")
    assert down.returncode == 0, down.stderr[-3000:]
    assert "host clean" in down.stderr, down.stderr
    assert not bridge_exists(), f"bridge {realnode.BRIDGE} left on the host"
    assert node_chains() == []
    assert not Path(env["ELASTICPS_CLUSTER_DIR"]).exists()

