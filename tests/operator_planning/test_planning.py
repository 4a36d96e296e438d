"""The planner, rule by rule (one table), then whole lifecycles on a simulated cluster.

(The folder is not named tests/operator: see DESIGN.md.) Every table row is also checked for
idempotence (planning twice gives the same actions), for convergence (planning again on the status
it wrote counts nothing twice and creates no pod that exists) and for a status the CRD declares.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

import job_builders
from job_builders import merge

from elasticps.api.replicas import Role
from elasticps.api.schema import status_schema
from elasticps.api.modes import TrainingMode
from elasticps.api.spec import TrainingJob
from elasticps.operator.rendering import Renderer
from elasticps.planning.actions import (
    Action,
    CreateIngressPolicy,
    CreateReplica,
    CreateReplicaService,
    DeleteJob,
    DeleteReplica,
    Event,
    Recheck,
    SetStatus,
)
from elasticps.planning.observed import JobProgress, Observed, ObservedPod, ObservedService, PodPhase
from elasticps.planning.plan import plan as planner_plan
from elasticps.planning.plan import plan_invalid
from elasticps.planning.progress import SyncRounds, sync_rounds
from elasticps.planning.settings import PlannerSettings, ReplicaCheck
from elasticps.planning.status import apply_merge_patch, merge_patch, parse_time, rfc3339
from elasticps.planning.training import clamped_message

NOW = 1_700_000_000.0
SETTINGS = PlannerSettings(pending_timeout_s=600.0)


def plan(
    job: TrainingJob, observed: Observed, settings: PlannerSettings = SETTINGS, check: ReplicaCheck | None = Renderer().problem
) -> list[Action]:
    """The planner as the operator runs it: with its render check (the pod templates)."""
    return planner_plan(job, observed, settings, check)


def plan_local(job: TrainingJob, observed: Observed) -> list[Action]:
    """The planner as the local runner runs it: no render check (processes have no pod template)."""
    return planner_plan(job, observed, SETTINGS, None)


# ---- building observations ---------------------------------------------------------------------------


def make_job(spec: dict[str, Any] | None = None) -> TrainingJob:
    return job_builders.make_job(merge({"worker": {"replicas": 2}}, spec or {}), name="tj", namespace="ns")


def pod(role: str, index: int, phase: str = "Running", **kw: Any) -> ObservedPod:
    kw.setdefault("ready", phase == "Running")
    return ObservedPod(f"tj-{role}-{index}", Role(role), index, PodPhase(phase), **kw)


def up(ps: int = 1, workers: int = 2) -> list[ObservedPod]:
    return [pod("ps", i) for i in range(ps)] + [pod("worker", i) for i in range(workers)]


def services(ps: int = 1) -> tuple[ObservedService, ...]:
    return tuple(ObservedService(f"tj-ps-{i}") for i in range(ps))


def observe(
    pods: Sequence[ObservedPod],
    status: dict[str, Any] | None = None,
    *,
    now: float = NOW,
    coordinator: JobProgress | None = None,
    ps: int = 1,
    with_services: bool = True,
    network_policies: tuple[str, ...] | None = None,
) -> Observed:
    return Observed(
        pods=tuple(pods),
        services=services(ps) if with_services else (),
        now=now,
        coordinator=coordinator,
        status=status or {},
        network_policies=network_policies,
    )


def apply_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch (and the local runner to its status)."""
    return apply_merge_patch(target, patch)


def status_after(actions: Sequence[Action], before: dict[str, Any]) -> dict[str, Any]:
    for action in actions:
        if isinstance(action, SetStatus):
            before = apply_patch(before, action.status)
    return before


def creates(actions: Sequence[Action]) -> list[str]:
    return [a.name for a in actions if isinstance(a, CreateReplica)]


def deletes(actions: Sequence[Action]) -> list[str]:
    return [a.name for a in actions if isinstance(a, DeleteReplica)]


def created_policies(actions: Sequence[Action]) -> list[str]:
    return [a.name for a in actions if isinstance(a, CreateIngressPolicy)]


def created_services(actions: Sequence[Action]) -> list[str]:
    return [a.name for a in actions if isinstance(a, CreateReplicaService)]


def events(actions: Sequence[Action]) -> list[str]:
    return [a.reason for a in actions if isinstance(a, Event)]


