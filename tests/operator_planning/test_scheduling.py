"""The scheduling-policy seam: ``spec.scheduling.policy`` picks a policy from the registry; the
rendering decorates every pod with it and wraps a job's passes with its group objects; ``none``
changes nothing. A gang policy written here, for the tests only, shows what a real integration
(Kueue, Volcano, the coscheduling plugin) gets to say."""

from __future__ import annotations

from typing import Any

import pytest

import job_builders
from job_builders import merge

from elasticps.api.parsing import SpecError
from elasticps.api.replicas import Role
from elasticps.api.spec import SchedulingPolicy, TrainingJob
from elasticps.operator.manifests import LABEL_JOB, SCRAPE_ANNOTATIONS, group_manifest, pod_manifest
from elasticps.operator.rendering import CreateGroup, CreatePod, DeleteGroup, Renderer
from elasticps.operator.scheduling import POLICIES, GroupObject, PodDecoration, policy_for
from elasticps.operator.scheduling.none import NoPolicy
from elasticps.planning.actions import (
    Action,
    CreateIngressPolicy,
    CreateReplica,
    CreateReplicaService,
    DeleteReplica,
    Event,
    SetStatus,
)

UID = "job-uid"
GANG_API = "scheduling.example.io/v1"


def make_job(spec: dict[str, Any] | None = None) -> TrainingJob:
    return job_builders.make_job(merge({"ps": {"replicas": 2}, "worker": {"replicas": 3}}, spec or {}), name="tj", namespace="ns")


class GangPolicy:
    """A gang scheduler's policy, as Volcano's or the coscheduling plugin's would be: a scheduler
    name, the group's label and annotation on every pod, an admission gate, one PodGroup per job."""

    def pod(self, job: TrainingJob, role: Role, index: int) -> PodDecoration:
        return PodDecoration(
            scheduler_name="gang-scheduler",
            labels={"scheduling.example.io/group": job.name, LABEL_JOB: "not-ours-to-set"},
            annotations={"scheduling.example.io/task": role.value, "note": "policy"},
            scheduling_gates=("example.io/admission",),
        )

    def groups(self, job: TrainingJob) -> tuple[GroupObject, ...]:
        members = job.spec.ps.replicas + job.spec.worker.replicas
        manifest = {"apiVersion": GANG_API, "kind": "PodGroup", "metadata": {"name": job.name}, "spec": {"minMember": members}}
        return (GroupObject("podgroups", manifest),)


GANG = Renderer(policies={SchedulingPolicy.NONE: GangPolicy()})


# ---- the spec field and the registry -------------------------------------------------------------------
def test_every_policy_the_spec_names_is_registered() -> None:
    assert set(POLICIES) == set(SchedulingPolicy)


def test_the_policy_defaults_to_none_and_is_chosen_by_the_spec() -> None:
    assert make_job().spec.scheduling.policy is SchedulingPolicy.NONE
    assert make_job({"scheduling": {"policy": "none"}}).spec.scheduling.policy is SchedulingPolicy.NONE
    assert isinstance(policy_for(make_job()), NoPolicy)
    with pytest.raises(SpecError, match="spec.scheduling.policy"):
        make_job({"scheduling": {"policy": "volcano"}})  # not built in (yet): refused at the edge


# ---- none: nothing changes ------------------------------------------------------------------------------
@pytest.mark.parametrize("role,index", [(Role.PS, 1), (Role.WORKER, 2)])
def test_none_renders_the_pod_exactly_as_without_a_policy(role: Role, index: int) -> None:
    template = {"metadata": {"labels": {"team": "a"}}, "spec": {"schedulerName": "custom", "schedulingGates": [{"name": "g"}]}}
    job = make_job({"worker": {"template": template}, "ps": {"template": template}})
    [pod] = Renderer().render([CreateReplica(f"tj-{role.value}-{index}", role, index)], job, UID)
    assert isinstance(pod, CreatePod)
    assert pod.manifest == pod_manifest(job, UID, role, index)
    # The template's own scheduling fields are kept as written, nothing added beside them.
    assert pod.manifest["spec"]["schedulerName"] == "custom"
    assert pod.manifest["spec"]["schedulingGates"] == [{"name": "g"}]
    assert pod.manifest["metadata"]["annotations"] == SCRAPE_ANNOTATIONS


