"""Preemption by Kueue on the real node: a high-priority job evicts a low-priority one that trains
real MNIST; the low one stops (its workers, then its PS, which checkpoint the version they stopped
at), gives its quota back, waits, resumes from that checkpoint when the high one has finished, and
Succeeds with every minibatch of the epoch in both PS shards' models exactly once (the shards'
round logs on a hostPath, ``elasticps.tools.round_log``), no round lost to the eviction, and both
shards at one version.

Kueue (its controller manager built from its Go module, its CRDs and webhooks) joins the session's
node cluster (``hack/cluster/cluster.py kueue``); the operator, installed by the chart as the
README says, is upgraded with ``kueue.enabled=true`` (its RBAC for Workloads and its watch).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_kit import CACHE, NODE_LABEL, OPERATOR_NS, RELEASE, Kubectl, mnist_job, record, report, wait_for
from elasticps.tools import round_log

pytestmark = [pytest.mark.slow, pytest.mark.node]

QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"
RECORDS, PER_TASK, MINIBATCH = 60000, 512, 64
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kueue(kubectl: Kubectl, operator: str) -> Iterator[Kubectl]:
    done = subprocess.run([sys.executable, str(ROOT / "hack" / "cluster" / "cluster.py"), "kueue"], env=kubectl.env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cluster.py kueue failed:\n{done.stderr[-3000:]}")
    print(done.stderr.strip().splitlines()[-1], file=sys.stderr)
    upgrade = ["helm", "upgrade", RELEASE, str(ROOT / "helm" / "elasticps"), "-n", OPERATOR_NS, "--reuse-values",
               "--set", "kueue.enabled=true", "--wait", "--timeout", "3m"]
    done = subprocess.run(upgrade, env=kubectl.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    args = kubectl.json("get", "deployment", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=elasticps")["items"][0]
    assert "--kueue" in args["spec"]["template"]["spec"]["containers"][0]["args"]
    yield kubectl


def _status(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kubectl.job(ns, name).get("status", {})
    return found


def _condition(kubectl: Kubectl, ns: str, name: str, kind: str) -> dict[str, Any]:
    return next((c for c in _status(kubectl, ns, name).get("conditions", []) if c["type"] == kind), {})


def _queue(kubectl: Kubectl, ns: str) -> None:
    """A ClusterQueue with quota for one of the jobs below on a flavor of the real node, preempting
    lower priorities; the namespace's LocalQueue; two priority classes."""
    flavor = {"nodeLabels": {NODE_LABEL: "true"},
              "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]}
    objects: list[tuple[str, dict[str, Any]]] = [
        ("default", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                     "metadata": {"name": f"node-{ns}"}, "spec": flavor}),
        ("default", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"cq-{ns}"},
                     "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                              "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                                  "name": f"node-{ns}", "resources": [{"name": "cpu", "nominalQuota": "1"},
                                                                      {"name": "memory", "nominalQuota": "8Gi"}]}]}]}}),
        (ns, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "team"},
              "spec": {"clusterQueue": f"cq-{ns}"}}),
    ]
    for name, value in (("low", 10), ("high", 1000)):
        objects.append(("default", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                                    "metadata": {"name": f"{name}-{ns}"}, "value": value}))
    for namespace, obj in objects:
        kubectl.apply(namespace, obj)


def _queued(job: dict[str, Any], priority: str, cpu: str) -> dict[str, Any]:
    job["metadata"]["labels"] = {QUEUE: "team", PRIORITY: priority}
    for role in ("ps", "worker"):
        job["spec"][role]["resources"]["requests"]["cpu"] = cpu
    return job