def condition(status: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in status.get("conditions", []):
        if c["type"] == kind:
            return c["status"], c["reason"]
    return None


# ---- previous statuses, each made by the planner itself ----------------------------------------------

FINISHED = JobProgress(finished=True, model_version=500, progress=1.0, epoch=1, metrics={"accuracy": 0.97})
TRAINING = JobProgress(finished=False, model_version=120, progress=0.45, epoch=0, metrics={"loss": 0.3})
ROLLBACK = ("a PS shard restarted from its checkpoint: every shard and the task ledger went back from model version "
            "646 to 600; 2944 records to train again")
CREATED_CONDITION = {"type": "Created", "status": "True", "reason": "TrainingJobCreated", "message": "x"}
STALLED = JobProgress(finished=False, model_version=120, progress=0.5, health="Stalled",
                      health_message="the training loss has not fallen in 60000 records: 2.302 (latest 8 tasks) against "
                                     "2.301 (first 4)")
DIVERGED = JobProgress(finished=False, model_version=120, progress=0.5, health="Diverged",
                       health_message="the training loss became nan after 4096 records")
ROLLED_BACK = JobProgress(finished=False, model_version=480, progress=0.9659, epoch=1)
# A coordinator that gave up on the final export (its output refused it every attempt).
EXPORT_FAILED = JobProgress(finished=False, model_version=500, progress=1.0, epoch=1,
                            export_error="could not write the final model to s3://nope/m: 3 attempts failed.")
# Storage faults (issue 35): a shard's checkpoint writes failing; shards no checkpoint can bring together.
DISK_FULL = "PS 1: checkpoint of version 60 to /run/checkpoints/ps-1 failed: [Errno 28] No space left on device"
CHECKPOINT_FAILING = replace(TRAINING, checkpoint_failure=DISK_FULL)
UNRECOVERABLE = replace(TRAINING, unrecoverable=(
    "no checkpoint version that every PS shard and the task ledger can restore: PS 0 at version 221, checkpoints "
    "[220, 200, 180]; PS 1 at version 40, checkpoints [40]; the ledger saved at [220, 200, 180]"))
# A coordinator that reports its shards, its live workers and its sync rounds.
SHARDED = JobProgress(finished=False, model_version=121, progress=0.45, shard_versions=(121, 120), live_workers=2,
                      grads_to_wait=2)
SPLIT = replace(SHARDED, shard_problem="PS 1 lost its model (version 0, PS 0 at 121)", shard_versions=(121, 0))


def prior(kind: str, job: TrainingJob) -> dict[str, Any]:
    """The status a job has after the planner ran it to ``kind``: fresh, created, running,
    suspended, succeeded (100 s ago) or failed (100 s ago)."""
    if kind == "fresh":
        return {}
    t0 = NOW - 200
    live = replace(job, spec=replace(job.spec, run_policy=replace(job.spec.run_policy, suspend=False)))
    status = status_after(plan(live, observe([], now=t0), SETTINGS), {})
    if kind == "created":
        return status
    n_ps, n_workers = job.spec.ps.replicas, job.spec.worker.replicas
    status = status_after(plan(live, observe(up(n_ps, n_workers), status, now=t0, ps=n_ps), SETTINGS), status)
    if kind == "running":
        return status
    if kind == "suspended":
        suspended = replace(job, spec=replace(job.spec, run_policy=replace(job.spec.run_policy, suspend=True)))
        return status_after(plan(suspended, observe(up(n_ps, n_workers), status, now=t0, ps=n_ps), SETTINGS), status)
    if kind == "succeeded":
        done = [pod("ps", i) for i in range(n_ps)] + [pod("worker", i, "Succeeded", exit_code=0) for i in range(n_workers)]
        return status_after(plan(live, observe(done, status, now=NOW - 100, coordinator=FINISHED, ps=n_ps), SETTINGS), status)
    if kind == "failed":
        broken = up(n_ps, n_workers - 1) + [pod("worker", n_workers - 1, "Failed", exit_code=1)]
        never = replace(live, spec=replace(live.spec, worker=replace(live.spec.worker, restart_policy=type(live.spec.worker.restart_policy)("Never"))))
        return status_after(plan(never, observe(broken, status, now=NOW - 100, ps=n_ps), SETTINGS), status)
    raise ValueError(kind)


# ---- the table -----------------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    pods: list[ObservedPod]
    spec: dict[str, Any] = field(default_factory=dict)
    prior: str = "running"
    status: dict[str, Any] = field(default_factory=dict)  # merged over the prior status
    coordinator: JobProgress | None = None
    with_services: bool = True
    network_policies: tuple[str, ...] | None = ("tj-ps",)  # None: the adapter could not list them
    creates: list[str] = field(default_factory=list)
    services: list[str] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    phase: str | None = None
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    restarts: int | None = None
    events: list[str] | None = None  # None: not checked
    delete_job: bool = False
    recheck: float | None = None
    check: Callable[[list[Action], dict[str, Any]], None] | None = None

    def job(self) -> TrainingJob:
        return make_job(self.spec)

    def observed(self) -> Observed:
        job = self.job()
        status = merge(prior(self.prior, job), self.status)
        return observe(self.pods, status, coordinator=self.coordinator, ps=job.spec.ps.replicas,
                       with_services=self.with_services, network_policies=self.network_policies)


def _failed(index: int, code: int | None, **kw: Any) -> ObservedPod:
    return pod("worker", index, "Failed", exit_code=code, **kw)


W1_FAILED = [pod("ps", 0), pod("worker", 0), _failed(1, 1)]
ALL = ["tj-ps-0", "tj-worker-0", "tj-worker-1"]
RUNNING = {"Running": ("True", "TrainingJobRunning")}
RESTARTING = {"Restarting": ("True", "TrainingJobRestarting"), "Running": ("False", "TrainingJobRestarting")}
REPLACING_W1 = {"replacing": [{"name": "tj-worker-1"}], "restarts": 1, "phase": "Restarting"}


def _check_progress(actions: list[Action], status: dict[str, Any]) -> None:
    assert (status["progress"], status["modelVersion"], status["epoch"]) == ("45%", 120, 0)
    assert status["metrics"] == {"loss": 0.3}
    assert (status["mode"], status["workers"], status["ps"], status["readyWorkers"]) == ("Sync", "2/2", "1/1", 2)
    assert status["replicaStatuses"] == {"ps": {"active": 1, "succeeded": 0, "failed": 0},
                                         "worker": {"active": 2, "succeeded": 0, "failed": 0}}
    assert status["workerSelector"] == "elasticps.io/job-name=tj,elasticps.io/replica-type=worker"


def _check_failed_message(actions: list[Action], status: dict[str, Any], message: str) -> None:
    [c] = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert c["message"] == message
    assert [a.message for a in actions if isinstance(a, Event) and a.reason == "UserError"] == [message]
    assert (status["reason"], status["message"]) == ("UserError", message)  # kubectl get tj's columns


def _check_retraining(actions: list[Action], status: dict[str, Any]) -> None:
    [event] = [a for a in actions if isinstance(a, Event) and a.reason == "Retraining"]
    assert event.message == ("Work went back to the queue after the workers finished (a rollback to model version 480, "
                             "97% of the records done): starting tj-worker-0, tj-worker-1 again.")


def _check_unschedulable_message(actions: list[Action], status: dict[str, Any]) -> None:
    [c] = [c for c in status["conditions"] if c["type"] == "Unschedulable"]
    assert c["message"] == "tj-worker-1 cannot be scheduled: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def _check_cannot_start_message(actions: list[Action], status: dict[str, Any]) -> None:
    [c] = [c for c in status["conditions"] if c["type"] == "CannotStart"]
    assert c["message"] == 'tj-worker-1 cannot start: ImagePullBackOff: Back-off pulling image "elasticps:nope"'
    assert (status["phase"], status["reason"], status["message"]) == ("Running", "ImagePullBackOff", c["message"])


def _check_headline_cleared(actions: list[Action], status: dict[str, Any]) -> None:
    assert "reason" not in status and "message" not in status


def _check_completion(actions: list[Action], status: dict[str, Any]) -> None:
    assert status["completionTime"] == rfc3339(NOW)
    assert status["progress"] == "100%" and status["metrics"] == {"accuracy": 0.97}


def _check_resume(actions: list[Action], status: dict[str, Any]) -> None:
    assert status["startTime"] == rfc3339(NOW)  # the deadline counts from the resume


def _check_fresh(actions: list[Action], status: dict[str, Any]) -> None:
    assert status["startTime"] == rfc3339(NOW)
    assert status["replacing"] == [] and "completionTime" not in status
    # the ingress policy and services first, then PS replicas, then workers, each by role and index
    made = [a for a in actions if isinstance(a, (CreateIngressPolicy, CreateReplica, CreateReplicaService))]
    assert made == [CreateIngressPolicy("tj-ps"), CreateReplicaService("tj-ps-0", Role.PS, 0),
                    CreateReplica("tj-ps-0", Role.PS, 0), CreateReplica("tj-worker-0", Role.WORKER, 0),
                    CreateReplica("tj-worker-1", Role.WORKER, 1)]


def _check_shards(actions: list[Action], status: dict[str, Any]) -> None:
    assert (status["modelVersion"], status["shardVersions"]) == (120, [121, 120])  # the oldest shard's
    assert (status["liveWorkers"], status["gradsToWait"]) == (2, 2)
    assert condition(status, "GradsToWaitClamped") is None  # never clamped: never there


def _check_split_message(actions: list[Action], status: dict[str, Any]) -> None:
    [c] = [c for c in status["conditions"] if c["type"] == "ShardsConsistent"]
    assert c["message"] == "PS 1 lost its model (version 0, PS 0 at 121)"
    [event] = [a for a in actions if isinstance(a, Event)]
    assert (event.type, event.message) == ("Warning", c["message"])
    assert status["modelVersion"] == 0


def _check_no_shard_conditions(actions: list[Action], status: dict[str, Any]) -> None:
    assert condition(status, "ShardsConsistent") is None and condition(status, "GradsToWaitClamped") is None
    assert "shardVersions" not in status and status["modelVersion"] == 120


def _check_clamped_message(actions: list[Action], status: dict[str, Any]) -> None:
    [c] = [c for c in status["conditions"] if c["type"] == "GradsToWaitClamped"]
    assert c["message"] == "gradsToWait 4 is above the 2 live workers: rounds average 2 gradients"
    assert status["gradsToWait"] == 2


def _check_export_failed(actions: list[Action], status: dict[str, Any]) -> None:
    [c] = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert c["message"] == "TrainingJob ns/tj: could not write the final model to s3://nope/m: 3 attempts failed."
    [event] = [a for a in actions if isinstance(a, Event)]
    assert (event.type, event.message) == ("Warning", c["message"])


def _with_condition(kind: str, value: str, reason: str) -> dict[str, Any]:
    """A running job's status that also holds condition ``kind`` (as an earlier pass wrote it)."""
    extra = {"type": kind, "status": value, "reason": reason, "message": "earlier",
             "lastTransitionTime": rfc3339(NOW - 100), "lastUpdateTime": rfc3339(NOW - 100)}
    running = prior("running", make_job())
    return {"conditions": [*running["conditions"], extra]}


def _unschedulable(since: float) -> list[ObservedPod]:
    return [pod("ps", 0), pod("worker", 0),
            pod("worker", 1, "Pending", unschedulable_since=since, reason="Unschedulable",
                message="0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")]


NOT_FOUND = ('failed to pull and unpack image "docker.io/library/elasticps:nope": failed to resolve reference '
             '"docker.io/library/elasticps:nope": docker.io/library/elasticps:nope: not found')


def _cannot_start(since: float) -> list[ObservedPod]:
    return [pod("ps", 0), pod("worker", 0),
            pod("worker", 1, "Pending", cannot_start_since=since, reason="ImagePullBackOff",
                message='Back-off pulling image "elasticps:nope"')]


CASES = [
    # creation
    Case("fresh job: services, pods, Created", [], prior="fresh", with_services=False, network_policies=(), policies=["tj-ps"],
         services=["tj-ps-0"], creates=ALL, phase="Created",
         conditions={"Created": ("True", "TrainingJobCreated")}, restarts=0, events=["Created"], check=_check_fresh),
    Case("fresh job with 2 PS and 3 workers", [], spec={"ps": {"replicas": 2}, "worker": {"replicas": 3}},
         prior="fresh", with_services=False, services=["tj-ps-0", "tj-ps-1"],
         creates=["tj-ps-0", "tj-ps-1", "tj-worker-0", "tj-worker-1", "tj-worker-2"], phase="Created", events=["Created"]),
    Case("a missing service alone is created", up(), with_services=False, services=["tj-ps-0"], phase="Running"),
    Case("created pods pending: still Created", [pod("ps", 0, "Pending"), pod("worker", 0, "Pending"),
         pod("worker", 1, "Pending")], prior="created", phase="Created", conditions={"Created": ("True", "TrainingJobCreated")}),
    Case("all running: Running", up(), prior="created", phase="Running", conditions=RUNNING, restarts=0,
         coordinator=TRAINING, check=_check_progress),
    Case("every PS and one worker running: Running", [pod("ps", 0), pod("worker", 0), pod("worker", 1, "Pending")],
         prior="created", phase="Running", conditions=RUNNING),
    Case("PS not running yet: not Running", [pod("ps", 0, "Pending"), pod("worker", 0), pod("worker", 1)],
         prior="created", phase="Created"),
    Case("a pod being deleted is not created again", [pod("ps", 0), pod("worker", 0), pod("worker", 1, deleted=True)],
         phase="Running"),
    # failures and replacement
    Case("worker fails, OnFailure: deleted now, restart counted", W1_FAILED, deletes=["tj-worker-1"], phase="Restarting",
         conditions=RESTARTING, restarts=1, events=["Restarting"]),
    Case("PS fails, Always: replaced too", [pod("ps", 0, "Failed", exit_code=137), pod("worker", 0), pod("worker", 1)],
         deletes=["tj-ps-0"], phase="Restarting", restarts=1, events=["Restarting"]),
    Case("two failures in one pass count twice", [pod("ps", 0), _failed(0, 1), _failed(1, 3)],
         deletes=["tj-worker-0", "tj-worker-1"], restarts=2, events=["Restarting", "Restarting"]),
    Case("last replacement within backoffLimit", W1_FAILED, status={"restarts": 2}, deletes=["tj-worker-1"], restarts=3,
         events=["Restarting"]),
    Case("backoffLimit exceeded, cleanPodPolicy None keeps the pods", W1_FAILED, status={"restarts": 3},
         phase="Failed", conditions={"Failed": ("True", "BackoffLimitExceeded"), "Running": ("False", "BackoffLimitExceeded")},
         restarts=3, events=["BackoffLimitExceeded"]),
    Case("backoffLimit exceeded, cleanPodPolicy Running", W1_FAILED, spec={"runPolicy": {"cleanPodPolicy": "Running"}},
         status={"restarts": 3}, phase="Failed", deletes=["tj-ps-0", "tj-worker-0"], events=["BackoffLimitExceeded"]),
    Case("backoffLimit exceeded, cleanPodPolicy All", W1_FAILED, spec={"runPolicy": {"cleanPodPolicy": "All"}},
         status={"restarts": 3}, phase="Failed", deletes=ALL),
    Case("backoffLimit 0 fails at the first failure", W1_FAILED, spec={"runPolicy": {"backoffLimit": 0}},
         phase="Failed", restarts=0, conditions={"Failed": ("True", "BackoffLimitExceeded")}),
    Case("a failure past the limit cancels this pass's replacements", [pod("ps", 0), _failed(0, 1), _failed(1, 1)],
         status={"restarts": 2}, phase="Failed", restarts=2, deletes=[], events=["BackoffLimitExceeded"]),
    Case("ExitCode, exit 1: permanent", [pod("ps", 0), pod("worker", 0), _failed(1, 1)],
         spec={"worker": {"restartPolicy": "ExitCode"}}, phase="Failed",
         conditions={"Failed": ("True", "ReplicaFailed")}, events=["ReplicaFailed"]),
    Case("exit 2, a user's mistake, OnFailure: fails at once with the replica's line, the rest stopped",
         [pod("ps", 0), pod("worker", 0), _failed(1, 2, message="worker-1: error: model module 'm' cannot be imported")],
         phase="Failed", restarts=0, deletes=["tj-ps-0", "tj-worker-0"],
         conditions={"Failed": ("True", "UserError")}, events=["UserError"],
         check=lambda a, s: _check_failed_message(a, s, "worker-1: error: model module 'm' cannot be imported")),
    Case("exit 2 under Always: not replaced either", [pod("ps", 0), pod("worker", 0), _failed(1, 2)],
         spec={"worker": {"restartPolicy": "Always"}}, phase="Failed", restarts=0, deletes=["tj-ps-0", "tj-worker-0"],
         conditions={"Failed": ("True", "UserError")},
         check=lambda a, s: _check_failed_message(a, s, "tj-worker-1 failed (exit code 2: a mistake in its input)")),
    Case("ExitCode, exit 137: retried", [pod("ps", 0), pod("worker", 0), _failed(1, 137)],
         spec={"worker": {"restartPolicy": "ExitCode"}}, deletes=["tj-worker-1"], restarts=1, phase="Restarting"),
    Case("ExitCode, evicted without an exit code: retried", [pod("ps", 0), pod("worker", 0), _failed(1, None, reason="Evicted")],
         spec={"worker": {"restartPolicy": "ExitCode"}}, deletes=["tj-worker-1"], restarts=1),
    Case("Never: any failure fails the job", [pod("ps", 0), pod("worker", 0), _failed(1, 137)],
         spec={"worker": {"restartPolicy": "Never"}}, phase="Failed", conditions={"Failed": ("True", "ReplicaFailed")}),
    Case("Always: a worker that exited 0 early is replaced", [pod("ps", 0), pod("worker", 0), pod("worker", 1, "Succeeded", exit_code=0)],
         spec={"worker": {"restartPolicy": "Always"}}, coordinator=TRAINING, deletes=["tj-worker-1"], restarts=1),
    Case("OnFailure: a worker that exited 0 stays", [pod("ps", 0), pod("worker", 0), pod("worker", 1, "Succeeded", exit_code=0)],
         coordinator=TRAINING, phase="Running", restarts=0),
    Case("replacement: old pod still terminating, wait", [pod("ps", 0), pod("worker", 0), _failed(1, 1, deleted=True)],
         status=REPLACING_W1, phase="Restarting", restarts=1),
    Case("replacement: delete again when it did not land, count once", W1_FAILED, status=REPLACING_W1,
         deletes=["tj-worker-1"], restarts=1, events=[]),
    Case("replacement: old pod gone, same name created", [pod("ps", 0), pod("worker", 0)], status=REPLACING_W1,
         creates=["tj-worker-1"], phase="Restarting", restarts=1,
         check=lambda a, s: s["replacing"] == [] or pytest.fail(str(s["replacing"]))),
    Case("replacement running: Running again, Restarting False", up(),
         status={**REPLACING_W1, "replacing": [], "conditions": []}, phase="Running",
         check=lambda a, s: condition(s, "Running") == ("True", "TrainingJobRunning") or pytest.fail(str(s))),
    Case("replacement already created (status patch lost): kept", [pod("ps", 0), pod("worker", 0), pod("worker", 1, "Pending")],
         status=REPLACING_W1, creates=[], deletes=[], restarts=1,
         check=lambda a, s: s["replacing"] == [] or pytest.fail(str(s["replacing"]))),
    Case("replacement told apart by uid", [pod("ps", 0), pod("worker", 0), _failed(1, 1, uid="new")],
         status={**REPLACING_W1, "replacing": [{"name": "tj-worker-1", "uid": "old"}]},
         deletes=["tj-worker-1"], restarts=2, events=["Restarting"]),
    Case("every replica runs: Running and its event, once", up(), prior="created", phase="Running", events=["Running"]),
    Case("running already: no second Running event", up(), phase="Running", events=[]),
    # scaling
    Case("scale up 2 -> 4 creates worker-2 and worker-3 only", up(), spec={"worker": {"replicas": 4}},
         status={"workers": "2/2"}, creates=["tj-worker-2", "tj-worker-3"], restarts=0, phase="Running",
         events=["ScaledUp"],
         check=lambda a, s: condition(s, "Restarting") is None or pytest.fail(str(s))),
    Case("scale down 4 -> 2 deletes the highest indices first", up(workers=4), deletes=["tj-worker-3", "tj-worker-2"],
         restarts=0, phase="Running", events=["ScaledDown"]),
    Case("scale down to 0", up(workers=3), spec={"worker": {"replicas": 0}},
         deletes=["tj-worker-2", "tj-worker-1", "tj-worker-0"], restarts=0),
    Case("scale down of a failed worker spends nothing", [pod("ps", 0), pod("worker", 0), _failed(1, 1)],
         spec={"worker": {"replicas": 1}}, deletes=["tj-worker-1"], restarts=0, events=["ScaledDown"]),
    Case("scale down while a replacement waits: not recreated", [pod("ps", 0), pod("worker", 0)],
         spec={"worker": {"replicas": 1}}, status=REPLACING_W1, creates=[], restarts=1,
         check=lambda a, s: s["replacing"] == [] or pytest.fail(str(s["replacing"]))),
    # training health, as the coordinator judged the loss
    Case("the loss stalled: TrainingHealthy False, a Warning event, the job trains on", up(), coordinator=STALLED,
         phase="Running", conditions={"TrainingHealthy": ("False", "Stalled")}, events=["Stalled"],
         check=lambda a, s: (s["reason"], s["message"]) == ("Stalled", STALLED.health_message) or pytest.fail(str(s))),
    Case("still stalled: no second event", up(), coordinator=STALLED,
         status={"conditions": [CREATED_CONDITION,
                                {"type": "TrainingHealthy", "status": "False", "reason": "Stalled", "message": "x"}]},
         conditions={"TrainingHealthy": ("False", "Stalled")}, events=[]),
    Case("the loss falls again: TrainingHealthy True", up(), coordinator=TRAINING,
         status={"conditions": [CREATED_CONDITION,
                                {"type": "TrainingHealthy", "status": "False", "reason": "Stalled", "message": "x"}]},
         conditions={"TrainingHealthy": ("True", "Learning")}, events=["Learning"]),
    Case("failUnhealthy: a diverged job fails with that reason, its replicas stopped", up(),
         spec={"training": {"failUnhealthy": True}}, coordinator=DIVERGED, phase="Failed", deletes=ALL,
         conditions={"Failed": ("True", "Diverged")}, events=["Diverged"]),
    Case("a job that succeeded while stalled shows it beside the phase",
         [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0), pod("worker", 1, "Succeeded", exit_code=0)],
         coordinator=replace(FINISHED, health="Stalled", health_message="still at chance"), phase="Succeeded",
         deletes=["tj-ps-0"], events=["Stalled", "Succeeded"],
         check=lambda a, s: (s["reason"], s["message"]) == ("Stalled", "still at chance") or pytest.fail(str(s))),
    # a rollback is never silent
    Case("the coordinator rolled back: condition RolledBack and a Warning event with its words", up(),
         coordinator=replace(TRAINING, last_rollback=ROLLBACK), conditions={"RolledBack": ("True", "RolledBack")},
         events=["RolledBack"], check=lambda a, s: [e.message for e in a if isinstance(e, Event)] == [ROLLBACK]
         or pytest.fail(str(a))),
    Case("the same rollback seen again: no second event", up(), coordinator=replace(TRAINING, last_rollback=ROLLBACK),
         status={"conditions": [CREATED_CONDITION,
                                {"type": "RolledBack", "status": "True", "reason": "RolledBack", "message": ROLLBACK}]},
         events=[]),
    # work back in the queue after the workers finished (a rollback after the job's end)
    Case("rolled back after every worker exited 0: they are started again, no restart counted",
         [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0), pod("worker", 1, "Succeeded", exit_code=0)],
         coordinator=ROLLED_BACK, deletes=["tj-worker-0", "tj-worker-1"], restarts=0, events=["Retraining"],
         check=_check_retraining),
    Case("rolled back, their old pods gone: created again",
         [pod("ps", 0)], coordinator=ROLLED_BACK, creates=["tj-worker-0", "tj-worker-1"], restarts=0, events=[]),
    Case("rolled back, a worker still running takes the records: nobody is started again",
         [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0), pod("worker", 1)],
         coordinator=ROLLED_BACK, deletes=[], events=[]),
    Case("workers exited 0 but PS 0 does not answer: no guess", [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0),
         pod("worker", 1, "Succeeded", exit_code=0)], coordinator=None, deletes=[], events=[]),
    # success
    Case("training done, workers exited: Succeeded, PS deleted", [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0),
         pod("worker", 1, "Succeeded", exit_code=0)], coordinator=FINISHED, phase="Succeeded", deletes=["tj-ps-0"],
         conditions={"Succeeded": ("True", "TrainingJobSucceeded"), "Running": ("False", "TrainingJobSucceeded")},
         events=["Succeeded"], check=_check_completion),
    Case("success with cleanPodPolicy Running", [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0),
         pod("worker", 1, "Succeeded", exit_code=0)], spec={"runPolicy": {"cleanPodPolicy": "Running"}},
         coordinator=FINISHED, phase="Succeeded", deletes=["tj-ps-0"]),
    Case("success with cleanPodPolicy All", [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0),
         pod("worker", 1, "Succeeded", exit_code=0)], spec={"runPolicy": {"cleanPodPolicy": "All"}},
         coordinator=FINISHED, phase="Succeeded", deletes=ALL),
    Case("training done, a worker still exiting: wait", [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0),
         pod("worker", 1)], coordinator=FINISHED, phase="Running", deletes=[]),
    Case("training done, a late worker still pending: Succeeded, it is deleted", [pod("ps", 0),
         pod("worker", 0, "Succeeded", exit_code=0), pod("worker", 1, "Pending")], coordinator=FINISHED,
         phase="Succeeded", deletes=["tj-ps-0", "tj-worker-1"]),
    Case("training done, a failure on the way out is not replaced", [pod("ps", 0),
         pod("worker", 0, "Succeeded", exit_code=0), _failed(1, 1)], coordinator=FINISHED, phase="Succeeded",
         deletes=["tj-ps-0"], restarts=0),
    Case("coordinator silent: never Succeeded on pods alone", [pod("ps", 0), pod("worker", 0, "Succeeded", exit_code=0),
         pod("worker", 1, "Succeeded", exit_code=0)], coordinator=None, phase="Running", deletes=[]),
    # unschedulable
    Case("unschedulable: a condition at once, with the scheduler's message", _unschedulable(NOW - 30), phase="Running",
         conditions={"Unschedulable": ("True", "Unschedulable")}, events=["Unschedulable"], recheck=570.0,
         check=_check_unschedulable_message),
    Case("unschedulable past pending_timeout_s: Failed", _unschedulable(NOW - 601), phase="Failed",
         conditions={"Failed": ("True", "Unschedulable")}, deletes=[], events=["Unschedulable", "Unschedulable"]),
    Case("scheduled again: the condition turns False", up(),
         status={"conditions": [{"type": "Created", "status": "True", "reason": "TrainingJobCreated", "message": "x"},
                                {"type": "Unschedulable", "status": "True", "reason": "Unschedulable", "message": "x"}]},
         conditions={"Unschedulable": ("False", "Scheduled")}, events=[]),
    # a container that cannot start (image pull, bad config)
    Case("image pull failing: CannotStart at once, with the kubelet's reason", _cannot_start(NOW - 30), phase="Running",
         conditions={"CannotStart": ("True", "ImagePullBackOff")}, events=["ImagePullBackOff"], recheck=570.0,
         check=_check_cannot_start_message),
    Case("image pull failing past pending_timeout_s: Failed with that reason", _cannot_start(NOW - 601), phase="Failed",
         conditions={"Failed": ("True", "ImagePullBackOff")}, deletes=[], events=["ImagePullBackOff", "ImagePullBackOff"]),
    Case("image pulled after all: CannotStart turns False", up(),
         status={"conditions": [{"type": "Created", "status": "True", "reason": "TrainingJobCreated", "message": "x"},
                                {"type": "CannotStart", "status": "True", "reason": "ErrImagePull", "message": "x"}],
                 "reason": "ErrImagePull", "message": "x"},
         conditions={"CannotStart": ("False", "Started")}, events=[], check=_check_headline_cleared),
    Case("an image the registry does not have: Failed at once with the kubelet's line", [pod("ps", 0), pod("worker", 0),
         pod("worker", 1, "Pending", cannot_start_since=NOW - 5, reason="ErrImagePull", message=NOT_FOUND)],
         phase="Failed", conditions={"Failed": ("True", "ErrImagePull")}, deletes=[], events=["ErrImagePull"],
         check=lambda a, s: s["message"].startswith(f"tj-worker-1 cannot start: ErrImagePull: {NOT_FOUND} (spec.image")
         or pytest.fail(s["message"])),
    Case("an invalid image name: Failed at once", [pod("ps", 0, "Pending", cannot_start_since=NOW - 1,
         reason="InvalidImageName", message="couldn't parse image name Elasticps:x"), pod("worker", 0), pod("worker", 1)],
         phase="Failed", conditions={"Failed": ("True", "InvalidImageName")}),
    Case("a registry that timed out: waits, CannotStart", [pod("ps", 0), pod("worker", 0),
         pod("worker", 1, "Pending", cannot_start_since=NOW - 5, reason="ErrImagePull", message="dial tcp: i/o timeout")],
         phase="Running", conditions={"CannotStart": ("True", "ErrImagePull")}, recheck=595.0),
    # a job that never ran shows Pending while a pod is stuck (finding 7 of issue 34: PHASE said Created)
    Case("never ran, no pod can start: phase Pending", [
        pod(role, index, "Pending", cannot_start_since=NOW - 30, reason="ErrImagePull", message="i/o timeout")
        for role, index in (("ps", 0), ("worker", 0), ("worker", 1))], prior="created", phase="Pending", conditions={"CannotStart": ("True", "ErrImagePull")}),
    Case("never ran, the PS unschedulable: phase Pending", [pod("ps", 0, "Pending", unschedulable_since=NOW - 30),
         pod("worker", 0), pod("worker", 1)], prior="created", phase="Pending", conditions={"Unschedulable": ("True", "Unschedulable")}),
    Case("one worker of a running job cannot start: it trains on, Running", _cannot_start(NOW - 30), prior="created",
         phase="Running", conditions={"CannotStart": ("True", "ImagePullBackOff")}),
    Case("pending, then every pod runs: Running", up(), prior="created",
         status={"phase": "Pending", "conditions": [
             {"type": "Created", "status": "True", "reason": "TrainingJobCreated", "message": "x"},
             {"type": "CannotStart", "status": "True", "reason": "ErrImagePull", "message": "x"}]},
         phase="Running", conditions={"CannotStart": ("False", "Started")}, events=["Running"]),
    # deadline
    Case("activeDeadlineSeconds passed: Failed, running pods stopped", up(), spec={"runPolicy": {"activeDeadlineSeconds": 3600}},
         status={"startTime": rfc3339(NOW - 3700)}, phase="Failed", conditions={"Failed": ("True", "DeadlineExceeded")},
         deletes=ALL, events=["DeadlineExceeded"]),
    # a failed export
    Case("the coordinator gave up on an export: Failed, ExportFailed, running pods stopped", up(), coordinator=EXPORT_FAILED,
         phase="Failed", conditions={"Failed": ("True", "ExportFailed"), "Running": ("False", "ExportFailed")},
         deletes=ALL, events=["ExportFailed"], check=_check_export_failed),
    Case("failed on an export, a worker failing too: ExportFailed, no restart", [pod("ps", 0), pod("worker", 0), _failed(1, 1)],
         coordinator=EXPORT_FAILED, phase="Failed", conditions={"Failed": ("True", "ExportFailed")}, restarts=0,
         deletes=["tj-ps-0", "tj-worker-0"], events=["ExportFailed"]),
    # storage faults
    Case("the shards cannot be brought to one version: Failed, ShardsUnrecoverable with their words, pods stopped",
         up(), coordinator=UNRECOVERABLE, phase="Failed",
         conditions={"Failed": ("True", "ShardsUnrecoverable"), "Running": ("False", "ShardsUnrecoverable")},
         deletes=ALL, events=["ShardsUnrecoverable"],
         check=lambda a, s: s["message"] == f"TrainingJob ns/tj: {UNRECOVERABLE.unrecoverable}" or pytest.fail(str(s))),
    Case("a checkpoint write fails: CheckpointFailing True and a Warning event, the job trains on", up(),
         coordinator=CHECKPOINT_FAILING, phase="Running", conditions={"CheckpointFailing": ("True", "CheckpointFailing")},
         events=["CheckpointFailing"],
         check=lambda a, s: [e.message for e in a if isinstance(e, Event)] == [DISK_FULL] or pytest.fail(str(a))),
    Case("still failing: no second event", up(), coordinator=replace(TRAINING, checkpoint_failure=DISK_FULL.replace("60", "80")),
         status={"conditions": [CREATED_CONDITION, {"type": "CheckpointFailing", "status": "True",
                                                    "reason": "CheckpointFailing", "message": DISK_FULL}]},
         conditions={"CheckpointFailing": ("True", "CheckpointFailing")}, events=[]),
    Case("checkpoints written again: CheckpointFailing False", up(), coordinator=TRAINING,
         status={"conditions": [CREATED_CONDITION, {"type": "CheckpointFailing", "status": "True",
                                                    "reason": "CheckpointFailing", "message": DISK_FULL}]},
         conditions={"CheckpointFailing": ("False", "CheckpointsWritten")}, events=["CheckpointsWritten"]),
    Case("activeDeadlineSeconds not yet: a recheck when due", up(), spec={"runPolicy": {"activeDeadlineSeconds": 3600}},
         status={"startTime": rfc3339(NOW - 600)}, phase="Running", recheck=3000.0),
    # suspend
    Case("suspend: the workers deleted first, Suspended", up(), spec={"runPolicy": {"suspend": True}},
         deletes=["tj-worker-0", "tj-worker-1"], creates=[],
         phase="Suspended", conditions={"Suspended": ("True", "TrainingJobSuspended"), "Running": ("False", "TrainingJobSuspended")},
         restarts=0, events=["Suspended"]),
    Case("suspend: the PS once no worker is left", [pod("ps", 0), pod("worker", 0, deleted=True)],
         spec={"runPolicy": {"suspend": True}}, prior="suspended", deletes=[], creates=[], phase="Suspended", events=[]),
    Case("suspend: the PS deleted once the workers are gone", up(1, 0), spec={"runPolicy": {"suspend": True}},
         prior="suspended", deletes=["tj-ps-0"], creates=[], phase="Suspended", events=[]),
    Case("suspended, pods gone: nothing to do", [], spec={"runPolicy": {"suspend": True}}, prior="suspended",
         phase="Suspended", events=[]),
    Case("resume: pods created again", [], prior="suspended", creates=ALL,
         conditions={"Suspended": ("False", "TrainingJobResumed")}, events=["Resumed"], phase="Created", check=_check_resume),
    # finished jobs
    Case("finished: TTL due, DeleteJob", [], spec={"runPolicy": {"ttlSecondsAfterFinished": 60}}, prior="succeeded",
         delete_job=True, phase="Succeeded"),
    Case("finished: TTL not due, recheck", [], spec={"runPolicy": {"ttlSecondsAfterFinished": 600}}, prior="succeeded",
         recheck=500.0, phase="Succeeded"),
    Case("finished: TTL 0 on the pass that fails it", W1_FAILED, spec={"runPolicy": {"ttlSecondsAfterFinished": 0}},
         status={"restarts": 3}, phase="Failed", delete_job=True),
    Case("finished: kept forever without a TTL", [], prior="succeeded", phase="Succeeded"),
    Case("finished: a PS still there is deleted again", [pod("ps", 0)], prior="succeeded", deletes=["tj-ps-0"],
         events=[], phase="Succeeded"),
    Case("failed: nothing created again", [], prior="failed", creates=[], services=[], with_services=False,
         network_policies=(), phase="Failed"),
    # the NetworkPolicy {job}-ps
    Case("network policy missing: created", up(), network_policies=(), policies=["tj-ps"]),
    Case("network policy there: nothing", up(), policies=[]),
    Case("network policies not listable: left alone", up(), network_policies=None, policies=[]),
    Case("suspended: no network policy created", [], spec={"runPolicy": {"suspend": True}}, prior="suspended",
         network_policies=(), phase="Suspended"),
    # what the coordinator says of the shards and the sync rounds
    Case("shards agree: ShardsConsistent, modelVersion the oldest shard's", up(2, 2), spec={"ps": {"replicas": 2}},
         coordinator=SHARDED, phase="Running", events=[], conditions={"ShardsConsistent": ("True", "ShardsAgree")},
         check=_check_shards),
    Case("shards disagree: ShardsConsistent False, a Warning", up(2, 2), spec={"ps": {"replicas": 2}}, coordinator=SPLIT,
         phase="Running", events=["ShardsDisagree"], conditions={"ShardsConsistent": ("False", "ShardsDisagree")},
         check=_check_split_message),
    Case("shards still disagree: no second event", up(2, 2), spec={"ps": {"replicas": 2}}, coordinator=SPLIT,
         status=_with_condition("ShardsConsistent", "False", "ShardsDisagree"), events=[],
         conditions={"ShardsConsistent": ("False", "ShardsDisagree")}),
    Case("shards agree again: ShardsConsistent True, an event", up(2, 2), spec={"ps": {"replicas": 2}},
         coordinator=SHARDED, status=_with_condition("ShardsConsistent", "False", "ShardsDisagree"),
         events=["ShardsAgree"], conditions={"ShardsConsistent": ("True", "ShardsAgree")}),
    Case("a coordinator silent on its shards: no shard conditions", up(), coordinator=TRAINING, events=[],
         check=_check_no_shard_conditions),
    Case("PS 0 silent: shard conditions kept", up(2, 2), spec={"ps": {"replicas": 2}}, coordinator=None,
         status=_with_condition("ShardsConsistent", "False", "ShardsDisagree"), events=[],
         conditions={"ShardsConsistent": ("False", "ShardsDisagree")}),
    Case("gradsToWait above the live workers: GradsToWaitClamped", up(), spec={"training": {"gradsToWait": 4}},
         coordinator=replace(SHARDED, shard_versions=(121,)), events=["GradsToWaitClamped"],
         conditions={"GradsToWaitClamped": ("True", "FewerLiveWorkers")}, check=_check_clamped_message),
    Case("still clamped: no second event", up(), spec={"training": {"gradsToWait": 4}},
         status=_with_condition("GradsToWaitClamped", "True", "FewerLiveWorkers"),
         coordinator=replace(SHARDED, shard_versions=(121,)), events=[],
         conditions={"GradsToWaitClamped": ("True", "FewerLiveWorkers")}),
    Case("enough live workers again: GradsToWaitClamped False", up(0, 4) + [pod("ps", 0)],
         spec={"training": {"gradsToWait": 4}, "worker": {"replicas": 4}},
         status=_with_condition("GradsToWaitClamped", "True", "FewerLiveWorkers"),
         coordinator=replace(SHARDED, shard_versions=(121,), live_workers=4, grads_to_wait=4), events=[],
         conditions={"GradsToWaitClamped": ("False", "GradsToWaitMet")}),
    Case("gradsToWait 0 follows the live workers: not clamped", up(), coordinator=replace(SHARDED, live_workers=1,
         grads_to_wait=1, shard_versions=(121,)), events=[],
         check=lambda a, s: condition(s, "GradsToWaitClamped") is None or pytest.fail(str(s["conditions"]))),
    Case("async: no rounds, never clamped", up(), spec={"training": {"useAsync": True, "gradsToWait": 4}},
         coordinator=replace(SHARDED, grads_to_wait=0, shard_versions=(121,)), events=[],
         check=lambda a, s: (condition(s, "GradsToWaitClamped") is None and "gradsToWait" not in s)
         or pytest.fail(str(s))),
    # a template Kubernetes would refuse
    Case("malformed template: Failed InvalidSpec", [], spec={"worker": {"template": {"spec": {"containers": "x"}}}},
         prior="fresh", with_services=False, network_policies=(), phase="Failed", conditions={"Failed": ("True", "InvalidSpec")}),
]


