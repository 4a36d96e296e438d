"""The operator's reading of the API server's JSON, without a cluster: raw pods -> ``ObservedPod``,
one table row per thing ``observe_pod`` reads; then Services, NetworkPolicies and PS 0's reply."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from job_builders import merge

from elasticps.api.replicas import Role
from elasticps.operator.observing import (
    CANNOT_START_REASONS,
    observe_names,
    observe_pod,
    observe_pods,
    observe_services,
    coordinator_running,
)
from elasticps.planning.observed import ObservedPod, PodPhase
from elasticps.planning.progress import job_progress
from elasticps.proto import elasticps_pb2 as pb

JOB, UID = "tj", "job-uid"
T0, T0_TEXT = 1714564800.0, "2024-05-01T12:00:00Z"


def pod_json(name: str = "tj-worker-1", **extra: Any) -> dict[str, Any]:
    """A pod as the API server lists it: ours (labelled, owned by the job), Running and ready."""
    role, index = name.split("-")[-2:]
    body = {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": T0_TEXT,
            "labels": {"elasticps.io/job-name": JOB, "elasticps.io/replica-type": role, "elasticps.io/replica-index": index},
            "ownerReferences": [{"apiVersion": "elasticps.io/v1alpha1", "kind": "TrainingJob", "name": JOB, "uid": UID,
                                 "controller": True}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    return merge(body, extra)


def terminated(code: Any, reason: str = "", name: str = "elasticps", message: str = "") -> dict[str, Any]:
    state = {"exitCode": code, **({"reason": reason} if reason else {}), **({"message": message} if message else {})}
    return {"name": name, "state": {"terminated": state}}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"name": "elasticps", "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}


SCHEDULED = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-05-01T12:00:30Z"}
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": T0_TEXT,
                 "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}


@dataclass
class Row:
    id: str
    pod: dict[str, Any]
    expect: dict[str, Any] = field(default_factory=dict)  # ObservedPod fields that differ from a running ready pod


ROWS = [
    Row("running and ready", pod_json()),
    Row("a PS, by its name", pod_json("tj-ps-0"), {"name": "tj-ps-0", "role": Role.PS, "index": 0, "uid": "uid-tj-ps-0"}),
    Row("running, not ready yet", pod_json(status={"conditions": [{"type": "Ready", "status": "False"}]}), {"ready": False}),
    Row("no conditions at all", pod_json(status={"conditions": None}), {"ready": False}),
    Row("pending", pod_json(status={"phase": "Pending", "conditions": []}), {"phase": PodPhase.PENDING, "ready": False}),
    Row("no status yet: pending", {"metadata": pod_json()["metadata"]}, {"phase": PodPhase.PENDING, "ready": False}),
    Row("a phase Kubernetes may add later: unknown", pod_json(status={"phase": "Hibernating"}), {"phase": PodPhase.UNKNOWN}),
    Row("succeeded, exit 0", pod_json(status={"phase": "Succeeded", "conditions": [],
                                              "containerStatuses": [terminated(0, "Completed")]}),
        {"phase": PodPhase.SUCCEEDED, "exit_code": 0, "reason": "Completed", "ready": False}),
    Row("failed, the elasticps container's exit code, not a sidecar's",
        pod_json(status={"phase": "Failed", "conditions": [],
                         "containerStatuses": [terminated(2, name="sidecar"), terminated(137, "OOMKilled")]}),
        {"phase": PodPhase.FAILED, "exit_code": 137, "reason": "OOMKilled", "ready": False}),
    Row("failed with the replica's own line as its termination message",
        pod_json(status={"phase": "Failed", "conditions": [], "containerStatuses": [
            terminated(2, "Error", message="worker-0: error: model module 'm' cannot be imported\n")]}),
        {"phase": PodPhase.FAILED, "exit_code": 2, "reason": "Error", "ready": False,
         "message": "worker-0: error: model module 'm' cannot be imported"}),
    Row("failed, the log's tail as the message (FallbackToLogsOnError): its last line",
        pod_json(status={"phase": "Failed", "conditions": [], "containerStatuses": [
            terminated(2, "Error", message="usage: elasticps worker [-h]\nelasticps worker: error: bad flag\n\n")]}),
        {"phase": PodPhase.FAILED, "exit_code": 2, "reason": "Error", "ready": False,
         "message": "elasticps worker: error: bad flag"}),
    Row("failed, no exit code: evicted", pod_json(status={"phase": "Failed", "reason": "Evicted", "message": "low on memory",
                                                          "conditions": []}),
        {"phase": PodPhase.FAILED, "reason": "Evicted", "message": "low on memory", "ready": False}),
    Row("an exit code that is not a number is none", pod_json(status={"phase": "Failed", "conditions": [],
                                                                      "containerStatuses": [terminated("137")]}),
        {"phase": PodPhase.FAILED, "ready": False}),
    Row("an exit code true is not 1", pod_json(status={"phase": "Failed", "conditions": [],
                                                       "containerStatuses": [terminated(True)]}),
        {"phase": PodPhase.FAILED, "ready": False}),
    Row("unschedulable: the scheduler's message, since its condition moved",
        pod_json(status={"phase": "Pending", "conditions": [UNSCHEDULABLE]}),
        {"phase": PodPhase.PENDING, "ready": False, "unschedulable_since": T0, "reason": "Unschedulable",
         "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}),
    *[
        Row(f"waiting on {reason}: cannot start, since scheduled",
            pod_json(status={"phase": "Pending", "conditions": [SCHEDULED], "containerStatuses": [waiting(reason, "why")]}),
            {"phase": PodPhase.PENDING, "ready": False, "cannot_start_since": T0 + 30, "reason": reason, "message": "why"})
        for reason in sorted(CANNOT_START_REASONS)
    ],
    Row("cannot start, not scheduled on record: since created",
        pod_json(status={"phase": "Pending", "conditions": [], "containerStatuses": [waiting("ErrImagePull")]}),
        {"phase": PodPhase.PENDING, "ready": False, "cannot_start_since": T0, "reason": "ErrImagePull"}),
    Row("ContainerCreating is a normal wait",
        pod_json(status={"phase": "Pending", "conditions": [SCHEDULED], "containerStatuses": [waiting("ContainerCreating")]}),
        {"phase": PodPhase.PENDING, "ready": False}),
    Row("CrashLoopBackOff of a running pod is not 'cannot start'",
        pod_json(status={"containerStatuses": [waiting("CrashLoopBackOff")]})),
    Row("being deleted", pod_json(metadata={"deletionTimestamp": T0_TEXT}), {"deleted": True}),
    Row("owned by an earlier job of the same name: going", pod_json(metadata={"ownerReferences": [
        {"kind": "TrainingJob", "name": JOB, "uid": "old-uid", "controller": True}]}), {"deleted": True}),
    Row("an owner that is not our controller does not count", pod_json(metadata={"ownerReferences": [
        {"kind": "ReplicaSet", "uid": "rs", "controller": True}]})),
    Row("no owner at all: ours by name", pod_json(metadata={"ownerReferences": None})),
    Row("labels do not matter, the name does", pod_json(metadata={"labels": {"elasticps.io/job-name": JOB}})),
    Row("no uid", pod_json(metadata={"uid": None}), {"uid": ""}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_observe_pod(row: Row) -> None:
    name = row.pod["metadata"]["name"]
    role, index = name.split("-")[-2:]
    base = ObservedPod(name, Role(role), int(index), PodPhase.RUNNING, ready=True, uid=f"uid-{name}")
    expected = ObservedPod(**{**base.__dict__, **row.expect})
    assert observe_pod(row.pod, JOB, UID) == expected


@pytest.mark.parametrize(
    "name", ["other-worker-0", "tj-worker-", "tj-worker-01", "tj-worker-x", "tj-chief-0", "tj-ps-0-debug", ""]
)
def test_a_pod_that_is_not_a_replica_of_the_job_is_not_observed(name: str) -> None:
    assert observe_pod(pod_json(metadata={"name": name}), JOB, UID) is None


def test_observe_pods_keeps_the_replicas_only() -> None:
    pods = observe_pods([pod_json("tj-ps-0"), pod_json(metadata={"name": "stray"}), pod_json("tj-worker-0")], JOB, UID)
    assert [p.name for p in pods] == ["tj-ps-0", "tj-worker-0"]
    assert coordinator_running(pods) and not coordinator_running(pods[1:])


def test_an_unknown_job_uid_trusts_the_pod() -> None:
    other = pod_json(metadata={"ownerReferences": [{"kind": "TrainingJob", "uid": "old-uid", "controller": True}]})
    observed = observe_pod(other, JOB, "")
    assert observed is not None and not observed.deleted


def test_services_and_policies_by_name() -> None:
    assert [s.name for s in observe_services([{"metadata": {"name": "tj-ps-0"}}, {"metadata": {}}, {}])] == ["tj-ps-0"]
    assert observe_names([{"metadata": {"name": "tj-ps"}}, {}]) == ("tj-ps",)
    assert observe_names(None) is None  # not listable: not observed, not "none there"


def test_coordinator_reply() -> None:
    reply = pb.JobStatus(finished=True, epoch=2, records_done=250, records_total=1000, model_version=9, loss=0.5)
    reply.metrics["accuracy"] = 0.75
    reply.metrics["auc"] = float("nan")
    progress = job_progress(reply)
    assert (progress.finished, progress.epoch, progress.model_version, progress.progress) == (True, 2, 9, 0.25)
    assert progress.metrics == {"accuracy": 0.75, "loss": 0.5}
    assert job_progress(pb.JobStatus(loss=float("nan"))).metrics == {}
    assert job_progress(pb.JobStatus(records_total=0)).progress == 0.0


def test_coordinator_reply_with_shards_live_workers_and_rounds() -> None:
    reply = pb.JobStatus(model_version=121, shard_versions=[121, 120, 121], live_workers=3, grads_to_wait=2,
                         shard_problem=" PS 1 is behind \n")
    progress = job_progress(reply)
    assert progress.shard_versions == (121, 120, 121) and progress.version == 120  # the oldest shard's
    assert (progress.live_workers, progress.grads_to_wait, progress.shard_problem) == (3, 2, "PS 1 is behind")
    older = job_progress(pb.JobStatus(model_version=9))  # a coordinator that predates these fields
    assert (older.export_path, older.export_version, older.export_final) == ("", -1, False)
    assert (older.shard_versions, older.live_workers, older.grads_to_wait, older.shard_problem) == ((), 0, 0, "")
    assert older.version == 9
    assert older.export_error == ""
    assert job_progress(pb.JobStatus(export_error=" could not write \n")).export_error == "could not write"



def test_coordinator_reply_with_an_export() -> None:
    reply = pb.JobStatus(export_path="s3://b/job", export_version=40, export_final=True)
    progress = job_progress(reply)
    assert (progress.export_path, progress.export_version, progress.export_final) == ("s3://b/job", 40, True)
