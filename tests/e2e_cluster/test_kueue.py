"""Kueue admission against real Kueue: its controller manager (built from its Go module at the pinned
release), its CRDs and webhooks from the same module, added to the session's cluster by
``hack/cluster/cluster.py kueue``. The operator is the session's process; pods run on kwok nodes,
and PS 0's coordinator is played by a fake that says when a job has finished.

What is counted: which job has pods while the other waits (none at all for the waiting one), the
Workloads' admission and Finished conditions, the worker count a partial admission starts with.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cluster_kit import ROOT, Kubectl, Operator, condition, training_job, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
CLUSTER_PY = ROOT / "hack" / "cluster" / "cluster.py"


@pytest.fixture(scope="module")
def kueue(kubectl: Kubectl, operator: Operator) -> Iterator[Kubectl]:
    """Kueue running in the session's cluster (it stays until the cluster goes down), and the
    session's operator started again with ``--kueue`` (its Workload watch) for this module."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(CLUSTER_PY), "kueue"], env=kubectl.env, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cluster.py kueue failed:\n{done.stderr[-3000:]}")
    print(f"\nkueue: added to the cluster in {time.monotonic() - started:.1f} s ({done.stderr.strip().splitlines()[-1]})")
    operator.stop()
    operator.extra_args = ("--kueue",)
    operator.start()
    try:
        yield kubectl
    finally:
        operator.stop()
        operator.extra_args = ()
        operator.start()


def queue_objects(ns: str, cpu: str, memory: str = "64Gi", flavor: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue with ``cpu`` of quota on it, and the namespace's LocalQueue."""
    name = f"cq-{ns}"
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": f"flavor-{ns}"},
         "spec": flavor or {}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": ["cpu", "memory"],
             "flavors": [{"name": f"flavor-{ns}", "resources": [
                 {"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": memory}]}],
         }]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "team", "namespace": ns},
         "spec": {"clusterQueue": name}},
    ]