def run_case(case: Case) -> tuple[list[Action], dict[str, Any]]:
    observed = case.observed()
    actions = plan(case.job(), observed, SETTINGS)
    return actions, status_after(actions, dict(observed.status))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rule(case: Case) -> None:
    actions, status = run_case(case)
    assert creates(actions) == case.creates
    assert created_services(actions) == case.services
    assert created_policies(actions) == case.policies
    assert deletes(actions) == case.deletes
    if case.events is not None:
        assert events(actions) == case.events
    if case.phase is not None:
        assert status.get("phase") == case.phase
    for kind, expected in case.conditions.items():
        assert condition(status, kind) == expected, status.get("conditions")
    if case.restarts is not None:
        assert status["restarts"] == case.restarts
    assert any(isinstance(a, DeleteJob) for a in actions) is case.delete_job
    rechecks = [a.after_s for a in actions if isinstance(a, Recheck)]
    if case.recheck is not None:
        assert rechecks == [pytest.approx(case.recheck)]
    if case.check is not None:
        case.check(actions, status)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_idempotent(case: Case) -> None:
    observed = case.observed()
    first = plan(case.job(), observed, SETTINGS)
    assert plan(case.job(), observed, SETTINGS) == first


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_planning_again_on_its_own_status_counts_nothing_twice(case: Case) -> None:
    """Same pods (the deletes and creates did not land yet), the status this pass wrote."""
    observed = case.observed()
    actions, status = run_case(case)
    again = plan(case.job(), replace(observed, status=status), SETTINGS)
    assert status_after(again, status).get("restarts") == status.get("restarts")
    assert "Restarting" not in events(again)
    assert not set(creates(again)) & {p.name for p in observed.pods}
    assert set(deletes(again)) <= set(deletes(actions)) | {p.name for p in observed.pods}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_status_is_declared_in_the_crd(case: Case) -> None:
    actions, status = run_case(case)
    for action in actions:
        if isinstance(action, SetStatus):
            json.dumps(action.status, allow_nan=False)
    assert undeclared(status_schema(), status) == []


