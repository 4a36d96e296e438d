"""The operator's decisions, purely computed: ``plan(job, uid, observed, settings) -> actions``.

Callers: the kopf adapter (which lists the job's pods and services, asks PS 0's coordinator for
progress, calls :func:`plan`, executes the actions in order and patches status once) and, later, the
local runner. Nothing here talks to Kubernetes or the network, so every rule below is a table-driven
unit test (``tests/operator_planning``). A pass is idempotent: the same observation gives the same
actions, and a pod that exists (even one being deleted) is never created again.

Rules, in the order a pass applies them (the first that ends the job wins):
1. Finished (status.phase Succeeded or Failed): only clean up pods per ``cleanPodPolicy`` and, when
   ``ttlSecondsAfterFinished`` has passed since ``completionTime``, ``DeleteJob``.
2. First pass: condition Created, ``startTime``.
3. ``runPolicy.suspend``: delete every pod (no restart counted), condition Suspended. Unsetting it
   resumes: Suspended turns False, ``startTime`` restarts (the deadline counts from the resume), the
   pods are created again (the PS restore from their checkpoint).
4. ``activeDeadlineSeconds`` past since ``startTime``: Failed, reason DeadlineExceeded; running pods
   are stopped whatever ``cleanPodPolicy`` says (a deadline is there to stop spending).
5. The coordinator says the training is finished and no worker is still running: Succeeded,
   ``completionTime``. PS pods never exit on their own, so every pod still pending or running is
   deleted on success, whatever the policy; ``All`` also deletes the finished pods (``None`` and
   ``Running`` keep them, and their logs).
6. A pod that failed (or exited 0 under ``Always``) is judged by its role's restartPolicy
   (``replicas.should_restart``; a failure without an exit code, e.g. an eviction, counts as a
   signal): not restartable -> Failed, reason ReplicaFailed; ``status.restarts`` already at
   ``backoffLimit`` -> Failed, reason BackoffLimitExceeded; otherwise it is replaced under the same
   name in two passes: this pass deletes it, counts one restart and records it in
   ``status.replacing``; a later pass, once the old pod is gone, creates it again and drops it
   from ``replacing``. A job that fails applies ``cleanPodPolicy`` (None keeps every pod).
7. A pending pod the scheduler cannot place: condition Unschedulable at once, with the scheduler's
   message; Failed (reason Unschedulable) after ``settings.pending_timeout_s``. A pod whose container
   cannot start (image pull, bad config): condition CannotStart at once, with the kubelet's reason
   and message; Failed with that reason after the same time.
8. Scaling: pods above ``spec.<role>.replicas`` are deleted, highest index first; missing pods and
   PS Services are created, and the job's NetworkPolicy ``{job}-ps`` when it is missing (only when
   the adapter could list NetworkPolicies: ``Observed.network_policies`` None leaves them alone, so an
   operator without that RBAC rule still runs jobs). Neither touches the other pods nor the restart count.
9. Phase: Restarting from a replacement's delete until every desired pod runs again (or exited 0);
   otherwise Running once every PS and at least one worker run (an elastic job trains on what it has).

Conditions are Kubeflow's (Created, Running, Restarting, Succeeded, Suspended, Failed, plus
Unschedulable): one entry per type; ``lastTransitionTime`` changes when ``status`` does,
``lastUpdateTime`` when status, reason or message do. Running and Restarting exclude each other;
Succeeded and Failed turn both False. ``SetStatus`` carries a JSON merge patch of ``.status`` that
holds only what changed (``None`` deletes a key), and is left out when nothing did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union

from elasticps.api.replicas import Role, parse_replica_name, should_restart
from elasticps.api.modes import TrainingMode
from elasticps.api.spec import CleanPodPolicy, JobPhase, TrainingJob
from elasticps.operator.manifests import (
    TemplateError,
    network_policy_manifest,
    pod_manifest,
    role_spec,
    selector,
    service_manifest,
)
from elasticps.operator.status import StatusDraft

# ---- what the adapter observes ----------------------------------------------------------------------


class PodPhase(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class ObservedPod:
    """One pod of the job, as the adapter read it (listed fresh each pass, not from a lagging cache).

    ``exit_code``: the ``elasticps`` container's terminated exit code, when it has one.
    ``reason``/``message``: why it failed or cannot be scheduled (pod status reason, or the
    PodScheduled condition's reason and message). ``unschedulable_since``: the PodScheduled=False
    (reason Unschedulable) condition's lastTransitionTime, as epoch seconds. ``cannot_start_since``:
    when a scheduled pod's container has been waiting on an error it will not get out of by itself
    (ErrImagePull, ImagePullBackOff, CreateContainerConfigError, ...; the reason and the kubelet's
    message go in ``reason``/``message``). ``deleted``: it has a
    deletionTimestamp. ``ready``: its Ready condition is True. ``uid``: metadata.uid (optional; tells
    a replacement from the pod it replaces).
    """

    name: str
    role: Role
    index: int
    phase: PodPhase
    exit_code: int | None = None
    reason: str = ""
    unschedulable_since: float | None = None
    deleted: bool = False
    message: str = ""
    ready: bool = False
    uid: str = ""
    cannot_start_since: float | None = None


@dataclass(frozen=True)
class ObservedService:
    name: str


@dataclass(frozen=True)
class JobProgress:
    """What PS 0's coordinator said (``GetJobStatus``); ``progress`` is records done / records total."""

    finished: bool
    model_version: int
    progress: float
    epoch: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Observed:
    """One observation of a job. ``status`` is the job's ``.status`` as read (what earlier passes
    wrote); ``coordinator`` is None when PS 0 did not answer; ``now`` is epoch seconds.
    ``network_policies``: the names of the job's NetworkPolicies, or None when they could not be
    listed (no RBAC for them): the planner then neither creates nor expects one."""

    pods: tuple[ObservedPod, ...]
    services: tuple[ObservedService, ...]
    now: float
    coordinator: JobProgress | None = None
    status: Mapping[str, Any] = field(default_factory=dict)
    generation: int | None = None
    network_policies: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PlannerSettings:
    pending_timeout_s: float | None = 600.0  # an unschedulable pod fails the job after this; None: never
    command: tuple[str, ...] = ("elasticps",)
    # Who besides the job's pods may dial its PS (a NetworkPolicyPeer); None: the operator's pods,
    # by manifests.OPERATOR_LABELS, in any namespace.
    operator_peer: Mapping[str, Any] | None = field(default=None, hash=False)


# ---- what the adapter does --------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateService:
    manifest: dict[str, Any]


@dataclass(frozen=True)
class CreateNetworkPolicy:
    manifest: dict[str, Any]  # networking.k8s.io/v1; 409 AlreadyExists: an earlier pass created it


@dataclass(frozen=True)
class CreatePod:
    manifest: dict[str, Any]  # 409 AlreadyExists means an earlier pass created it: not an error

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True)
class DeletePod:
    name: str  # 404 NotFound means it is already gone: not an error
    reason: str