def test_none_adds_no_scheduling_fields_and_no_group_actions() -> None:
    job = make_job()
    actions: list[Action] = [CreateIngressPolicy("tj-ps"), CreateReplicaService("tj-ps-0", Role.PS, 0), CreateReplica("tj-ps-0", Role.PS, 0),
               SetStatus({"phase": "Succeeded"}), Event("Succeeded", "done")]  # fmt: skip
    rendered = Renderer().render(actions, job, UID)
    assert [type(a).__name__ for a in rendered] == ["CreateNetworkPolicy", "CreateService", "CreatePod", "SetStatus", "Event"]
    pod = rendered[2].manifest  # type: ignore[union-attr]
    assert "schedulerName" not in pod["spec"] and "schedulingGates" not in pod["spec"]
    assert set(pod["metadata"]["labels"]) == {LABEL_JOB, "elasticps.io/replica-type", "elasticps.io/replica-index", "elasticps.io/job-uid"}


# ---- a policy that decorates ----------------------------------------------------------------------------
def test_a_policy_decorates_every_pod_it_renders() -> None:
    template = {
        "metadata": {"annotations": {"note": "template", "kept": "yes"}},
        "spec": {"schedulerName": "custom", "schedulingGates": [{"name": "team.io/quota"}]},
    }
    job = make_job({"worker": {"template": template}})
    [_, pod] = GANG.render([CreateReplica("tj-worker-2", Role.WORKER, 2)], job, UID)  # the group, the pod
    assert isinstance(pod, CreatePod)
    meta, spec = pod.manifest["metadata"], pod.manifest["spec"]
    assert spec["schedulerName"] == "gang-scheduler"  # the policy's, over the template's
    assert spec["schedulingGates"] == [{"name": "team.io/quota"}, {"name": "example.io/admission"}]
    assert meta["labels"]["scheduling.example.io/group"] == "tj"
    assert meta["labels"][LABEL_JOB] == "tj"  # the operator's own labels still win
    assert meta["annotations"] == {**SCRAPE_ANNOTATIONS, "kept": "yes", "note": "policy", "scheduling.example.io/task": "worker"}
    # Apart from the decoration, the pod is the one manifests renders.
    assert pod.manifest == pod_manifest(job, UID, Role.WORKER, 2, decoration=GangPolicy().pod(job, Role.WORKER, 2))
    assert spec["containers"] == pod_manifest(job, UID, Role.WORKER, 2)["spec"]["containers"]


def test_a_gate_the_template_already_has_is_not_repeated() -> None:
    job = make_job({"ps": {"template": {"spec": {"schedulingGates": [{"name": "example.io/admission"}]}}}})
    pod = pod_manifest(job, UID, Role.PS, 0, decoration=PodDecoration(scheduling_gates=("example.io/admission",)))
    assert pod["spec"]["schedulingGates"] == [{"name": "example.io/admission"}]


def test_the_render_check_renders_the_decorated_pod() -> None:
    bad = make_job({"worker": {"template": {"spec": {"schedulingGates": "x"}}}})
    assert GANG.problem(bad, Role.WORKER, 0) == "spec.worker.template.spec.schedulingGates: must be a list"
    assert Renderer().problem(bad, Role.WORKER, 0) is None  # none adds no gate: the template is not read there


def test_a_pass_that_creates_pods_creates_the_group_first() -> None:
    job = make_job()
    actions: list[Action] = [DeleteReplica("tj-worker-9", "scaled down"), CreateIngressPolicy("tj-ps"),
               CreateReplica("tj-ps-0", Role.PS, 0), CreateReplica("tj-worker-0", Role.WORKER, 0)]  # fmt: skip
    rendered = GANG.render(actions, job, UID)
    assert [type(a).__name__ for a in rendered] == ["DeletePod", "CreateNetworkPolicy", "CreateGroup", "CreatePod", "CreatePod"]
    group = rendered[2]
    assert isinstance(group, CreateGroup) and group.plural == "podgroups"
    assert group.manifest == {
        "apiVersion": GANG_API,
        "kind": "PodGroup",
        "metadata": {
            "name": "tj",
            "namespace": "ns",
            "labels": {LABEL_JOB: "tj"},
            "ownerReferences": [{"apiVersion": "elasticps.io/v1alpha1", "kind": "TrainingJob", "name": "tj", "uid": UID,
                                 "controller": True, "blockOwnerDeletion": True}],  # fmt: skip
        },
        "spec": {"minMember": 5},
    }
    assert group.in_step  # already there: its spec is brought to this one
    # A pass that only deletes a replica for its own sake (a replacement, the end) leaves the group be.
    delete_only: list[Action] = [DeleteReplica("tj-worker-9", "replacing it")]
    assert GANG.render(delete_only, job, UID) == Renderer().render(delete_only, job, UID)