def undeclared(schema: dict[str, Any], value: Any, where: str = "status") -> list[str]:
    """Keys the API server would prune, and values of the wrong JSON type."""
    kinds = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool}
    if not isinstance(value, kinds[schema["type"]]) or (schema["type"] in ("integer", "number") and isinstance(value, bool)):
        return [f"{where}: not {schema['type']}"]
    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{where}.{key}: required")
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            problems += [f"{where}.{key}: pruned"] if sub is None else undeclared(sub, item, f"{where}.{key}")
    if isinstance(value, list):
        for i, item in enumerate(value):
            problems += undeclared(schema["items"], item, f"{where}[{i}]")
    return problems


def test_table_covers_every_rule_of_the_issue() -> None:
    reasons = {r for c in CASES for r in c.events or []} | {v[1] for c in CASES for v in c.conditions.values()}
    for reason in ("Created", "TrainingJobRunning", "Running", "Restarting", "BackoffLimitExceeded", "ReplicaFailed",
                   "Succeeded", "Unschedulable", "DeadlineExceeded", "Suspended", "Resumed", "ScaledDown", "ScaledUp",
                   "InvalidSpec",
                   "ShardsDisagree", "ShardsAgree", "GradsToWaitClamped", "GradsToWaitMet", "ExportFailed"):
        assert reason in reasons, reason