@dataclass(frozen=True)
class SetStatus:
    status: dict[str, Any]  # a JSON merge patch of .status (None deletes a key)


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    type: str = "Normal"  # or "Warning"


@dataclass(frozen=True)
class DeleteJob:
    pass


@dataclass(frozen=True)
class Recheck:
    after_s: float  # plan again by then: a deadline, a pending timeout or the TTL falls due


Action = Union[CreateNetworkPolicy, CreateService, CreatePod, DeletePod, SetStatus, Event, DeleteJob, Recheck]

RUNNING_PHASES = (PodPhase.PENDING, PodPhase.RUNNING, PodPhase.UNKNOWN)
UNSCHEDULABLE = "Unschedulable"  # condition types beside the phases: pods stuck Pending, by cause
CANNOT_START = "CannotStart"


def plan(job: TrainingJob, uid: str, observed: Observed, settings: PlannerSettings = PlannerSettings()) -> list[Action]:
    """The actions that move the cluster towards ``job``, given what was observed."""
    return _Pass(job, uid, observed, settings).run()


def plan_invalid(observed: Observed, message: str) -> list[Action]:
    """A job whose spec cannot be parsed (``SpecError``): Failed, reason InvalidSpec, nothing created."""
    status = StatusDraft(observed.status, observed.now)
    if status.phase is JobPhase.FAILED:
        return []
    status.fail("InvalidSpec", message)
    patch = status.patch({})
    return [Event("InvalidSpec", message, "Warning"), *([SetStatus(patch)] if patch else [])]


