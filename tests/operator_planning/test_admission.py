"""Admission by a queue (Kueue), without a cluster: the planner's rule (``planning.admission``) through
a whole life (asked, queued, admitted with fewer workers, evicted, released, admitted again,
finished), and the Workload side (``operator.kueue``): what is read from it, what is written to it.
The same protocol against real Kueue: tests/e2e_cluster/test_kueue.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import job_builders
from job_builders import merge

from elasticps.api.replicas import Role
from elasticps.api.spec import TrainingJob
from elasticps.operator import kueue
from elasticps.operator.rendering import CreateGroup, CreatePod, Queueing, Renderer, ReplaceStatus
from elasticps.operator.scheduling import PodDecoration
from elasticps.planning.actions import (
    Action,
    CreateReplica,
    DeleteReplica,
    Event,
    FinishAdmission,
    ReleaseAdmission,
    RequestAdmission,
    SetStatus,
)
from elasticps.planning.observed import Admission, JobProgress, Observed, ObservedPod, ObservedService, PodPhase
from elasticps.planning.plan import plan
from elasticps.planning.settings import PlannerSettings
from elasticps.planning.status import apply_merge_patch

NOW = 1_700_000_000.0
SETTINGS = PlannerSettings(pending_timeout_s=600.0)
UID = "0123456789abcdef"


def make_job(spec: dict[str, Any] | None = None) -> TrainingJob:
    return job_builders.make_job(merge({"worker": {"replicas": 4, "minReplicas": 2}}, spec or {}), name="tj", namespace="ns")


def pods(ps: int, workers: int, deleted: bool = False) -> list[ObservedPod]:
    out = [ObservedPod(f"tj-ps-{i}", Role.PS, i, PodPhase.RUNNING, ready=True, deleted=deleted) for i in range(ps)]
    return out + [ObservedPod(f"tj-worker-{i}", Role.WORKER, i, PodPhase.RUNNING, ready=True, deleted=deleted)
                  for i in range(workers)]


class Life:
    """A job's status carried from pass to pass, as the API server keeps it."""

    def __init__(self, job: TrainingJob) -> None:
        self.job, self.status, self.now = job, {}, NOW

    def step(self, live: Sequence[ObservedPod], admission: Admission | None,
             coordinator: JobProgress | None = None) -> list[Action]:
        self.now += 1
        observed = Observed(pods=tuple(live), services=(ObservedService("tj-ps-0"),), now=self.now, status=self.status,
                            admission=admission, coordinator=coordinator, network_policies=("tj-ps",))
        actions = plan(self.job, observed, SETTINGS)
        assert plan(self.job, observed, SETTINGS) == actions  # idempotent
        for action in actions:
            if isinstance(action, SetStatus):
                self.status = apply_merge_patch(self.status, action.status)
        return actions

    def condition(self, kind: str) -> dict[str, Any]:
        return next((c for c in self.status.get("conditions", []) if c["type"] == kind), {})


def names(actions: Sequence[Action], kind: type) -> list[str]:
    return [a.name for a in actions if isinstance(a, kind)]


