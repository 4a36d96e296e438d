"""Kueue admission of a TrainingJob, as the job controller of an external framework does it: pure.

Callers: ``reconciling`` (reads the job's Workload and the ResourceFlavors it was admitted on, and
turns them into the planner's :class:`~elasticps.planning.observed.Admission` and the pods'
placement) and ``rendering`` (turns ``RequestAdmission`` into the Workload, ``ReleaseAdmission``
and ``FinishAdmission`` into writes of its status). No API calls here.

Why a Workload of our own rather than Kueue's pod-group integration: a pod group is admitted as a
fixed set of pods, created up front and gated; an elasticps job replaces pods, restarts PS shards
under the same names and scales its workers, and on eviction must stop as a whole and resume from
its checkpoint. A Workload with one pod set per role (counts and requests from the rendered pods,
``minCount`` from ``spec.worker.minReplicas`` for partial admission) says exactly what the job
needs, and its conditions are the protocol: QuotaReserved/Admitted to start, Evicted to stop,
QuotaReserved False (written by us once the pods are gone) to give the quota back, Finished.

A job opts in as with any Kueue integration: the label ``kueue.x-k8s.io/queue-name`` names its
LocalQueue; ``kueue.x-k8s.io/priority-class`` names a WorkloadPriorityClass.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from elasticps.api.replicas import Role
from elasticps.api.spec import TrainingJob
from elasticps.operator.manifests import LABEL_JOB, owner_reference
from elasticps.operator.scheduling import PodDecoration
from elasticps.planning.observed import Admission
from elasticps.planning.status import rfc3339

GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"
WORKLOADS = "workloads"
FLAVORS = "resourceflavors"
PRIORITY_CLASSES = "workloadpriorityclasses"
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
JOB_UID_LABEL = f"{GROUP}/job-uid"
NAME_LIMIT = 63


def workload_name(job: str, uid: str) -> str:
    """The job's Workload: ``trainingjob-NAME-UID5`` (a job created again under the same name gets
    another), within 63 characters."""
    suffix = f"-{uid[:5]}" if uid else ""
    return f"trainingjob-{job}"[: NAME_LIMIT - len(suffix)].rstrip("-") + suffix


def queue_of(labels: Mapping[str, Any]) -> str:
    """The LocalQueue the job asks for ("": the job is not queued)."""
    value = labels.get(QUEUE_LABEL)
    return value.strip() if isinstance(value, str) else ""


def _conditions(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = workload.get("status") or {}
    items = status.get("conditions") if isinstance(status, dict) else None
    return {str(c["type"]): c for c in items or [] if isinstance(c, dict) and "type" in c}


def _true(conditions: Mapping[str, Mapping[str, Any]], kind: str) -> bool:
    return conditions.get(kind, {}).get("status") == "True"


def admission_of(workload: Mapping[str, Any] | None, queue: str) -> Admission:
    """What the Workload says (None: the job has not asked yet)."""
    if workload is None:
        return Admission(queue)
    conditions = _conditions(workload)
    status = workload.get("status") or {}
    admission = status.get("admission") or {}
    asked = {str(p.get("name")): int(p.get("count") or 0) for p in (workload.get("spec") or {}).get("podSets") or []}
    counts: dict[Role, int] = {}
    for assignment in admission.get("podSetAssignments") or []:
        name = str(assignment.get("name"))
        try:
            role = Role(name)
        except ValueError:
            continue
        counts[role] = int(assignment["count"]) if isinstance(assignment.get("count"), int) else asked.get(name, 0)
    waiting = ""
    reserved = conditions.get("QuotaReserved")
    if reserved is not None and reserved.get("status") != "True":
        waiting = str(reserved.get("message") or "")
    evicted = str(conditions["Evicted"].get("message") or "evicted") if _true(conditions, "Evicted") else ""
    return Admission(
        queue,
        requested=True,
        admitted=_true(conditions, "Admitted"),
        counts=counts,
        holds_quota=_true(conditions, "QuotaReserved"),
        evicted=evicted,
        waiting=waiting,
        finished=_true(conditions, "Finished"),
        cluster_queue=str(admission.get("clusterQueue") or ""),
    )


def flavor_names(workload: Mapping[str, Any] | None) -> set[str]:
    """The ResourceFlavors the job's admission assigned (their node labels and tolerations place its pods)."""
    admission = ((workload or {}).get("status") or {}).get("admission") or {}
    return {str(f) for a in admission.get("podSetAssignments") or [] for f in (a.get("flavors") or {}).values()}


