"""The planner's actions rendered for the API server: replicas become Pods, their addresses
headless Services, the ingress policy a NetworkPolicy; the job's scheduling policy decorates the
pods and adds its group objects.

Callers: ``reconciling``, between ``planning.plan`` and ``executing.execute``; and the planner
itself, through :meth:`Renderer.problem`, its render check: a role's pod template of the wrong
shape fails the job (InvalidSpec) before anything is created, as the planner's rules say, instead
of surfacing here. Actions the API needs no rendering for (Events, the status patch, DeleteJob,
Recheck) pass through unchanged.

A rendered create carries the whole manifest; 409 AlreadyExists on it means an earlier pass created
it, and 404 on a ``DeletePod`` that it is already gone (``executing``). Services and the
NetworkPolicy exist only for jobs whose strategy has PS replicas (the planner asks for none
otherwise).

The scheduling policy of the job (``spec.scheduling.policy``, looked up in ``Renderer.policies``)
is the renderer's, not the planner's: every pod gets its decoration; a pass that creates replicas
first creates the policy's group objects (``CreateGroup``: they must exist before a gang scheduler
sees the pods), and so does a pass that scales the job down; such a group create is ``in_step``: on
409 (an earlier pass made it) its spec is patched to the job's, so a gang follows the job's size
(two requests a pass that changes it); a pass whose status patch ends the job
(Succeeded or Failed) deletes them (``DeleteGroup``: a finished job holds no place in the
scheduler's queue). Deleting the job deletes them too, by their ownerReference. Policy ``none``
has no group objects and decorates nothing: its passes render exactly as without a policy.

A queued job (Kueue, ``Queueing``): ``RequestAdmission`` becomes its Workload (a ``CreateGroup``,
created first like a policy's group objects), ``ReleaseAdmission`` and ``FinishAdmission`` writes
of the Workload's status (``ReplaceStatus``), and every pod gets the placement of the flavors its
role was admitted on (``operator.kueue``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from elasticps.api.replicas import Role
from elasticps.api.spec import JobPhase, SchedulingPolicy, TrainingJob
from elasticps.operator import kueue
from elasticps.operator.manifests import (
    DEFAULT_COMMAND,
    DEFAULT_PULL_POLICY,
    TemplateError,
    group_manifest,
    member,
    network_policy_manifest,
    pod_manifest,
    service_manifest,
)
from elasticps.operator.scheduling import POLICIES, GroupObject, PodDecoration, Policy, policy_for
from elasticps.planning.actions import (
    Action,
    CreateIngressPolicy,
    CreateReplica,
    CreateReplicaService,
    DeleteJob,
    DeleteReplica,
    Event,
    FinishAdmission,
    Recheck,
    ReleaseAdmission,
    RequestAdmission,
    SetStatus,
)


@dataclass(frozen=True)
class CreateNetworkPolicy:
    manifest: dict[str, Any]  # networking.k8s.io/v1


@dataclass(frozen=True)
class CreateService:
    manifest: dict[str, Any]


@dataclass(frozen=True)
class CreatePod:
    manifest: dict[str, Any]
    member: str = ""  # the replica's name in the job's identity: its token must be in the job's Secret first

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True)
class DeletePod:
    name: str
    reason: str


@dataclass(frozen=True)
class CreateGroup:
    """A scheduling policy's job-level object (a PodGroup ...), created before the job's pods."""

    plural: str  # its resource in the API, e.g. podgroups (the group and version are the manifest's)
    manifest: dict[str, Any]
    in_step: bool = False  # already there (409): its spec is patched to this one's (a policy's group)


@dataclass(frozen=True)
class DeleteGroup:
    """That object, deleted once the job finished."""

    api_version: str
    plural: str
    kind: str
    name: str


@dataclass(frozen=True)
class ReplaceStatus:
    """Write ``manifest``'s status (an object the job does not own alone: its Kueue Workload),
    guarded by the resourceVersion it was read at; ``what`` says what the write means."""

    plural: str
    manifest: dict[str, Any]
    what: str


@dataclass(frozen=True)
class Queueing:
    """What the reconciler read of a queued job, for rendering: its LocalQueue, its Workload (None:
    not created yet), the placement of each admitted role, its WorkloadPriorityClass (name, value)
    and the pass's time."""

    queue: str
    workload: Mapping[str, Any] | None = field(default=None, hash=False)
    placement: Mapping[Role, PodDecoration] = field(default_factory=dict, hash=False)
    priority: tuple[str, int] | None = None
    now: float = 0.0


ClusterAction = Union[
    CreateGroup, CreateNetworkPolicy, CreateService, CreatePod, DeleteGroup, DeletePod, SetStatus, Event, DeleteJob,
    Recheck, ReplaceStatus,
]  # fmt: skip
FINISHED = (JobPhase.SUCCEEDED.value, JobPhase.FAILED.value)