# ---- one pass ---------------------------------------------------------------------------------------


class _Pass:
    def __init__(self, job: TrainingJob, uid: str, observed: Observed, settings: PlannerSettings) -> None:
        self.job, self.uid, self.obs, self.settings = job, uid, observed, settings
        self.now = observed.now
        self.status = StatusDraft(observed.status, observed.now)
        self.restarts_before = self.status.restarts
        self.pods = sorted(observed.pods, key=lambda p: (p.role is Role.WORKER, p.index, p.name))
        self.by_name = {p.name: p for p in self.pods}
        self.deletes: list[DeletePod] = []
        self.creates: list[Action] = []
        self.events: list[Event] = []
        self.rechecks: list[float] = []
        self.delete_job = False

    def desired(self, role: Role) -> int:
        return role_spec(self.job, role).replicas

    def run(self) -> list[Action]:
        if self.status.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
            self._cleanup(succeeded=self.status.phase is JobPhase.SUCCEEDED)
            self._ttl()
            return self._actions()
        if not self.status.has(JobPhase.CREATED.value):
            self.status.set(JobPhase.CREATED.value, True, "TrainingJobCreated", f"TrainingJob {self._id()} is created.")
            self.status.phase = JobPhase.CREATED
            self.status.start_time = self.now
            self.events.append(Event("Created", f"TrainingJob {self._id()} is created."))
        if self.status.start_time is None:
            self.status.start_time = self.now
        if self.job.spec.run_policy.suspend:
            self._suspend()
            return self._actions()
        if self.status.is_true(JobPhase.SUSPENDED.value):
            self.status.set(JobPhase.SUSPENDED.value, False, "TrainingJobResumed", "TrainingJob is resumed.")
            self.status.phase = JobPhase.CREATED
            self.status.start_time = self.now
            self.events.append(Event("Resumed", "TrainingJob is resumed: creating its pods again."))
        if self._past_deadline() or self._succeeded() or self._failures() or self._stuck():
            return self._actions()
        self._scale_down()
        if self._create_missing():
            self._phase()
        return self._actions()

    def _id(self) -> str:
        return f"{self.job.namespace}/{self.job.name}"

    # ---- ends ----------------------------------------------------------------------------------------
    def _fail(self, reason: str, message: str, *, stop_running: bool = False) -> bool:
        # Replacements begun earlier in this pass do not happen: the pods are left to cleanPodPolicy.
        self.deletes.clear()
        self.events = [e for e in self.events if e.reason != "Restarting"]
        self.status.restarts = self.restarts_before
        self.status.fail(reason, message)
        self.events.append(Event(reason, message, "Warning"))
        self._cleanup(succeeded=False, stop_running=stop_running)
        self._ttl()
        return True

    def _past_deadline(self) -> bool:
        limit = self.job.spec.run_policy.active_deadline_seconds
        start = self.status.start_time
        if not limit or start is None:
            return False
        if self.now - start < limit:
            self.rechecks.append(start + limit - self.now)
            return False
        message = f"TrainingJob ran longer than activeDeadlineSeconds={limit}."
        return self._fail("DeadlineExceeded", message, stop_running=True)

    def _succeeded(self) -> bool:
        coordinator = self.obs.coordinator
        if coordinator is None or not coordinator.finished:
            return False
        if any(p.role is Role.WORKER and p.phase in (PodPhase.RUNNING, PodPhase.UNKNOWN) and not p.deleted for p in self.pods):
            return False  # told the training is done, they are exiting
        message = f"TrainingJob {self._id()} successfully completed."
        self.status.finish(JobPhase.SUCCEEDED, "TrainingJobSucceeded", message)
        self.events.append(Event("Succeeded", message))
        self._cleanup(succeeded=True)
        self._ttl()
        return True

    def _cleanup(self, *, succeeded: bool, stop_running: bool = False) -> None:
        policy = self.job.spec.run_policy.clean_pod_policy
        if not succeeded and self.status.condition_reason(JobPhase.FAILED.value) == "DeadlineExceeded":
            stop_running = True
        for pod in self.pods:
            if pod.deleted:
                continue
            running = pod.phase in RUNNING_PHASES
            if policy is CleanPodPolicy.ALL or (running and (succeeded or stop_running or policy is CleanPodPolicy.RUNNING)):
                why = "the job succeeded" if succeeded else "the job failed"
                self.deletes.append(DeletePod(pod.name, f"{why} (cleanPodPolicy {policy.value})"))

    def _ttl(self) -> None:
        ttl = self.job.spec.run_policy.ttl_seconds_after_finished
        done = self.status.completion_time
        if ttl < 0 or done is None:
            return
        if self.now - done >= ttl:
            self.delete_job = True
        else:
            self.rechecks.append(done + ttl - self.now)

    # ---- suspend -------------------------------------------------------------------------------------
    def _suspend(self) -> None:
        if not self.status.is_true(JobPhase.SUSPENDED.value):
            self.status.set(JobPhase.SUSPENDED.value, True, "TrainingJobSuspended", "TrainingJob is suspended.")
            self.status.set_if_present(JobPhase.RUNNING.value, False, "TrainingJobSuspended", "TrainingJob is suspended.")
            self.status.set_if_present(JobPhase.RESTARTING.value, False, "TrainingJobSuspended", "TrainingJob is suspended.")
            self.events.append(Event("Suspended", "TrainingJob is suspended: deleting its pods."))
        self.status.phase = JobPhase.SUSPENDED
        self.status.replacing.clear()
        for pod in self.pods:
            if not pod.deleted:
                self.deletes.append(DeletePod(pod.name, "the job is suspended"))

    # ---- failures ------------------------------------------------------------------------------------
    def _failures(self) -> bool:
        limit = self.job.spec.run_policy.backoff_limit
        for pod in self.pods:
            if pod.index >= self.desired(pod.role):
                continue  # being scaled down
            if pod.name in self.status.replacing:
                if self._still_replacing(pod):
                    continue
            if pod.deleted or pod.phase in RUNNING_PHASES:
                continue
            policy = role_spec(self.job, pod.role).restart_policy
            code = pod.exit_code if pod.exit_code is not None else (0 if pod.phase is PodPhase.SUCCEEDED else -1)
            how = f"exit code {code}" if pod.exit_code is not None else (pod.reason or "no exit code")
            if not should_restart(policy, code):
                if pod.phase is PodPhase.SUCCEEDED:
                    continue  # a clean exit the policy leaves be
                message = f"{pod.name} failed ({how}); restartPolicy {policy.value} does not replace it."
                return self._fail("ReplicaFailed", message)
            if self.status.restarts >= limit:
                message = f"{pod.name} failed ({how}) after {self.status.restarts} pod replacements (backoffLimit {limit})."
                return self._fail("BackoffLimitExceeded", message)
            self.status.restarts += 1
            self.status.replacing[pod.name] = pod.uid
            self.deletes.append(DeletePod(pod.name, f"replacing it: {how} (restartPolicy {policy.value})"))
            self.events.append(
                Event(
                    "Restarting",
                    f"{pod.name} exited ({how}): replacing it (restart {self.status.restarts} of at most {limit}).",
                    "Warning",
                )
            )
        return False

    def _still_replacing(self, pod: ObservedPod) -> bool:
        """Whether ``pod`` is the old pod of a replacement under way (else: the replacement itself)."""
        old_uid = self.status.replacing[pod.name]
        is_old = (pod.uid == old_uid) if (pod.uid and old_uid) else pod.phase not in RUNNING_PHASES
        if not is_old:
            del self.status.replacing[pod.name]  # created by a pass whose status patch was lost
            return False
        if not pod.deleted:
            self.deletes.append(DeletePod(pod.name, "replacing it"))  # the earlier delete did not land
        return True

    def _stuck(self) -> bool:
        """Pods stuck Pending: a condition at once, Failed after ``settings.pending_timeout_s``."""
        unschedulable = self._stuck_on(
            UNSCHEDULABLE, lambda p: p.unschedulable_since, "cannot be scheduled", "Scheduled", "Every pod is scheduled."
        )
        cannot_start = self._stuck_on(
            CANNOT_START, lambda p: p.cannot_start_since, "cannot start", "Started", "Every pod's container starts."
        )
        return unschedulable or cannot_start

    def _stuck_on(
        self, kind: str, since_of: Callable[[ObservedPod], float | None], what: str, cleared: str, cleared_message: str
    ) -> bool:
        stuck = [
            p
            for p in self.pods
            if p.phase is PodPhase.PENDING and since_of(p) is not None and not p.deleted
            and p.index < self.desired(p.role)
        ]
        if not stuck:
            if self.status.is_true(kind):
                self.status.set(kind, False, cleared, cleared_message)
            return False
        first = min(stuck, key=lambda p: (since_of(p) or 0.0, p.name))
        since = since_of(first) or 0.0
        detail = first.message or first.reason or "no node fits"
        if kind == CANNOT_START and first.reason:
            detail = f"{first.reason}: {first.message}" if first.message else first.reason
        message = f"{first.name} {what}: {detail}"
        if len(stuck) > 1:
            message += f" (and {len(stuck) - 1} more pods)"
        reason = kind if kind == UNSCHEDULABLE else (first.reason or kind)
        if not self.status.is_true(kind):
            self.events.append(Event(reason, message, "Warning"))
        self.status.set(kind, True, reason, message)
        timeout = self.settings.pending_timeout_s
        if timeout is None:
            return False
        if self.now - since >= timeout:
            return self._fail(reason, f"{message}; pending for {self.now - since:.0f} s (limit {timeout:.0f} s).")
        self.rechecks.append(since + timeout - self.now)
        return False

    # ---- scaling and creation ------------------------------------------------------------------------
    def _scale_down(self) -> None:
        excess = [p for p in self.pods if p.index >= self.desired(p.role)]
        for pod in sorted(excess, key=lambda p: (p.role is Role.PS, -p.index)):
            self.status.replacing.pop(pod.name, None)
            if not pod.deleted:
                self.deletes.append(DeletePod(pod.name, f"scaled down to {self.desired(pod.role)} {pod.role.value} replicas"))
        names = [p.name for p in excess if not p.deleted and p.role is Role.WORKER]
        if names:
            self.events.append(
                Event("ScaledDown", f"Workers scaled down to {self.desired(Role.WORKER)}: deleting {', '.join(names)}.")
            )
        for name in [n for n in self.status.replacing if n not in self.by_name]:
            parsed = parse_replica_name(self.job.name, name)
            if parsed is None or parsed[1] >= self.desired(parsed[0]):
                del self.status.replacing[name]

    def _create_missing(self) -> bool:
        services = {s.name for s in self.obs.services}
        try:
            if self.obs.network_policies is not None:
                peer = None if self.settings.operator_peer is None else dict(self.settings.operator_peer)
                policy = network_policy_manifest(self.job, self.uid, peer)
                if policy["metadata"]["name"] not in self.obs.network_policies:
                    self.creates.append(CreateNetworkPolicy(policy))
            for index in range(self.desired(Role.PS)):
                manifest = service_manifest(self.job, self.uid, index)
                if manifest["metadata"]["name"] not in services:
                    self.creates.append(CreateService(manifest))
            for role in (Role.PS, Role.WORKER):
                for index in range(self.desired(role)):
                    name = f"{self.job.name}-{role.value}-{index}"
                    if name in self.by_name:
                        continue
                    pod = pod_manifest(self.job, self.uid, role, index, command=self.settings.command)
                    self.creates.append(CreatePod(pod))
                    self.status.replacing.pop(name, None)
        except TemplateError as err:
            self.creates.clear()
            self._fail("InvalidSpec", str(err))
            return False
        return True

    def _phase(self) -> None:
        status = self.status
        if status.replacing:
            names = ", ".join(sorted(status.replacing))
            status.set(JobPhase.RESTARTING.value, True, "TrainingJobRestarting", f"Replacing {names}.")
            status.set_if_present(JobPhase.RUNNING.value, False, "TrainingJobRestarting", f"Replacing {names}.")
            status.phase = JobPhase.RESTARTING
            return
        current = [p for p in self.pods if not p.deleted and p.index < self.desired(p.role)]
        running = [p for p in current if p.phase is PodPhase.RUNNING]
        ps_running = sum(p.role is Role.PS for p in running) == self.desired(Role.PS)
        if status.phase is JobPhase.RESTARTING:
            # Recovered only once every replacement runs (a worker that exited 0 is fine).
            workers = [p for p in current if p.role is Role.WORKER and p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED)]
            if len(workers) < self.desired(Role.WORKER):
                return
        if ps_running and any(p.role is Role.WORKER for p in running):
            status.set(JobPhase.RUNNING.value, True, "TrainingJobRunning", f"TrainingJob {self._id()} is running.")
            status.set_if_present(JobPhase.RESTARTING.value, False, "TrainingJobRunning", "Every replacement is running.")
            status.phase = JobPhase.RUNNING

    # ---- status --------------------------------------------------------------------------------------
    def _actions(self) -> list[Action]:
        deletes: dict[str, DeletePod] = {}
        for delete in self.deletes:
            deletes.setdefault(delete.name, delete)  # one per pod, with the first reason
        actions: list[Action] = [*deletes.values(), *self.creates, *self.events]
        patch = self.status.patch(self._observed_fields())
        if patch:
            actions.append(SetStatus(patch))
        if self.delete_job:
            actions.append(DeleteJob())
        elif self.rechecks:
            actions.append(Recheck(max(1.0, min(self.rechecks))))
        return actions

    def _observed_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"mode": TrainingMode.of(self.job.spec.training).label}
        counts: dict[str, dict[str, int]] = {}
        ready: dict[Role, int] = {}
        for role in Role:
            pods = [p for p in self.pods if p.role is role]
            counts[role.value] = {
                "active": sum(p.phase in RUNNING_PHASES and not p.deleted for p in pods),
                "succeeded": sum(p.phase is PodPhase.SUCCEEDED for p in pods),
                "failed": sum(p.phase is PodPhase.FAILED for p in pods),
            }
            ready[role] = sum(p.ready and p.phase is PodPhase.RUNNING and not p.deleted for p in pods)
        fields["replicaStatuses"] = counts
        fields["readyWorkers"] = ready[Role.WORKER]
        fields["workers"] = f"{ready[Role.WORKER]}/{self.desired(Role.WORKER)}"
        fields["ps"] = f"{ready[Role.PS]}/{self.desired(Role.PS)}"
        fields["workerSelector"] = selector(self.job, Role.WORKER)
        if self.obs.generation is not None:
            fields["observedGeneration"] = self.obs.generation
        coordinator = self.obs.coordinator
        if coordinator is not None:
            fields["modelVersion"] = coordinator.model_version
            fields["epoch"] = coordinator.epoch
            fraction = min(max(coordinator.progress, 0.0), 1.0) if math.isfinite(coordinator.progress) else 0.0
            fields["progress"] = f"{math.floor(fraction * 100)}%"
            # JSON has no NaN (a loss before the first task): such metrics are left out.
            fields["metrics"] = {k: float(v) for k, v in coordinator.metrics.items() if math.isfinite(v)}
        return fields