# ---- conditions and the status patch -------------------------------------------------------------


def test_condition_times_move_only_on_change() -> None:
    job = make_job()
    created = prior("created", job)
    [c0] = created["conditions"]
    assert c0["lastTransitionTime"] == c0["lastUpdateTime"] == rfc3339(NOW - 200)
    later = plan(job, observe([pod("ps", 0, "Pending")], created, now=NOW), SETTINGS)
    after = status_after(later, created)
    assert after["conditions"][0] == c0  # unchanged condition, unchanged times
    running = status_after(plan(job, observe(up(), after, now=NOW), SETTINGS), after)
    assert condition(running, "Running") == ("True", "TrainingJobRunning")
    restarting = status_after(plan(job, observe(W1_FAILED, running, now=NOW + 50), SETTINGS), running)
    [run] = [c for c in restarting["conditions"] if c["type"] == "Running"]
    assert (run["status"], run["lastTransitionTime"]) == ("False", rfc3339(NOW + 50))


def test_a_steady_job_writes_no_status() -> None:
    job = make_job()
    running = prior("running", job)
    actions = plan(job, observe(up(), running, now=NOW), SETTINGS)
    assert actions == []


def test_the_patch_holds_only_changes_and_deletes_stale_metrics() -> None:
    job = make_job()
    running = status_after(plan(job, observe(up(), prior("running", job), coordinator=TRAINING), SETTINGS),
                           prior("running", job))
    newer = JobProgress(finished=False, model_version=130, progress=0.5, metrics={"accuracy": 0.8, "loss": float("nan")})
    [action] = plan(job, observe(up(), running, coordinator=newer), SETTINGS)
    assert isinstance(action, SetStatus)
    assert action.status == {"modelVersion": 130, "progress": "50%", "metrics": {"accuracy": 0.8, "loss": None}}


