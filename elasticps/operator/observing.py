"""What the API server returned, turned into the planner's ``Observed``: pure.

Callers: ``reconciling`` (one pass per job) feeds it the raw JSON of the job's pods, Services and
NetworkPolicies
(listed fresh by the ``elasticps.io/job-name`` label) and PS 0's answer. Nothing here decides: it
only reads the fields ``planning.observed.ObservedPod`` documents. (PS 0's reply becomes
``JobProgress`` in ``planning.progress``, shared with the local runner.)

- The exit code is the ``elasticps`` container's ``state.terminated.exitCode``; its
  ``state.terminated.message`` (the replica's one-line reason, ``exits.py``) is the pod's message.
- ``unschedulable_since`` / ``message`` come from the ``PodScheduled=False`` condition with reason
  ``Unschedulable`` (its ``lastTransitionTime``), which is where the scheduler writes why.
- A pod of the same name owned by an *earlier* job of the same name (a different uid, still being
  garbage-collected) is reported as ``deleted``: the planner then waits for it instead of creating
  a pod that would collide with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from elasticps.api.replicas import Role, parse_replica_name
from elasticps.api.spec import KIND
from elasticps.exits import last_line
from elasticps.operator.manifests import CONTAINER
from elasticps.planning.observed import ObservedPod, ObservedService, PodPhase
from elasticps.planning.status import parse_time


def observe_pods(items: Iterable[Mapping[str, Any]], job_name: str, job_uid: str) -> tuple[ObservedPod, ...]:
    pods = (observe_pod(item, job_name, job_uid) for item in items)
    return tuple(p for p in pods if p is not None)


def observe_pod(item: Mapping[str, Any], job_name: str, job_uid: str) -> ObservedPod | None:
    """One pod, or None when it is not a replica of this job (a stray label)."""
    meta = _map(item.get("metadata"))
    status = _map(item.get("status"))
    name = str(meta.get("name", ""))
    where = parse_replica_name(job_name, name)
    if where is None:
        return None
    role, index = where
    try:
        phase = PodPhase(status.get("phase", "Pending"))
    except ValueError:
        phase = PodPhase.UNKNOWN
    exit_code, exit_reason, exit_message = _terminated(status)
    waiting_reason, waiting_message = _waiting(status)
    reason = str(status.get("reason") or exit_reason or "")
    message = str(status.get("message") or "") or exit_message
    unschedulable_since = None
    scheduled_at = None
    ready = False
    for condition in _list(status.get("conditions")):
        cond = _map(condition)
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            unschedulable_since = parse_time(cond.get("lastTransitionTime"))
            reason = reason or "Unschedulable"
            message = str(cond.get("message") or message)
        elif cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
        elif cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            scheduled_at = parse_time(cond.get("lastTransitionTime"))
    cannot_start_since = None
    if phase is PodPhase.PENDING and waiting_reason in CANNOT_START_REASONS:
        # The kubelet keeps retrying these for ever; since when: the pod was scheduled (or created).
        cannot_start_since = scheduled_at or parse_time(meta.get("creationTimestamp"))
        reason, message = waiting_reason, waiting_message or message
    owner = _controller_uid(meta)
    foreign = owner is not None and job_uid != "" and owner != job_uid
    return ObservedPod(
        name=name,
        role=role,
        index=index,
        phase=phase,
        exit_code=exit_code,
        reason=reason,
        unschedulable_since=unschedulable_since,
        deleted=bool(meta.get("deletionTimestamp")) or foreign,
        message=message,
        ready=ready,
        uid=str(meta.get("uid") or ""),
        cannot_start_since=cannot_start_since,
    )


def observe_services(items: Iterable[Mapping[str, Any]]) -> tuple[ObservedService, ...]:
    names = (_map(item.get("metadata")).get("name") for item in items)
    return tuple(ObservedService(str(n)) for n in names if n)


def observe_names(items: Iterable[Mapping[str, Any]] | None) -> tuple[str, ...] | None:
    """The names of listed objects (the job's NetworkPolicies); None stays None (not listable)."""
    if items is None:
        return None
    names = (_map(item.get("metadata")).get("name") for item in items)
    return tuple(str(n) for n in names if n)


def coordinator_running(pods: Iterable[ObservedPod], role: Role = Role.PS) -> bool:
    """Whether the coordinating replica (PS 0, or a decentralized job's coordinator: ``role``) could
    answer at all (else the adapter does not dial it)."""
    return any(p.role is role and p.index == 0 and p.phase is PodPhase.RUNNING and not p.deleted for p in pods)


# Waiting reasons a container does not leave by itself: the image or the pod's config is wrong.
CANNOT_START_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
     "CreateContainerError"}
)


def _waiting(status: Mapping[str, Any]) -> tuple[str, str]:
    for item in _list(status.get("containerStatuses")):
        container = _map(item)
        if container.get("name") != CONTAINER:
            continue
        waiting = _map(_map(container.get("state")).get("waiting"))
        return str(waiting.get("reason") or ""), str(waiting.get("message") or "")
    return "", ""


def _terminated(status: Mapping[str, Any]) -> tuple[int | None, str, str]:
    """The container's exit code, reason and message (its termination message's last line: the
    replica's own reason, or its log's last line under FallbackToLogsOnError)."""
    for item in _list(status.get("containerStatuses")):
        container = _map(item)
        if container.get("name") != CONTAINER:
            continue
        terminated = _map(_map(container.get("state")).get("terminated"))
        code = terminated.get("exitCode")
        if isinstance(code, int) and not isinstance(code, bool):
            return code, str(terminated.get("reason") or ""), last_line(str(terminated.get("message") or ""))
    return None, "", ""


def _controller_uid(meta: Mapping[str, Any]) -> str | None:
    for ref in _list(meta.get("ownerReferences")):
        owner = _map(ref)
        if owner.get("controller") and owner.get("kind") == KIND:
            return str(owner.get("uid") or "")
    return None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
