"""The operator's rendering of the planner's actions: replicas to Pods, addresses to Services, the
ingress policy to a NetworkPolicy, all owned by the job; and the render check the planner asks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import job_builders
from job_builders import merge

from elasticps.api.replicas import Role
from elasticps.api.spec import Strategy, TrainingJob
from elasticps.operator.manifests import pod_manifest
from elasticps.operator.rendering import CreateNetworkPolicy, CreatePod, CreateService, DeletePod, Renderer
from elasticps.planning.actions import (
    CreateIngressPolicy,
    CreateReplica,
    CreateReplicaService,
    DeleteJob,
    DeleteReplica,
    Event,
    Recheck,
    SetStatus,
)

UID = "job-uid"


def make_job(spec: dict[str, Any] | None = None) -> TrainingJob:
    return job_builders.make_job(merge({"worker": {"replicas": 2}}, spec or {}), name="tj", namespace="ns")


def test_each_action_renders_to_its_kind_in_the_same_order() -> None:
    job = make_job()
    actions = [
        DeleteReplica("tj-worker-1", "replacing it"), CreateIngressPolicy("tj-ps"),
        CreateReplicaService("tj-ps-0", Role.PS, 0), CreateReplica("tj-ps-0", Role.PS, 0),
        CreateReplica("tj-worker-1", Role.WORKER, 1), Event("Restarting", "..."), SetStatus({"phase": "Running"}),
        DeleteJob(), Recheck(5.0),
    ]  # fmt: skip
    rendered = Renderer().render(actions, job, UID)
    assert [type(a).__name__ for a in rendered] == [
        "DeletePod", "CreateNetworkPolicy", "CreateService", "CreatePod", "CreatePod", "Event", "SetStatus",
        "DeleteJob", "Recheck",
    ]  # fmt: skip
    assert rendered[0] == DeletePod("tj-worker-1", "replacing it")
    assert rendered[5:] == actions[5:]  # passed through as they are


def test_a_replica_becomes_its_pod_owned_by_the_job() -> None:
    job = make_job()
    [pod] = Renderer(command=("python", "-m", "elasticps")).render([CreateReplica("tj-worker-1", Role.WORKER, 1)], job, UID)
    assert isinstance(pod, CreatePod) and pod.name == "tj-worker-1"
    assert pod.manifest == pod_manifest(job, UID, Role.WORKER, 1, command=("python", "-m", "elasticps"))
    assert pod.manifest["metadata"]["ownerReferences"][0]["uid"] == UID
    assert pod.manifest["spec"]["containers"][0]["command"] == ["python", "-m", "elasticps"]


def test_a_replica_service_is_the_headless_service_of_that_ps() -> None:
    [service] = Renderer().render([CreateReplicaService("tj-ps-0", Role.PS, 0)], make_job(), UID)
    assert isinstance(service, CreateService)
    assert service.manifest["metadata"]["name"] == "tj-ps-0"
    assert service.manifest["metadata"]["ownerReferences"][0]["uid"] == UID
    assert service.manifest["spec"]["clusterIP"] == "None"


def test_the_ingress_policy_guards_the_ps_pods() -> None:
    [policy] = Renderer().render([CreateIngressPolicy("tj-ps")], make_job(), UID)
    assert isinstance(policy, CreateNetworkPolicy)
    manifest = policy.manifest
    assert manifest["metadata"]["name"] == "tj-ps" and manifest["metadata"]["ownerReferences"][0]["uid"] == UID
    assert manifest["spec"]["podSelector"] == {"matchLabels": {"elasticps.io/job-name": "tj", "elasticps.io/replica-type": "ps"}}
    assert manifest["spec"]["ingress"][0]["from"][0] == {"podSelector": {"matchLabels": {"elasticps.io/job-name": "tj"}}}


def test_the_operator_peer_of_the_network_policy_is_a_setting() -> None:
    peer = {"ipBlock": {"cidr": "10.0.0.0/8"}}
    [policy] = Renderer(operator_peer=peer).render([CreateIngressPolicy("tj-ps")], make_job(), UID)
    assert isinstance(policy, CreateNetworkPolicy)
    assert policy.manifest["spec"]["ingress"][0]["from"][1] == peer


def test_the_render_check_names_the_template_field_it_cannot_render() -> None:
    renderer = Renderer()
    bad = make_job({"worker": {"template": {"spec": {"containers": "x"}}}})
    assert renderer.problem(bad, Role.WORKER, 0) == "spec.worker.template.spec.containers: must be a list of containers"
    assert renderer.problem(bad, Role.PS, 0) is None  # the PS template is fine
    assert renderer.problem(make_job(), Role.WORKER, 0) is None


def test_without_ps_there_is_no_ps_service_or_policy_to_render() -> None:
    job = make_job()
    no_ps = replace(job, spec=replace(job.spec, strategy=Strategy.DECENTRALIZED))
    actions = [CreateIngressPolicy("tj-ps"), CreateReplicaService("tj-ps-0", Role.PS, 0),
               CreateReplicaService("tj-worker-1", Role.WORKER, 1)]
    [service] = Renderer().render(actions, no_ps, UID)
    assert service.manifest["metadata"]["name"] == "tj-worker-1"  # type: ignore[attr-defined]
    assert service.manifest["spec"]["ports"][0]["port"] == 2225  # type: ignore[attr-defined]
    assert Renderer().problem(no_ps, Role.WORKER, 0) is None