def of(actions: Sequence[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def test_a_queued_job_asks_once_runs_what_it_was_admitted_and_gives_back_what_it_lost() -> None:
    life = Life(make_job())
    # Not asked yet: one request, workers may start with 2 of 4; no replica; phase Queued.
    actions = life.step([], Admission("team"))
    assert of(actions, RequestAdmission) == [RequestAdmission(((Role.PS, 1, 1), (Role.WORKER, 4, 2)))]
    assert names(actions, CreateReplica) == []
    assert life.status["phase"] == "Queued" and life.condition("Queued")["status"] == "True"
    # Asked, waiting: no second request; the queue's reason in the condition.
    waiting = Admission("team", requested=True, waiting="insufficient unused quota for cpu in flavor default")
    actions = life.step([], waiting)
    assert of(actions, RequestAdmission) == [] and names(actions, CreateReplica) == []
    assert "insufficient unused quota" in life.condition("Queued")["message"]
    # Admitted with 2 workers: PS 0 and two workers, never four.
    admitted = Admission("team", requested=True, admitted=True, holds_quota=True, cluster_queue="cq",
                         counts={Role.PS: 1, Role.WORKER: 2})
    actions = life.step([], admitted)
    assert names(actions, CreateReplica) == ["tj-ps-0", "tj-worker-0", "tj-worker-1"]
    assert life.condition("Admitted")["status"] == "True"
    assert "ClusterQueue cq with 2 of 4 workers" in life.condition("Admitted")["message"]
    assert life.condition("Queued")["status"] == "False"
    actions = life.step(pods(1, 2), admitted)
    assert names(actions, CreateReplica) == [] and names(actions, DeleteReplica) == []
    assert life.status["phase"] == "Running"
    # Evicted: every replica deleted, Suspended with the queue's reason; quota kept until they are gone.
    evicted = Admission("team", requested=True, admitted=True, holds_quota=True, evicted="Preempted to accommodate a "
                        "workload (UID: x) due to prioritization in the ClusterQueue", counts=admitted.counts)
    # The workers first; the PS once no worker is left (the model stands still: the shards
    # checkpoint the version they stop at).
    actions = life.step(pods(1, 2), evicted)
    assert sorted(names(actions, DeleteReplica)) == ["tj-worker-0", "tj-worker-1"]
    assert of(actions, ReleaseAdmission) == []
    assert life.condition("Suspended")["reason"] == "Evicted" and "Preempted" in life.condition("Suspended")["message"]
    assert life.status["phase"] == "Suspended"
    assert "Evicted" in [e.reason for e in of(actions, Event)]
    going = [*pods(1, 0), *pods(0, 2, deleted=True)]
    actions = life.step(going, evicted)  # workers still going: the PS stays
    assert of(actions, ReleaseAdmission) == [] and names(actions, DeleteReplica) == []
    actions = life.step(pods(1, 0), evicted)
    assert names(actions, DeleteReplica) == ["tj-ps-0"] and of(actions, ReleaseAdmission) == []
    actions = life.step(pods(1, 0, deleted=True), evicted)  # still going: nothing new
    assert of(actions, ReleaseAdmission) == [] and names(actions, DeleteReplica) == []
    actions = life.step([], evicted)  # gone: the quota goes back, once
    assert len(of(actions, ReleaseAdmission)) == 1
    assert life.status["phase"] == "Queued"
    released = Admission("team", requested=True, evicted=evicted.evicted, waiting="Preempted")
    assert of(life.step([], released), ReleaseAdmission) == []
    # Admitted again, all four this time: created again, Suspended False, the deadline clock restarts.
    again = Admission("team", requested=True, admitted=True, holds_quota=True, counts={Role.PS: 1, Role.WORKER: 4})
    actions = life.step([], again)
    assert names(actions, CreateReplica) == ["tj-ps-0", "tj-worker-0", "tj-worker-1", "tj-worker-2", "tj-worker-3"]
    assert life.condition("Suspended")["status"] == "False"
    # Finished: the queue is told once.
    done = JobProgress(finished=True, model_version=10, progress=1.0)
    actions = life.step([*pods(1, 0), *(ObservedPod(f"tj-worker-{i}", Role.WORKER, i, PodPhase.SUCCEEDED, exit_code=0)
                                          for i in range(4))], again, done)
    assert life.status["phase"] == "Succeeded"
    actions = life.step(pods(0, 0), again)
    assert of(actions, FinishAdmission) == [FinishAdmission(True, life.condition("Succeeded")["message"])]
    told = Admission("team", requested=True, admitted=True, holds_quota=True, finished=True, counts=again.counts)
    assert of(life.step(pods(0, 0), told), FinishAdmission) == []


def test_a_job_without_a_queue_never_hears_of_admission() -> None:
    life = Life(make_job())
    actions = life.step([], None)
    assert names(actions, CreateReplica) == ["tj-ps-0", *(f"tj-worker-{i}" for i in range(4))]
    assert not [a for a in actions if isinstance(a, (RequestAdmission, ReleaseAdmission, FinishAdmission))]
    assert "Queued" not in [c["type"] for c in life.status.get("conditions", [])]


# ---- the Workload ----------------------------------------------------------------------------------------


def workload(conditions: dict[str, str], admission: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "apiVersion": kueue.API_VERSION, "kind": "Workload",
        "metadata": {"name": "trainingjob-tj-01234", "namespace": "ns", "generation": 1, "resourceVersion": "7"},
        "spec": {"podSets": [{"name": "ps", "count": 1}, {"name": "worker", "count": 4, "minCount": 2}]},
        "status": {"conditions": [{"type": t, "status": s, "reason": "R", "message": f"{t} says {s}",
                                   "lastTransitionTime": "2026-11-29T00:00:00Z"} for t, s in conditions.items()],
                   **status},
    }
    if admission is not None:
        wl["status"]["admission"] = admission
    return wl


ADMISSION = {"clusterQueue": "cq", "podSetAssignments": [
    {"name": "ps", "flavors": {"cpu": "on-demand", "memory": "on-demand"}},
    {"name": "worker", "count": 2, "flavors": {"cpu": "spot", "memory": "spot"}},
]}


def test_what_the_workload_says() -> None:
    assert kueue.admission_of(None, "team") == Admission("team")
    pending = kueue.admission_of(workload({"QuotaReserved": "False"}), "team")
    assert pending.requested and not pending.admitted and pending.waiting == "QuotaReserved says False"
    running = kueue.admission_of(workload({"QuotaReserved": "True", "Admitted": "True"}, ADMISSION), "team")
    assert running.admitted and running.holds_quota and running.cluster_queue == "cq"
    assert running.counts == {Role.PS: 1, Role.WORKER: 2}  # a pod set without a count: all it asked
    evicted = kueue.admission_of(workload({"QuotaReserved": "True", "Admitted": "True", "Evicted": "True"}, ADMISSION), "q")
    assert evicted.evicted == "Evicted says True"
    assert kueue.admission_of(workload({"Finished": "True"}), "q").finished
    assert kueue.workload_name("tj", UID) == "trainingjob-tj-01234"
    assert len(kueue.workload_name("x" * 80, UID)) == 63 and kueue.workload_name("x" * 80, UID).endswith("-01234")


def test_flavors_place_the_pods_and_admission_checks_add_theirs() -> None:
    flavors = {
        "on-demand": {"spec": {"nodeLabels": {"pool": "on-demand"}}},
        "spot": {"spec": {"nodeLabels": {"pool": "spot"}, "tolerations": [{"key": "spot", "operator": "Exists"}]}},
    }
    checks = [{"name": "prov", "state": "Ready", "podSetUpdates": [{"name": "worker", "nodeSelector": {"zone": "a"},
                                                                       "annotations": {"a": "b"}}]}]
    wl = workload({"Admitted": "True"}, ADMISSION, admissionChecks=checks)
    assert kueue.flavor_names(wl) == {"on-demand", "spot"}
    placed = kueue.placements(wl, flavors)
    assert placed[Role.PS] == PodDecoration(node_selector={"pool": "on-demand"})
    assert placed[Role.WORKER].node_selector == {"pool": "spot", "zone": "a"}
    assert placed[Role.WORKER].tolerations == ({"key": "spot", "operator": "Exists"},)
    assert placed[Role.WORKER].annotations == {"a": "b"}
    # Rendered: the worker's pod carries them over its template's.
    job = make_job({"worker": {"template": {"spec": {"nodeSelector": {"disk": "ssd"},
                                                     "tolerations": [{"key": "gpu", "operator": "Exists"}]}}}})
    queueing = Queueing("team", wl, placed, None, NOW)
    [created] = Renderer().render([CreateReplica("tj-worker-0", Role.WORKER, 0)], job, UID, queueing)
    assert isinstance(created, CreatePod)
    spec = created.manifest["spec"]
    assert spec["nodeSelector"] == {"disk": "ssd", "pool": "spot", "zone": "a"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}, {"key": "spot", "operator": "Exists"}]


def test_the_request_is_a_workload_with_one_pod_set_per_role() -> None:
    job = make_job({"worker": {"resources": {"requests": {"cpu": "2"}}}})
    request = RequestAdmission(((Role.PS, 1, 1), (Role.WORKER, 4, 2)))
    [created] = Renderer().render([request], job, UID, Queueing("team", None, {}, ("high", 1000), NOW))
    assert isinstance(created, CreateGroup) and created.plural == "workloads"
    wl = created.manifest
    assert wl["metadata"]["name"] == "trainingjob-tj-01234"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == UID
    assert wl["spec"]["queueName"] == "team"
    assert wl["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"}
    assert wl["spec"]["priority"] == 1000
    sets = {s["name"]: s for s in wl["spec"]["podSets"]}
    assert (sets["ps"]["count"], "minCount" in sets["ps"]) == (1, False)
    assert (sets["worker"]["count"], sets["worker"]["minCount"]) == (4, 2)
    [container] = [c for c in sets["worker"]["template"]["spec"]["containers"] if c["name"] == "elasticps"]
    assert container["resources"]["requests"]["cpu"] == "2"  # what Kueue counts against the quota
    # Not queued: the admission actions render to nothing.
    assert Renderer().render([request], job, UID, None) == []


def test_release_and_finish_write_the_workload_status_kueue_expects() -> None:
    wl = workload({"QuotaReserved": "True", "Admitted": "True", "Evicted": "True"}, ADMISSION)
    job = make_job()
    queueing = Queueing("team", wl, {}, None, NOW)
    [write] = Renderer().render([ReleaseAdmission("Preempted")], job, UID, queueing)
    assert isinstance(write, ReplaceStatus) and write.plural == "workloads"
    status = write.manifest["status"]
    assert "admission" not in status and write.manifest["metadata"]["resourceVersion"] == "7"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["QuotaReserved"]["status"], conditions["QuotaReserved"]["reason"]) == ("False", "Pending")
    assert conditions["QuotaReserved"]["message"] == "Preempted"
    assert conditions["Admitted"]["status"] == "False" and conditions["Evicted"]["status"] == "True"
    assert conditions["QuotaReserved"]["lastTransitionTime"] != "2026-11-29T00:00:00Z"  # it moved
    [ended] = Renderer().render([FinishAdmission(True, "TrainingJob ns/tj succeeded.")], job, UID, queueing)
    assert isinstance(ended, ReplaceStatus)
    finished = {c["type"]: c for c in ended.manifest["status"]["conditions"]}["Finished"]
    assert (finished["status"], finished["reason"], finished["observedGeneration"]) == ("True", "Succeeded", 1)
