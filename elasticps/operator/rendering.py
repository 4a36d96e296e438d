"""The planner's actions rendered for the API server: replicas become Pods, their addresses
headless Services, the ingress policy a NetworkPolicy.

Callers: ``reconciling``, between ``planning.plan`` and ``executing.execute``; and the planner
itself, through :meth:`Renderer.problem`, its render check: a role's pod template of the wrong
shape fails the job (InvalidSpec) before anything is created, as the planner's rules say, instead
of surfacing here. Actions the API needs no rendering for (Events, the status patch, DeleteJob,
Recheck) pass through unchanged.

A rendered create carries the whole manifest; 409 AlreadyExists on it means an earlier pass created
it, and 404 on a ``DeletePod`` that it is already gone (``executing``). Services and the
NetworkPolicy exist only for jobs whose strategy has PS replicas (the planner asks for none
otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from elasticps.api.replicas import Role
from elasticps.api.spec import TrainingJob
from elasticps.operator.manifests import (
    DEFAULT_COMMAND,
    TemplateError,
    network_policy_manifest,
    pod_manifest,
    service_manifest,
)
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


@dataclass(frozen=True)
class CreateNetworkPolicy:
    manifest: dict[str, Any]  # networking.k8s.io/v1


@dataclass(frozen=True)
class CreateService:
    manifest: dict[str, Any]


@dataclass(frozen=True)
class CreatePod:
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True)
class DeletePod:
    name: str
    reason: str


ClusterAction = Union[CreateNetworkPolicy, CreateService, CreatePod, DeletePod, SetStatus, Event, DeleteJob, Recheck]


@dataclass(frozen=True)
class Renderer:
    """How this operator renders replicas. ``command``: the containers' entrypoint.
    ``operator_peer``: who besides the job's pods may dial its PS (a NetworkPolicyPeer); None: the
    operator's pods, by ``manifests.OPERATOR_LABELS``, in any namespace."""

    command: tuple[str, ...] = DEFAULT_COMMAND
    operator_peer: Mapping[str, Any] | None = field(default=None, hash=False)

    def problem(self, job: TrainingJob, role: Role, index: int) -> str | None:
        """The planner's render check: why this replica's pod cannot be rendered, or None."""
        try:
            pod_manifest(job, "", role, index, command=self.command)
        except TemplateError as err:
            return str(err)
        return None

    def render(self, actions: Sequence[Action], job: TrainingJob, uid: str) -> list[ClusterAction]:
        """``actions`` for the API server, in the same order; ``uid`` owns what is created. A PS
        Service or the ingress policy of a job whose strategy has no PS renders to nothing.

        Raises :class:`~elasticps.operator.manifests.TemplateError` only for a replica the render
        check passed, which would be a bug (the check renders the same pod).
        """
        rendered = (self._render(action, job, uid) for action in actions)
        return [action for action in rendered if action is not None]

    def _render(self, action: Action, job: TrainingJob, uid: str) -> ClusterAction | None:
        if isinstance(action, CreateReplica):
            return CreatePod(pod_manifest(job, uid, action.role, action.index, command=self.command))
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
