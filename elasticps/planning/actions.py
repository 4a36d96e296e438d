"""What the planner asks an executor to do: replicas named by role and index, never manifests.

Callers: the planner's rules emit these; the operator's ``rendering`` turns the replica actions
into Pods, Services and a NetworkPolicy, the local runner into processes (it skips Services and
the NetworkPolicy by design: local processes dial 127.0.0.1 ports). An executor carries them out
in this order: deletes, then creates (the policy, Services, then PS replicas before workers), then
Events, then ``DeleteJob``; ``Recheck`` says when to plan again. The one ``SetStatus`` depends on
none of them: the operator writes it right after the deletes (a large job's status then shows at
once, not after its last create), the local runner keeps it in memory.
Every action is idempotent: creating what exists and deleting what is gone are not errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from elasticps.api.replicas import Role


@dataclass(frozen=True)
class CreateReplica:
    """Start replica ``index`` of ``role`` (named ``name``) with the job's current spec."""

    name: str
    role: Role
    index: int


@dataclass(frozen=True)
class DeleteReplica:
    """Stop replica ``name``; ``reason`` is for people (Events, logs). ``scaled``: the job's size
    changed (a scale-down), not one replica's fate: what depends on the size (a gang) follows it."""

    name: str
    reason: str
    scaled: bool = False


@dataclass(frozen=True)
class CreateReplicaService:
    """A stable address for replica ``index`` of ``role`` (a PS), named ``name``, that survives
    its restarts (a headless Service in a cluster)."""

    name: str
    role: Role
    index: int


@dataclass(frozen=True)
class CreateIngressPolicy:
    """The job's PS replicas accept gRPC only from the job's own replicas (and the operator)."""

    name: str


@dataclass(frozen=True)
class RequestAdmission:
    """Ask the cluster's queue to admit the job (a Kueue Workload): ``pod_sets`` are (role, replicas,
    fewest replicas it may start with), in creation order. Created once; never changed after."""

    pod_sets: tuple[tuple[Role, int, int], ...]


@dataclass(frozen=True)
class ReleaseAdmission:
    """The job's replicas are gone after the queue evicted it (or it was suspended): the queue may
    take its quota back and queue it again. ``message`` says why, for the queue's own status."""

    message: str


@dataclass(frozen=True)
class FinishAdmission:
    """The job ended (``succeeded`` or not): the queue frees its quota for good."""

    succeeded: bool
    message: str


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


Action = Union[
    CreateIngressPolicy, CreateReplicaService, CreateReplica, DeleteReplica, SetStatus, Event, DeleteJob, Recheck,
    RequestAdmission, ReleaseAdmission, FinishAdmission,
]