def queued_job(name: str, workers: int, **spec: Any) -> dict[str, Any]:
    """A job asking LocalQueue ``team``: each pod requests one CPU."""
    one_cpu = {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
    worker = {**one_cpu, **spec.pop("worker", {})}
    job = training_job(name, workers=workers, ps=one_cpu, worker=worker, **spec)
    job["metadata"]["labels"] = {QUEUE_LABEL: "team"}
    return job


def workload(kubectl: Kubectl, ns: str, job: str) -> dict[str, Any] | None:
    """The job's Workload (None: not created yet; never two)."""
    items: list[dict[str, Any]] = kubectl.json("get", "workloads.kueue.x-k8s.io", "-n", ns,
                                               "-l", f"elasticps.io/job-name={job}")["items"]
    assert len(items) <= 1, f"{job}: {len(items)} Workloads"
    return items[0] if items else None


def is_true(obj: dict[str, Any] | None, kind: str) -> bool:
    conditions = (obj or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def finish(kubectl: Kubectl, ns: str, name: str, ps0: Any, workers: int) -> None:
    ps0.set(finished=True, model_version=50, records_done=1000, records_total=1000, epoch=1)
    for i in range(workers):
        kubectl.set_pod_exit(ns, f"{name}-worker-{i}", 0)


def test_a_queue_with_quota_for_one_job_runs_two_one_after_the_other(
    kueue: Kubectl, ns: str, coordinator: Any
) -> None:
    kubectl = kueue
    for obj in queue_objects(ns, cpu="3"):  # one job: 1 PS + 2 workers, one CPU each
        kubectl.apply(ns if obj["kind"] == "LocalQueue" else "default", obj)
    first, second = coordinator(ns, "first"), coordinator(ns, "second")
    for fake in (first, second):
        fake.set(finished=False, model_version=1, records_done=10, records_total=1000)
    t0 = time.monotonic()
    kubectl.apply(ns, queued_job("first", workers=2))
    wait_for(lambda: is_true(workload(kubectl, ns, "first"), "Admitted"), 60, "first admitted")
    kubectl.apply(ns, queued_job("second", workers=2))

    # The first runs; the second waits with no pod at all, saying why.
    wait_for(lambda: kubectl.job(ns, "first").get("status", {}).get("phase") == "Running", 60, "first Running")
    t_first = time.monotonic() - t0
    def says_why(job: dict[str, Any]) -> dict[str, Any] | None:
        queued = condition(job, "Queued")
        reason = job.get("status", {}).get("phase") == "Queued" and queued and "quota" in queued["message"]
        return queued if reason else None

    queued = wait_for(lambda: says_why(kubectl.job(ns, "second")), 60, "second Queued, saying why")
    assert not is_true(workload(kubectl, ns, "second"), "QuotaReserved")
    time.sleep(3)  # a few passes of both: still no pod of the second
    assert kubectl.pods(ns, "second") == []
    assert len(kubectl.pods(ns, "first")) == 3
    print(f"\nfirst Running {t_first:.1f} s after apply; second Queued: {queued['message']}")

    # The first ends: its Workload says Finished, the quota goes to the second.
    finish(kubectl, ns, "first", first, workers=2)
    wait_for(lambda: kubectl.job(ns, "first")["status"].get("phase") == "Succeeded", 60, "first Succeeded")
    t_done = time.monotonic() - t0
    wait_for(lambda: is_true(workload(kubectl, ns, "first"), "Finished"), 30, "first's Workload Finished")
    wait_for(lambda: kubectl.job(ns, "second").get("status", {}).get("phase") == "Running", 60, "second Running")
    t_second = time.monotonic() - t0
    job2 = kubectl.job(ns, "second")
    admitted = condition(job2, "Admitted")
    assert admitted is not None and admitted["status"] == "True" and f"cq-{ns}" in admitted["message"], admitted
    finish(kubectl, ns, "second", second, workers=2)
    wait_for(lambda: kubectl.job(ns, "second")["status"].get("phase") == "Succeeded", 60, "second Succeeded")
    print(f"first Succeeded at {t_done:.1f} s; second Running at {t_second:.1f} s "
          f"({t_second - t_done:.1f} s after), Succeeded at {time.monotonic() - t0:.1f} s")


def test_partial_admission_starts_with_the_workers_the_quota_allows(kueue: Kubectl, ns: str, coordinator: Any) -> None:
    kubectl = kueue
    toleration = {"key": "elasticps.io/test-pool", "operator": "Exists", "effect": "NoSchedule"}
    flavor = {"nodeLabels": {"type": "kwok"}, "tolerations": [toleration]}
    for obj in queue_objects(ns, cpu="3", flavor=flavor):  # 1 PS + 2 of the 4 workers
        kubectl.apply(ns if obj["kind"] == "LocalQueue" else "default", obj)
    fake = coordinator(ns, "elastic")
    fake.set(finished=False, model_version=1, records_done=10, records_total=1000)
    kubectl.apply(ns, queued_job("elastic", workers=4, worker={"minReplicas": 2}))
    wl = wait_for(lambda: w if is_true(w := workload(kubectl, ns, "elastic"), "Admitted") else None, 60, "admitted")
    assert wl is not None
    assignments = {a["name"]: a.get("count") for a in wl["status"]["admission"]["podSetAssignments"]}
    assert assignments == {"ps": 1, "worker": 2}, assignments
    sets = {s["name"]: (s["count"], s.get("minCount")) for s in wl["spec"]["podSets"]}
    assert sets == {"ps": (1, None), "worker": (4, 2)}, sets
    # Two workers and the PS, placed by the flavor: its node label in every pod's selector, its
    # toleration in every pod's tolerations.
    job = wait_for(lambda: (j := kubectl.job(ns, "elastic")).get("status", {}).get("phase") == "Running" and j, 60,
                   "Running")
    pods = kubectl.pods(ns, "elastic")
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == ["elastic-ps-0", "elastic-worker-0", "elastic-worker-1"], names
    assert all(p["spec"].get("nodeSelector", {}).get("type") == "kwok" for p in pods)
    assert all(toleration in p["spec"].get("tolerations", []) for p in pods)
    time.sleep(3)  # more passes: still the two admitted workers, not the four of spec.worker.replicas
    assert len(kubectl.pods(ns, "elastic")) == 3
    admitted = condition(job, "Admitted")
    assert admitted is not None and "with 2 of 4 workers" in admitted["message"], admitted
    print(f"\npartial admission: {assignments}; {admitted['message']}")


def test_a_higher_priority_job_evicts_a_running_one_which_gives_back_its_quota_and_comes_back(
    kueue: Kubectl, ns: str, coordinator: Any
) -> None:
    kubectl = kueue
    for obj in queue_objects(ns, cpu="3"):
        if obj["kind"] == "ClusterQueue":
            obj["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
        kubectl.apply(ns if obj["kind"] == "LocalQueue" else "default", obj)
    for name, value in ((f"low-{ns}", 10), (f"high-{ns}", 1000)):
        kubectl.apply("default", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                                  "metadata": {"name": name}, "value": value})
    low, high = coordinator(ns, "low"), coordinator(ns, "high")
    for fake in (low, high):
        fake.set(finished=False, model_version=1, records_done=10, records_total=1000)
    job = queued_job("low", workers=2)
    job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"low-{ns}"
    kubectl.apply(ns, job)
    wait_for(lambda: kubectl.job(ns, "low").get("status", {}).get("phase") == "Running", 60, "low Running")
    first_pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(ns, "low")}
    assert workload(kubectl, ns, "low")["spec"]["priority"] == 10  # type: ignore[index]

    t0 = time.monotonic()
    job = queued_job("high", workers=2)
    job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"high-{ns}"
    kubectl.apply(ns, job)
    # Evicted: its pods go, it says Suspended with Kueue's reason, then gives the quota back.
    suspended = wait_for(lambda: c if (c := condition(kubectl.job(ns, "low"), "Suspended")) and c["status"] == "True"
                         else None, 60, "low Suspended")
    assert suspended["reason"] == "Evicted" and "Preempted" in suspended["message"], suspended
    wait_for(lambda: kubectl.pods(ns, "low") == [], 60, "low's pods gone")
    wait_for(lambda: kubectl.job(ns, "high").get("status", {}).get("phase") == "Running", 60, "high Running")
    t_high = time.monotonic() - t0
    low_wl = workload(kubectl, ns, "low")
    assert not is_true(low_wl, "QuotaReserved") and not is_true(low_wl, "Admitted"), low_wl
    assert kubectl.job(ns, "low")["status"]["phase"] == "Queued"
    events = {e["reason"] for e in kubectl.events(ns, "low")}
    assert {"Evicted", "Queued"} <= events, events

    # The high one ends; the low one is admitted again and its pods are new ones.
    finish(kubectl, ns, "high", high, workers=2)
    wait_for(lambda: kubectl.job(ns, "low").get("status", {}).get("phase") == "Running", 60, "low Running again")
    t_back = time.monotonic() - t0
    again = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(ns, "low")}
    assert sorted(again) == sorted(first_pods) and not set(again.values()) & set(first_pods.values())
    assert condition(kubectl.job(ns, "low"), "Suspended")["status"] == "False"  # type: ignore[index]
    finish(kubectl, ns, "low", low, workers=2)
    wait_for(lambda: kubectl.job(ns, "low")["status"].get("phase") == "Succeeded", 60, "low Succeeded")
    print(f"\npreemption: high Running {t_high:.1f} s after apply (low evicted: {suspended['message'][:80]}...); "
          f"low Running again {t_back:.1f} s after, then Succeeded")