@pytest.mark.timeout(1800)
def test_a_preempted_job_resumes_from_its_checkpoint_and_trains_every_record_once(
    kueue: Kubectl, ns: str, big_data: Path
) -> None:
    kubectl = kueue
    _queue(kubectl, ns)
    ckpt = CACHE / "node-checkpoints" / ns
    (ckpt / "rounds").mkdir(parents=True, exist_ok=True)
    for d in (ckpt, ckpt / "rounds"):
        d.chmod(0o777)  # the PS runs as uid 1000
    low = mnist_job("low", big_data, ps_volumes=[{"name": "ckpt", "hostPath": {"path": str(ckpt), "type": "Directory"}}],
                    ps_mounts=[{"name": "ckpt", "mountPath": "/ckpt"}],
                    training={"checkpointDir": "/ckpt", "checkpointSteps": 20, "recordsPerTask": PER_TASK})
    low["spec"]["ps"]["replicas"] = 2
    low["spec"]["ps"]["template"]["spec"]["containers"][0]["env"] = [{"name": "ELASTICPS_ROUND_LOG", "value": "/ckpt/rounds"}]
    t0 = time.monotonic()
    kubectl.apply(ns, _queued(low, f"low-{ns}", "200m"))  # 2 PS + 2 workers: 800m of the 1 CPU
    wait_for(lambda: int(_status(kubectl, ns, "low").get("modelVersion") or 0) >= 60, 600,
             "low past its first checkpoints (modelVersion >= 60 of ~938)", interval=0.5)
    evicted_at = int(_status(kubectl, ns, "low").get("modelVersion") or 0)

    high = mnist_job("high", big_data, workers=1, training={"recordsPerTask": PER_TASK})
    high["spec"]["data"]["training"] = "/data/mnist/train[0:8000]"
    t1 = time.monotonic()
    kubectl.apply(ns, _queued(high, f"high-{ns}", "300m"))  # 600m: only with the low one gone
    suspended = wait_for(lambda: c if (c := _condition(kubectl, ns, "low", "Suspended")).get("status") == "True" else None,
                         120, "low evicted", interval=0.5)
    assert suspended["reason"] == "Evicted" and "Preempted" in suspended["message"], suspended
    wait_for(lambda: kubectl.pods(ns, "low") == [], 120, "low's pods gone", interval=0.5)
    wait_for(lambda: _status(kubectl, ns, "high").get("phase") == "Succeeded", 600, "high Succeeded", interval=2)
    t_high = time.monotonic() - t1
    wait_for(lambda: _status(kubectl, ns, "low").get("phase") in ("Succeeded", "Failed"), 900, "low finished", interval=3)
    status = _status(kubectl, ns, "low")
    total = time.monotonic() - t0
    print(f"\nlow evicted at version {evicted_at}; high ran {t_high:.0f} s; {kubectl.show(ns)}\nstatus: {status}",
          file=sys.stderr)
    record(f"MNIST sync 2 PS, preempted by Kueue at version {evicted_at} and resumed: apply -> {status['phase']}", total)
    assert status["phase"] == "Succeeded", status
    rolled = next((c["message"] for c in status["conditions"] if c["type"] == "RolledBack"), "no rollback")
    expected = round_log.expected_per_epoch(RECORDS, PER_TASK, MINIBATCH)
    for shard in (0, 1):
        entries = round_log.read(ckpt / "rounds" / f"ps-{shard}.jsonl")
        per_epoch, twice = round_log.per_epoch(entries), round_log.twice(entries)
        at = next(i for i, e in enumerate(entries) if "restored" in e)  # the restart after the eviction
        resumed = int(entries[at]["restored"])
        lost = sum(1 for e in entries[:at] if "round" in e and int(e["round"]) >= resumed)
        print(f"PS {shard}: minibatches in the model per epoch {per_epoch} (the data's: {expected}), twice: "
              f"{len(twice)}; resumed at version {resumed}, rounds lost to the eviction: {lost}", file=sys.stderr)
        assert per_epoch == {0: expected} and twice == []
        # It stopped in order (workers, then the PS, which checkpointed where they stopped): nothing lost.
        assert lost == 0, f"PS {shard} resumed at {resumed}, {lost} rounds before"
    versions = status.get("shardVersions")
    assert isinstance(versions, list) and len(versions) == 2 and versions[0] == versions[1], versions
    report(f"low preempted at version {evicted_at}, resumed ({rolled})", kubectl.show(ns), status)
