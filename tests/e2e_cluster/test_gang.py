"""Gang scheduling against the real scheduler-plugins' Coscheduling plugin (a second kube-scheduler
built from its Go module, added by ``hack/cluster/cluster.py coscheduler``) on a small pool of kwok
nodes: two jobs that each need more than half of the pool, applied together.

Without a gang policy the default scheduler places pods as they come: both jobs get part of their
pods and the rest wait (counted, and for how long it stays so). With ``spec.scheduling.policy:
coscheduling`` one job gets all its pods and the other none; when the first Succeeds, the second
starts whole and Succeeds. PS 0's coordinator is played by a fake that says when a job finished.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cluster_kit import ROOT, Kubectl, condition, training_job, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

CLUSTER_PY = ROOT / "hack" / "cluster" / "cluster.py"
POOL_CPUS = 4  # per node; two nodes: 8 CPUs, and each job asks for 5


@pytest.fixture(scope="module")
def coscheduler(kubectl: Kubectl) -> Kubectl:
    done = subprocess.run([sys.executable, str(CLUSTER_PY), "coscheduler"], env=kubectl.env, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cluster.py coscheduler failed:\n{done.stderr[-3000:]}")
    print(f"\n{done.stderr.strip().splitlines()[-1]}")
    return kubectl


@pytest.fixture
def pool(kubectl: Kubectl, ns: str) -> Iterator[str]:
    """Two kwok nodes of 4 CPUs each, labelled for this test only."""
    names = [f"gang-{ns[-4:]}-{i}" for i in range(2)]
    for name in names:
        capacity = {"cpu": str(POOL_CPUS), "memory": "32Gi", "pods": "110"}
        kubectl.apply("default", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"pool": ns, "type": "kwok"},
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
            "status": {"capacity": capacity, "allocatable": capacity},
        })
    wait_for(lambda: all(any(c["type"] == "Ready" and c["status"] == "True"
                             for c in kubectl.json("get", "node", n)["status"].get("conditions", [])) for n in names),
             60, "the pool's nodes Ready")
    wait_for(lambda: not any(kubectl.json("get", "node", n)["spec"].get("taints") for n in names), 60, "pool untainted")
    yield ns
    kubectl("delete", "node", *names, "--wait=false", check=False)


def big_job(name: str, pool: str, **spec: Any) -> dict[str, Any]:
    """1 PS + 4 workers, one CPU each, on the pool: 5 of its 8 CPUs."""
    template = {"spec": {"nodeSelector": {"pool": pool}}}
    one_cpu = {"resources": {"requests": {"cpu": "1"}}, "template": template}
    return training_job(name, workers=4, ps=one_cpu, worker=one_cpu, **spec)


def running(kubectl: Kubectl, ns: str, job: str) -> int:
    return sum(1 for p in kubectl.pods(ns, job) if p.get("status", {}).get("phase") == "Running")


def pod_group(kubectl: Kubectl, ns: str, job: str) -> dict[str, Any] | None:
    """The job's PodGroup (None: there is none)."""
    found = kubectl("get", "podgroups.scheduling.x-k8s.io", job, "-n", ns, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None  # type: ignore[no-any-return]


def finish(kubectl: Kubectl, ns: str, name: str, ps0: Any) -> None:
    ps0.set(finished=True, model_version=50, records_done=1000, records_total=1000, epoch=1)
    for i in range(4):
        kubectl.set_pod_exit(ns, f"{name}-worker-{i}", 0)


def test_without_a_gang_the_pool_fills_with_part_of_a_job_that_waits_for_the_other(coscheduler: Kubectl, ns: str, pool: str, coordinator: Any) -> None:
    kubectl = coscheduler
    fakes = {job: coordinator(ns, job) for job in ("a", "b")}
    for fake in fakes.values():
        fake.set(finished=False, model_version=1, records_done=10, records_total=1000)
    both = {"apiVersion": "v1", "kind": "List", "items": [big_job("a", pool), big_job("b", pool)]}
    kubectl.apply(ns, both)  # together, in one apply
    wait_for(lambda: running(kubectl, ns, "a") + running(kubectl, ns, "b") == 2 * POOL_CPUS, 60, "the pool full")
    t0 = time.monotonic()
    time.sleep(5)  # and it stays so: nobody gives way
    counts = {job: running(kubectl, ns, job) for job in ("a", "b")}
    pending = {job: 5 - n for job, n in counts.items()}
    assert sum(counts.values()) == 2 * POOL_CPUS and sum(pending.values()) == 2, counts  # still stuck: 2 pods wait
    assert min(counts.values()) < 5, counts  # at least one job holds part of the pool and waits for the rest
    unschedulable = {job: condition(kubectl.job(ns, job), "Unschedulable") for job in ("a", "b")}
    print(f"\nno gang: pods running {counts}, pending {pending} after {time.monotonic() - t0:.0f} s more; "
          f"Unschedulable: { {j: (c or {}).get('status') for j, c in unschedulable.items()} }")
    # A part-started job holds its share of the pool until the other ends; only then does it get whole.
    first = max(counts, key=lambda j: counts[j])
    other = "b" if first == "a" else "a"
    finish(kubectl, ns, first, fakes[first])
    wait_for(lambda: running(kubectl, ns, other) == 5, 120, f"{other} whole after {first} ended")
    print(f"{other} ran {counts[other]} of its 5 pods for {time.monotonic() - t0:.1f} s, until {first} ended")


def test_with_a_gang_one_job_starts_whole_and_the_other_after_it(
    coscheduler: Kubectl, ns: str, pool: str, coordinator: Any
) -> None:
    kubectl = coscheduler
    fakes = {job: coordinator(ns, job) for job in ("a", "b")}
    for fake in fakes.values():
        fake.set(finished=False, model_version=1, records_done=10, records_total=1000)
    gang = {"scheduling": {"policy": "coscheduling"}}
    t0 = time.monotonic()
    kubectl.apply(ns, big_job("a", pool, **gang))
    kubectl.apply(ns, big_job("b", pool, **gang))
    for job in ("a", "b"):
        group = wait_for(lambda j=job: pod_group(kubectl, ns, j), 30, f"{job}'s PodGroup")  # type: ignore[misc]
        assert group["spec"]["minMember"] == 5
    first = wait_for(lambda: next((j for j in ("a", "b") if running(kubectl, ns, j) == 5), None), 90, "one gang whole")
    second = "b" if first == "a" else "a"
    t_first = time.monotonic() - t0
    time.sleep(5)
    assert running(kubectl, ns, second) == 0, kubectl.pods(ns, second)  # none of it, not part
    assert running(kubectl, ns, first) == 5
    waiting = condition(kubectl.job(ns, second), "Unschedulable")
    print(f"\ngang: {first} whole after {t_first:.1f} s, {second} waits whole "
          f"({(waiting or {}).get('message', '')[:120]})")

    finish(kubectl, ns, first, fakes[first])
    wait_for(lambda: kubectl.job(ns, first)["status"].get("phase") == "Succeeded", 60, f"{first} Succeeded")
    t_done = time.monotonic() - t0
    wait_for(lambda: running(kubectl, ns, second) == 5, 120, f"{second} whole")
    t_second = time.monotonic() - t0
    finish(kubectl, ns, second, fakes[second])
    wait_for(lambda: kubectl.job(ns, second)["status"].get("phase") == "Succeeded", 60, f"{second} Succeeded")
    assert pod_group(kubectl, ns, first) is None, "the finished job's PodGroup is deleted"
    print(f"{first} Succeeded at {t_done:.1f} s; {second} whole at {t_second:.1f} s, Succeeded at "
          f"{time.monotonic() - t0:.1f} s")


def test_the_gang_follows_the_job_when_its_workers_are_scaled(
    coscheduler: Kubectl, ns: str, pool: str, coordinator: Any
) -> None:
    kubectl = coscheduler
    coordinator(ns, "c").set(finished=False, model_version=1, records_done=10, records_total=1000)
    kubectl.apply(ns, big_job("c", pool, scheduling={"policy": "coscheduling"}))

    def min_member() -> int | None:
        group = pod_group(kubectl, ns, "c")
        return None if group is None else int(group["spec"]["minMember"])

    wait_for(lambda: running(kubectl, ns, "c") == 5, 90, "c whole")
    assert min_member() == 5
    seen = [5]
    for workers in (2, 3):
        kubectl("patch", "trainingjob", "c", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"worker": {"replicas": workers}}}))
        wait_for(lambda w=workers: min_member() == 1 + w, 30, f"minMember {1 + workers}")  # type: ignore[misc]
        wait_for(lambda w=workers: running(kubectl, ns, "c") == 1 + w and len(kubectl.pods(ns, "c")) == 1 + w, 60,
                 f"{1 + workers} pods")  # type: ignore[misc]
        seen.append(min_member() or 0)
    print(f"\ngang minMember as the workers went 4 -> 2 -> 3: {seen}")
    assert seen == [5, 3, 4]