def test_the_status_shows_the_newest_export_and_keeps_it_while_the_coordinator_is_silent() -> None:
    job = make_job({"output": "s3://bucket/tj"})
    start = prior("running", job)
    periodic = JobProgress(finished=False, model_version=50, progress=0.5, export_path="s3://bucket/tj/versions/40",
                           export_version=40)
    running = status_after(plan(job, observe(up(), start, coordinator=periodic), SETTINGS), start)
    assert running["output"] == {"path": "s3://bucket/tj/versions/40", "modelVersion": 40, "final": False}
    done = JobProgress(finished=True, model_version=90, progress=1.0, export_path="s3://bucket/tj", export_version=90,
                       export_final=True)
    finished = status_after(plan(job, observe(up(), running, coordinator=done), SETTINGS), running)
    assert finished["output"] == {"path": "s3://bucket/tj", "modelVersion": 90, "final": True}
    assert plan(job, observe(up(), finished, coordinator=None), SETTINGS) == []  # PS 0 silent: kept as it was


def test_coordinator_silent_keeps_the_last_progress() -> None:
    job = make_job()
    running = status_after(plan(job, observe(up(), prior("running", job), coordinator=TRAINING), SETTINGS),
                           prior("running", job))
    assert plan(job, observe(up(), running, coordinator=None), SETTINGS) == []


def test_other_writers_status_keys_are_left_alone() -> None:
    assert merge_patch({"kopf": {"progress": {}}, "phase": "Created"}, {"phase": "Running"}) == {"phase": "Running"}


def test_a_garbled_status_does_not_crash_the_planner() -> None:
    garbled = {"phase": "Sleeping", "conditions": "x", "restarts": "many", "replacing": [3, {"uid": 1}], "startTime": "noon"}
    actions = plan(make_job(), observe(up(), garbled), SETTINGS)
    status = status_after(actions, garbled)
    assert status["restarts"] == 0 and status["phase"] == "Running"


def test_times() -> None:
    assert rfc3339(NOW) == "2023-11-14T22:13:20Z"
    assert parse_time(rfc3339(NOW)) == NOW
    assert parse_time("2023-11-14T22:13:20.5+00:00") == NOW + 0.5
    assert parse_time(None) is None and parse_time("soon") is None


# ---- shards, live workers and sync rounds ------------------------------------------------------------


@pytest.mark.parametrize(
    "training,workers,live,reported,averaged,clamped",
    [
        ({"gradsToWait": 4}, 2, 2, 2, 2, True),  # the coordinator's number
        ({"gradsToWait": 4}, 2, 2, 0, 2, True),  # not reported: the spec's, cut down to the live workers
        ({"gradsToWait": 4}, 4, 4, 4, 4, False),
        ({"gradsToWait": 2}, 4, 3, 2, 2, False),  # backup workers
        ({"gradsToWait": 4}, 4, 0, 0, 4, False),  # live workers not known: nothing to judge
        ({}, 3, 2, 0, 2, False),  # gradsToWait 0: one gradient per live worker, never clamped
        ({}, 3, 0, 0, 3, False),
    ],
)
def test_sync_rounds(training: dict[str, Any], workers: int, live: int, reported: int, averaged: int,
                     clamped: bool) -> None:
    job = make_job({"training": training, "worker": {"replicas": workers}})
    rounds = sync_rounds(job, replace(TRAINING, live_workers=live, grads_to_wait=reported))
    assert rounds is not None
    assert (rounds.requested, rounds.averaged, rounds.clamped) == (training.get("gradsToWait", 0), averaged, clamped)