def test_a_pass_that_scales_the_job_down_brings_its_group_in_step_first() -> None:
    job = make_job({"worker": {"replicas": 1}})
    rendered = GANG.render([DeleteReplica("tj-worker-2", "scaled down", scaled=True),
                            DeleteReplica("tj-worker-1", "scaled down", scaled=True)], job, UID)  # fmt: skip
    assert [type(a).__name__ for a in rendered] == ["CreateGroup", "DeletePod", "DeletePod"]
    group = rendered[0]
    assert isinstance(group, CreateGroup) and group.in_step and group.manifest["spec"] == {"minMember": 2 + 1}
    # Never in the pass that ends the job: its group goes, and is not made again.
    ending = GANG.render([DeleteReplica("tj-worker-1", "scaled down", scaled=True), SetStatus({"phase": "Succeeded"})], job, UID)
    assert [type(a).__name__ for a in ending] == ["DeletePod", "SetStatus", "DeleteGroup"]


def test_a_gang_follows_the_job_scaled_down_through_the_planner() -> None:
    from elasticps.planning.observed import Observed, ObservedPod, ObservedService, PodPhase
    from elasticps.planning.plan import plan
    from elasticps.planning.settings import PlannerSettings

    job = make_job({"worker": {"replicas": 1}, "scheduling": {"policy": "coscheduling"}})
    pods = [ObservedPod(f"tj-{role.value}-{i}", role, i, PodPhase.RUNNING, ready=True)
            for role, n in ((Role.PS, 2), (Role.WORKER, 3)) for i in range(n)]  # fmt: skip
    observed = Observed(pods=tuple(pods), services=(ObservedService("tj-ps-0"), ObservedService("tj-ps-1")),
                        now=1_700_000_000.0, coordinator=None, status={"phase": "Running"})  # fmt: skip
    actions = plan(job, observed, PlannerSettings(pending_timeout_s=600.0), Renderer().problem)
    assert [(a.name, a.scaled) for a in actions if isinstance(a, DeleteReplica)] == [("tj-worker-2", True), ("tj-worker-1", True)]
    rendered = Renderer().render(actions, job, UID)
    groups = [a for a in rendered if isinstance(a, CreateGroup)]
    assert [(g.manifest["spec"], g.in_step) for g in groups] == [({"minMember": 2 + 1}, True)]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_the_pass_that_ends_the_job_deletes_its_group(phase: str) -> None:
    rendered = GANG.render([SetStatus({"phase": phase}), Event(phase, "...")], make_job(), UID)
    assert rendered == [SetStatus({"phase": phase}), DeleteGroup(GANG_API, "podgroups", "PodGroup", "tj"), Event(phase, "...")]
    for still in ({"phase": "Running"}, {"progress": "1%"}):
        assert GANG.render([SetStatus(still)], make_job(), UID) == [SetStatus(still)]


def test_group_manifest_keeps_the_policys_labels_and_adds_the_jobs() -> None:
    group = GroupObject("podgroups", {"apiVersion": GANG_API, "kind": "PodGroup", "metadata": {"name": "g", "labels": {"a": "b"}}})
    manifest = group_manifest(make_job(), UID, group)
    assert manifest["metadata"]["labels"] == {"a": "b", LABEL_JOB: "tj"}
    assert group.manifest["metadata"] == {"name": "g", "labels": {"a": "b"}}  # the policy's object is not changed


# ---- coscheduling ---------------------------------------------------------------------------------------
def test_coscheduling_makes_the_servers_and_the_fewest_workers_one_gang() -> None:
    job = make_job({"worker": {"replicas": 6, "minReplicas": 2}, "scheduling": {"policy": "coscheduling"}})
    [group, pod] = Renderer().render([CreateReplica("tj-worker-5", Role.WORKER, 5)], job, UID)
    assert isinstance(group, CreateGroup) and group.plural == "podgroups"
    assert group.manifest["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and group.manifest["kind"] == "PodGroup"
    assert group.manifest["metadata"]["name"] == "tj" and group.manifest["spec"] == {"minMember": 2 + 2}
    assert isinstance(pod, CreatePod)
    assert pod.manifest["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert pod.manifest["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "tj"
    # Without minReplicas every worker is in the gang; a decentralized job's coordinator counts as its server.
    whole = make_job({"scheduling": {"policy": "coscheduling", "schedulerName": "gang"}})
    [group, pod] = Renderer().render([CreateReplica("tj-ps-0", Role.PS, 0)], whole, UID)
    assert isinstance(group, CreateGroup) and group.manifest["spec"] == {"minMember": 2 + 3}
    assert isinstance(pod, CreatePod) and pod.manifest["spec"]["schedulerName"] == "gang"