def placements(workload: Mapping[str, Any] | None, flavors: Mapping[str, Mapping[str, Any] | None]) -> dict[Role, PodDecoration]:
    """Each admitted role's pod placement, as Kueue's own integrations apply it when they start a
    job: the node labels and tolerations of the flavors its resources were admitted on, then what
    the admission checks asked for (``podSetUpdates``)."""
    status = (workload or {}).get("status") or {}
    out: dict[Role, PodDecoration] = {}
    for assignment in (status.get("admission") or {}).get("podSetAssignments") or []:
        try:
            role = Role(str(assignment.get("name")))
        except ValueError:
            continue
        selector: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        for name in sorted({str(f) for f in (assignment.get("flavors") or {}).values()}):
            spec = (flavors.get(name) or {}).get("spec") or {}
            selector.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
            tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        decoration = PodDecoration(node_selector=selector, tolerations=tuple(tolerations))
        for check in status.get("admissionChecks") or []:
            for update in check.get("podSetUpdates") or []:
                if update.get("name") == role.value:
                    decoration = decoration.joined(PodDecoration(
                        labels=dict(update.get("labels") or {}), annotations=dict(update.get("annotations") or {}),
                        node_selector=dict(update.get("nodeSelector") or {}),
                        tolerations=tuple(update.get("tolerations") or ()),
                    ))
        out[role] = decoration
    return out


def workload_manifest(
    job: TrainingJob,
    uid: str,
    queue: str,
    pod_sets: Iterable[tuple[Role, int, int]],
    pods: Mapping[Role, Mapping[str, Any]],
    priority: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """The job's Workload: one pod set per role, its template the role's first pod as rendered (its
    requests are what Kueue counts), ``minCount`` where the role may start with fewer; owned by
    the job (deleted with it). ``priority``: a WorkloadPriorityClass's name and value."""
    sets = []
    for role, count, least in pod_sets:
        pod = pods[role]
        template = {
            "metadata": {k: copy.deepcopy(pod["metadata"][k]) for k in ("labels", "annotations") if pod["metadata"].get(k)},
            "spec": copy.deepcopy(pod["spec"]),
        }
        entry: dict[str, Any] = {"name": role.value, "count": count, "template": template}
        if 0 < least < count:
            entry["minCount"] = least
        sets.append(entry)
    spec: dict[str, Any] = {"queueName": queue, "podSets": sets}
    if priority is not None:
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority[0]}
        spec["priority"] = priority[1]
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job.name, uid),
            "namespace": job.namespace,
            "labels": {LABEL_JOB: job.name, JOB_UID_LABEL: uid},
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": spec,
    }


def _condition(workload: Mapping[str, Any], kind: str, true: bool, reason: str, message: str, now: float) -> dict[str, Any]:
    old = _conditions(workload).get(kind) or {}
    status = "True" if true else "False"
    moved = old.get("status") != status
    return {
        "type": kind, "status": status, "reason": reason, "message": message[:32768],
        "lastTransitionTime": rfc3339(now) if moved else old.get("lastTransitionTime") or rfc3339(now),
        "observedGeneration": int((workload.get("metadata") or {}).get("generation") or 0),
    }


def _with_conditions(workload: Mapping[str, Any], new: list[dict[str, Any]]) -> dict[str, Any]:
    out = copy.deepcopy(dict(workload))
    status = out.setdefault("status", {})
    kinds = {c["type"] for c in new}
    status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") not in kinds] + new
    return out


def released(workload: Mapping[str, Any], message: str, now: float) -> dict[str, Any]:
    """The Workload with its quota given back, as Kueue's job reconciler writes it once an evicted
    job stopped: QuotaReserved False (reason Pending), no admission, Admitted False. Kueue then
    queues it again."""
    out = _with_conditions(workload, [
        _condition(workload, "QuotaReserved", False, "Pending", message, now),
        _condition(workload, "Admitted", False, "NoReservation", "The workload has no reservation", now),
    ])
    out["status"].pop("admission", None)
    return out


def finished(workload: Mapping[str, Any], succeeded: bool, message: str, now: float) -> dict[str, Any]:
    """The Workload with condition Finished: Kueue frees its quota for good."""
    return _with_conditions(workload, [
        _condition(workload, "Finished", True, "Succeeded" if succeeded else "Failed", message, now),
    ])