def test_an_async_job_has_no_rounds() -> None:
    job = make_job({"training": {"useAsync": True, "gradsToWait": 4}})
    assert sync_rounds(job, replace(SHARDED, grads_to_wait=0, live_workers=1)) is None


def test_clamp_messages() -> None:
    assert clamped_message(SyncRounds(requested=4, averaged=2, live_workers=2)) == (
        "gradsToWait 4 is above the 2 live workers: rounds average 2 gradients"
    )
    assert clamped_message(SyncRounds(requested=3, averaged=1, live_workers=1)) == (
        "gradsToWait 3 is above the 1 live worker: rounds average 1 gradient"
    )


def test_a_steady_sharded_job_writes_no_status() -> None:
    job = make_job({"ps": {"replicas": 2}})
    first = status_after(plan(job, observe(up(2, 2), prior("running", job), coordinator=SHARDED, ps=2), SETTINGS),
                         prior("running", job))
    assert plan(job, observe(up(2, 2), first, coordinator=SHARDED, ps=2), SETTINGS) == []
    assert plan(job, observe(up(2, 2), first, coordinator=None, ps=2), SETTINGS) == []  # PS 0 silent: all kept
    newer = replace(SHARDED, shard_versions=(122, 122), model_version=122)
    [action] = plan(job, observe(up(2, 2), first, coordinator=newer, ps=2), SETTINGS)
    assert action == SetStatus({"modelVersion": 122, "shardVersions": [122, 122]})


def test_lifecycle_shards_split_and_heal_workers_leave_and_return() -> None:
    cluster = Cluster(make_job({"ps": {"replicas": 2}, "worker": {"replicas": 3}, "training": {"gradsToWait": 3}}))
    cluster.step()
    cluster.kubelet()
    cluster.coordinator = replace(SHARDED, live_workers=3, grads_to_wait=3)
    assert events(cluster.step()) == ["Running"]
    assert condition(cluster.status, "ShardsConsistent") == ("True", "ShardsAgree")
    assert condition(cluster.status, "GradsToWaitClamped") is None

    cluster.coordinator = replace(SPLIT, live_workers=1, grads_to_wait=1)  # PS 1 restarted empty, 2 workers silent
    actions = cluster.step()
    assert [(a.reason, a.type) for a in actions if isinstance(a, Event)] == [
        ("ShardsDisagree", "Warning"), ("GradsToWaitClamped", "Normal")]
    assert condition(cluster.status, "ShardsConsistent") == ("False", "ShardsDisagree")
    assert condition(cluster.status, "GradsToWaitClamped") == ("True", "FewerLiveWorkers")
    assert (cluster.status["modelVersion"], cluster.status["liveWorkers"], cluster.status["gradsToWait"]) == (0, 1, 1)
    assert events(cluster.step()) == []  # nothing new: no new events
    assert cluster.status["phase"] == "Running"  # reported, never a failure

    cluster.coordinator = replace(SHARDED, live_workers=3, grads_to_wait=3)
    assert events(cluster.step()) == ["ShardsAgree"]
    assert condition(cluster.status, "ShardsConsistent") == ("True", "ShardsAgree")
    assert condition(cluster.status, "GradsToWaitClamped") == ("False", "GradsToWaitMet")
    assert (cluster.status["modelVersion"], cluster.status["gradsToWait"]) == (120, 3)


def test_a_job_turned_async_drops_gradsToWait() -> None:
    job = make_job()
    sync = status_after(plan(job, observe(up(), prior("running", job), coordinator=SHARDED), SETTINGS),
                        prior("running", job))
    assert sync["gradsToWait"] == 2
    async_job = make_job({"training": {"useAsync": True}})
    async_status = status_after(plan(async_job, observe(up(), sync, coordinator=SHARDED), SETTINGS), sync)
    assert "gradsToWait" not in async_status and async_status["mode"] == "Async"


@pytest.mark.parametrize(
    "training,mode",
    [({}, "Sync"), ({"useAsync": True}, "Async"), ({"useAsync": True, "lrStalenessModulation": True}, "Async+StalenessLR"),
     ({"useAsync": True, "getModelFrequency": 4}, "Async+SSP4"), ({"localSGDSteps": 4}, "LocalSGD4"),
     ({"localSGDSteps": 8, "adaptiveLocalSGD": True}, "LocalSGDAdaptive")],
)
def test_training_mode(training: dict[str, Any], mode: str) -> None:
    job = make_job({"training": training})
    assert TrainingMode.of(job.spec.training).label == mode
    status = status_after(plan(job, observe(up(), prior("running", job), coordinator=SHARDED), SETTINGS),
                          prior("running", job))
    assert status["mode"] == mode  # the MODE column of `kubectl get trainingjobs`


def test_pending_timeout_can_be_disabled() -> None:
    job = make_job()
    actions = plan(job, observe(_unschedulable(NOW - 10_000), prior("running", job)), PlannerSettings(pending_timeout_s=None))
    assert status_after(actions, prior("running", job))["phase"] == "Running"


def test_invalid_spec() -> None:
    actions = plan_invalid(observe([]), "spec.training.numEpochs: must be >= 1, got 0")
    status = status_after(actions, {})
    assert status["phase"] == "Failed"
    assert condition(status, "Failed") == ("True", "InvalidSpec")
    assert events(actions) == ["InvalidSpec"]
    assert plan_invalid(observe([], status), "again") == []


# ---- whole lifecycles on a simulated cluster ---------------------------------------------------------


class Cluster:
    """Plays the API server and the kubelet: executes actions, moves pods through phases."""

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        self.pods: dict[str, ObservedPod] = {}
        self.services: set[str] = set()
        self.status: dict[str, Any] = {}
        self.now = NOW
        self.coordinator: JobProgress | None = None
        self.log: list[Action] = []
        self.deleted_job = False
        self.uids = 0

    def step(self, seconds: float = 10.0) -> list[Action]:
        self.now += seconds
        observed = Observed(tuple(self.pods.values()), tuple(ObservedService(s) for s in sorted(self.services)),
                            self.now, self.coordinator, self.status)
        actions = plan(self.job, observed, SETTINGS)
        for action in actions:
            if isinstance(action, CreateReplica):
                assert action.name not in self.pods, f"duplicate create of {action.name}"
                self.uids += 1
                self.pods[action.name] = pod(action.role.value, action.index, "Pending", uid=f"uid-{self.uids}")
            elif isinstance(action, CreateReplicaService):
                self.services.add(action.name)
            elif isinstance(action, DeleteReplica):
                if action.name in self.pods:  # graceful deletion: gone on the next step
                    self.pods[action.name] = replace(self.pods[action.name], deleted=True)
            elif isinstance(action, SetStatus):
                self.status = apply_patch(self.status, action.status)
            elif isinstance(action, DeleteJob):
                self.deleted_job = True
        self.log += actions
        return actions

    def kubelet(self) -> None:
        """Finishes deletions and starts pending pods."""
        for name, p in list(self.pods.items()):
            if p.deleted:
                del self.pods[name]
            elif p.phase is PodPhase.PENDING:
                self.pods[name] = replace(p, phase=PodPhase.RUNNING, ready=True)

    def set_pod(self, name: str, phase: str, **kw: Any) -> None:
        self.pods[name] = replace(self.pods[name], phase=PodPhase(phase), ready=False, **kw)


def test_lifecycle_failure_replacement_scaling_success_ttl() -> None:
    job = make_job({"runPolicy": {"ttlSecondsAfterFinished": 30, "backoffLimit": 2}})
    cluster = Cluster(job)
    cluster.step()
    assert sorted(cluster.pods) == ALL and cluster.status["phase"] == "Created"
    cluster.kubelet()
    cluster.step()
    assert cluster.status["phase"] == "Running"

    # worker-1 is killed: deleted, then the same name comes back once the old pod is gone
    cluster.set_pod("tj-worker-1", "Failed", exit_code=137)
    old_uid = cluster.pods["tj-worker-1"].uid
    cluster.step()
    cluster.step()  # the delete is still in flight: nothing more
    assert cluster.status["restarts"] == 1 and cluster.status["phase"] == "Restarting"
    cluster.kubelet()
    assert "tj-worker-1" not in cluster.pods
    cluster.step()
    assert cluster.pods["tj-worker-1"].uid != old_uid
    cluster.kubelet()
    cluster.step()
    assert cluster.status["phase"] == "Running" and cluster.status["restarts"] == 1

    # scale up and down: no restart spent, the others untouched
    before = {n: p.uid for n, p in cluster.pods.items()}
    cluster.job = job = make_job({"runPolicy": {"ttlSecondsAfterFinished": 30, "backoffLimit": 2}, "worker": {"replicas": 4}})
    cluster.step()
    cluster.kubelet()
    cluster.step()
    assert sorted(cluster.pods) == sorted(ALL + ["tj-worker-2", "tj-worker-3"])
    assert all(cluster.pods[n].uid == u for n, u in before.items())
    cluster.job = job = make_job({"runPolicy": {"ttlSecondsAfterFinished": 30, "backoffLimit": 2}, "worker": {"replicas": 3}})
    cluster.step()
    cluster.kubelet()
    cluster.step()
    assert sorted(cluster.pods) == sorted(ALL + ["tj-worker-2"])
    assert cluster.status["restarts"] == 1 and cluster.status["workers"] == "3/3"
    assert cluster.status["replicaStatuses"]["worker"]["active"] == 3

    # training done: workers exit 0, the job succeeds, the PS is deleted, then the job after its TTL
    cluster.coordinator = FINISHED
    for i in range(3):
        cluster.set_pod(f"tj-worker-{i}", "Succeeded", exit_code=0)
    cluster.step()
    assert cluster.status["phase"] == "Succeeded"
    cluster.kubelet()
    assert sorted(cluster.pods) == ["tj-worker-0", "tj-worker-1", "tj-worker-2"]  # None keeps them for their logs
    cluster.coordinator = None  # PS 0 is gone
    cluster.step(10)
    assert not cluster.deleted_job
    assert cluster.status["progress"] == "100%"
    cluster.step(25)
    assert cluster.deleted_job
    assert sum(isinstance(a, Event) and a.reason == "Succeeded" for a in cluster.log) == 1