@dataclass(frozen=True)
class Renderer:
    """How this operator renders replicas. ``command``: the containers' entrypoint.
    ``pull_policy``: the containers' imagePullPolicy where the job names none.
    ``operator_peer``: who besides the job's pods may dial its PS (a NetworkPolicyPeer); None: the
    operator's pods, by ``manifests.OPERATOR_LABELS``, in any namespace. ``policies``: the
    scheduling policy of each ``spec.scheduling.policy`` value (the built-in ones by default)."""

    command: tuple[str, ...] = DEFAULT_COMMAND
    pull_policy: str = DEFAULT_PULL_POLICY
    operator_peer: Mapping[str, Any] | None = field(default=None, hash=False)
    policies: Mapping[SchedulingPolicy, Policy] = field(default_factory=lambda: POLICIES, hash=False)

    def problem(self, job: TrainingJob, role: Role, index: int) -> str | None:
        """The planner's render check: why this replica's pod cannot be rendered, or None."""
        try:
            self._pod(job, "", role, index)
        except TemplateError as err:
            return str(err)
        return None

    def render(
        self, actions: Sequence[Action], job: TrainingJob, uid: str, queueing: Queueing | None = None
    ) -> list[ClusterAction]:
        """``actions`` for the API server, in the same order; ``uid`` owns what is created. A PS
        Service or the ingress policy of a job whose strategy has no PS renders to nothing; the
        admission actions of a job that is not queued (``queueing`` None) render to nothing.

        Raises :class:`~elasticps.operator.manifests.TemplateError` only for a replica the render
        check passed, which would be a bug (the check renders the same pod).
        """
        rendered = [r for r in (self._render(action, job, uid, queueing) for action in actions) if r is not None]
        groups = policy_for(job, self.policies).groups(job)
        scaled = any(isinstance(a, DeleteReplica) and a.scaled for a in actions)
        return _with_groups(rendered, groups, job, uid, scaled) if groups else rendered

    def pod(self, job: TrainingJob, uid: str, role: Role, index: int) -> dict[str, Any]:
        """Replica ``index`` of ``role`` as its pod (TemplateError: see :meth:`problem`)."""
        return self._pod(job, uid, role, index)

    def _pod(
        self, job: TrainingJob, uid: str, role: Role, index: int, placement: PodDecoration | None = None
    ) -> dict[str, Any]:
        decoration = policy_for(job, self.policies).pod(job, role, index)
        if placement is not None:
            decoration = decoration.joined(placement)
        return pod_manifest(job, uid, role, index, command=self.command, decoration=decoration,
                            pull_policy=self.pull_policy)

    def _render(self, action: Action, job: TrainingJob, uid: str, queueing: Queueing | None) -> ClusterAction | None:
        if isinstance(action, (RequestAdmission, ReleaseAdmission, FinishAdmission)):
            return None if queueing is None else self._admission(action, job, uid, queueing)
        if isinstance(action, CreateReplica):
            placement = queueing.placement.get(action.role) if queueing is not None else None
            return CreatePod(self._pod(job, uid, action.role, action.index, placement), member(action.role, action.index))
        if isinstance(action, DeleteReplica):
            return DeletePod(action.name, action.reason)
        if isinstance(action, CreateIngressPolicy) and not job.uses_ps:
            return None  # it guards PS pods; the planner asks for none without them
        if isinstance(action, CreateReplicaService):
            if action.role is Role.PS and not job.uses_ps:
                return None
            return CreateService(service_manifest(job, uid, action.index, action.role))
        if isinstance(action, CreateIngressPolicy):
            peer = None if self.operator_peer is None else dict(self.operator_peer)
            return CreateNetworkPolicy(network_policy_manifest(job, uid, peer))
        return action

    def _admission(
        self, action: RequestAdmission | ReleaseAdmission | FinishAdmission, job: TrainingJob, uid: str, queueing: Queueing
    ) -> ClusterAction | None:
        """A queued job's request as its Workload; a release or the end as a write of its status."""
        if isinstance(action, RequestAdmission):
            pods = {role: self._pod(job, uid, role, 0) for role, _, _ in action.pod_sets}
            manifest = kueue.workload_manifest(job, uid, queueing.queue, action.pod_sets, pods, queueing.priority)
            return CreateGroup(kueue.WORKLOADS, manifest)
        if queueing.workload is None:
            return None
        if isinstance(action, ReleaseAdmission):
            released = kueue.released(queueing.workload, action.message, queueing.now)
            return ReplaceStatus(kueue.WORKLOADS, released, "gave its quota back")
        ended = kueue.finished(queueing.workload, action.succeeded, action.message, queueing.now)
        return ReplaceStatus(kueue.WORKLOADS, ended, "finished")


def _with_groups(
    rendered: list[ClusterAction], groups: tuple[GroupObject, ...], job: TrainingJob, uid: str, scaled: bool
) -> list[ClusterAction]:
    """``rendered`` with the policy's group objects created (or brought in step) right before its
    first pod, or first of all in a pass that only scales down, and deleted right after a status
    patch that ends the job (see the module doc)."""
    out = list(rendered)
    ends = next((i for i, r in enumerate(out) if isinstance(r, SetStatus) and r.status.get("phase") in FINISHED), None)
    if ends is not None:
        out[ends + 1 : ends + 1] = [DeleteGroup(g.api_version, g.plural, g.kind, g.name) for g in groups]
        return out
    first_pod = next((i for i, r in enumerate(out) if isinstance(r, CreatePod)), 0 if scaled else None)
    if first_pod is not None:
        out[first_pod:first_pod] = [CreateGroup(g.plural, group_manifest(job, uid, g), in_step=True) for g in groups]
    return out