def test_lifecycle_backoff_limit() -> None:
    cluster = Cluster(make_job({"runPolicy": {"backoffLimit": 1, "cleanPodPolicy": "Running"}}))
    cluster.step()
    cluster.kubelet()
    cluster.step()
    for attempt in range(2):
        cluster.set_pod("tj-worker-0", "Failed", exit_code=1)
        cluster.step()
        cluster.kubelet()
        cluster.step()
        cluster.kubelet()
        cluster.step()
    assert cluster.status["phase"] == "Failed"
    assert condition(cluster.status, "Failed") == ("True", "BackoffLimitExceeded")
    assert cluster.status["restarts"] == 1
    cluster.kubelet()
    assert sorted(cluster.pods) == ["tj-worker-0"]  # the failed pod stays, the running ones were stopped


def test_lifecycle_suspend_and_resume() -> None:
    cluster = Cluster(make_job({"runPolicy": {"activeDeadlineSeconds": 100}}))
    cluster.step()
    cluster.kubelet()
    cluster.step()
    cluster.job = make_job({"runPolicy": {"activeDeadlineSeconds": 100, "suspend": True}})
    cluster.step()
    cluster.kubelet()
    assert sorted(cluster.pods) == ["tj-ps-0"] and cluster.status["phase"] == "Suspended"  # the workers first
    cluster.step()
    cluster.kubelet()
    assert cluster.pods == {} and cluster.status["phase"] == "Suspended"
    cluster.step(500)  # suspended longer than the deadline: no failure
    assert cluster.status["phase"] == "Suspended"
    cluster.job = make_job({"runPolicy": {"activeDeadlineSeconds": 100}})
    cluster.step()
    cluster.kubelet()
    cluster.step()
    assert cluster.status["phase"] == "Running" and sorted(cluster.pods) == ALL
    assert cluster.status["restarts"] == 0
    cluster.step(95)
    assert cluster.status["phase"] == "Failed"
    assert condition(cluster.status, "Failed") == ("True", "DeadlineExceeded")


# ---- strategies: nothing assumes a PS ----------------------------------------------------------------


def decentralized() -> TrainingJob:
    """A job of the strategy without PS: a coordinator of its own and workers."""
    return make_job({"strategy": "decentralized"})


def test_the_operator_gives_a_decentralized_job_a_service_per_worker_and_its_coordinator() -> None:
    actions = plan(decentralized(), observe([], with_services=False, network_policies=()))
    assert creates(actions) == ["tj-coordinator-0", "tj-worker-0", "tj-worker-1"]
    assert created_services(actions) == ["tj-coordinator-0", "tj-worker-0", "tj-worker-1"]
    assert created_policies(actions) == []


def test_a_decentralized_job_creates_its_coordinator_then_workers_and_no_ps() -> None:
    job = decentralized()
    actions = plan_local(job, observe([], with_services=False, network_policies=()))
    assert creates(actions) == ["tj-coordinator-0", "tj-worker-0", "tj-worker-1"]
    assert created_policies(actions) == []


def test_a_decentralized_job_runs_with_its_coordinator_and_a_worker() -> None:
    job = decentralized()
    status = status_after(plan_local(job, observe([], with_services=False)), {})
    workers = [pod("worker", 0), pod("worker", 1, "Pending")]
    waiting = status_after(plan_local(job, observe(workers, status, with_services=False, network_policies=())), status)
    assert waiting["phase"] == "Created"  # no coordinator yet
    pods = [pod("coordinator", 0), *workers]
    after = status_after(plan_local(job, observe(pods, status, with_services=False, network_policies=())), status)
    assert after["phase"] == "Running" and after["ps"] == "0/0" and after["workers"] == "1/2"
    assert after["mode"] == "Decentralized"
    assert after["replicaStatuses"]["coordinator"] == {"active": 1, "succeeded": 0, "failed": 0}


def test_a_decentralized_job_reports_iterations_and_nothing_of_shards_or_rounds() -> None:
    job = decentralized()
    pods = [pod("coordinator", 0), pod("worker", 0), pod("worker", 1)]
    running = status_after(plan_local(job, observe(pods, with_services=False)), {})
    hop = JobProgress(finished=False, model_version=40, progress=0.3, shard_versions=(40,), live_workers=2,
                      iterations=(37, 40))
    after = status_after(plan_local(job, observe(pods, running, coordinator=hop, with_services=False)), running)
    assert after["iterations"] == "37-40" and after["liveWorkers"] == 2
    assert "gradsToWait" not in after and "shardVersions" not in after
    assert condition(after, "ShardsConsistent") is None and condition(after, "GradsToWaitClamped") is None
    # The same progress from a sync PS job's coordinator: its shard and its rounds are reported.
    ps_job = make_job()
    ps_pods = [pod("ps", 0), pod("worker", 0), pod("worker", 1)]
    ps_running = status_after(plan(ps_job, observe(ps_pods)), {})
    ps_after = status_after(plan(ps_job, observe(ps_pods, ps_running, coordinator=hop)), ps_running)
    assert ps_after["gradsToWait"] == 2 and ps_after["shardVersions"] == [40] and "iterations" not in ps_after
    assert condition(ps_after, "ShardsConsistent") == ("True", "ShardsAgree")


def test_a_decentralized_job_deletes_a_stray_ps_and_never_replaces_it() -> None:
    job = decentralized()
    mine = [pod("coordinator", 0), pod("worker", 0), pod("worker", 1)]
    running = status_after(plan_local(job, observe(mine, with_services=False)), {})
    actions = plan_local(job, observe([pod("ps", 0, "Failed", exit_code=1), *mine], running))
    assert deletes(actions) == ["tj-ps-0"] and creates(actions) == []
    assert status_after(actions, running)["restarts"] == 0


def test_a_ps_job_has_no_coordinator_of_its_own() -> None:
    actions = plan(make_job(), observe([], with_services=False, network_policies=()))
    assert "tj-coordinator-0" not in creates(actions)


def test_the_ps_strategy_needs_every_ps_for_running() -> None:
    job = make_job({"ps": {"replicas": 2}})
    created = prior("created", job)
    half = [pod("ps", 0), pod("ps", 1, "Pending"), pod("worker", 0), pod("worker", 1)]
    assert status_after(plan(job, observe(half, created, ps=2)), created)["phase"] == "Created"


def test_an_executor_without_services_is_never_asked_for_one() -> None:
    """The local runner observes no Services (None): PS replicas but no Service or policy actions."""
    observed = Observed(pods=(), services=None, now=NOW, network_policies=None)
    actions = plan(make_job(), observed)
    assert creates(actions) == ALL and created_services(actions) == [] and created_policies(actions) == []


def test_without_a_render_check_templates_are_not_the_planners_business() -> None:
    """The local runner gives no render check: a pod template means nothing to processes."""
    job = make_job({"worker": {"template": {"spec": {"containers": "x"}}}})
    observed = observe([], with_services=False, network_policies=())
    assert creates(plan(job, observed, check=None)) == ALL
    refused = plan(job, observed)  # the operator's check: Failed, InvalidSpec, nothing created
    assert creates(refused) == [] and events(refused) == ["Created", "InvalidSpec"]


def test_the_render_check_is_asked_only_for_replicas_to_create() -> None:
    asked: list[tuple[str, int]] = []

    def check(job: TrainingJob, role: Role, index: int) -> str | None:
        asked.append((role.value, index))
        return None

    plan(make_job(), observe([pod("ps", 0), pod("worker", 0)], prior("running", make_job())), check=check)
    assert asked == [("worker", 1)]
