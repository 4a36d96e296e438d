"""Carries out one pass's actions against the API server, in the order the planner's contract wants.

Callers: ``reconciling``, with the actions of ``planning.plan`` (or ``plan_invalid``) as
``rendering`` made them Kubernetes objects. Order: deletes, then creates (the NetworkPolicy, so
the PS pods are never reachable from outside the job; then Services, then PS pods, then workers,
so a worker's first dial finds its PS Service), then Events, then the one status patch, then
``DeleteJob``; ``Recheck`` is handed back
to the work queue. Decisions stay with the planner; this module only reports what it did:

- 409 on a create and 404 on a delete are success (an earlier pass, or someone else, did it).
  A pod is deleted with its observed uid as a precondition, so a replacement created meanwhile
  under the same name is never deleted by mistake (409: already replaced, also success).
- Each pod or Service created or deleted gets an Event on the TrainingJob (Kubeflow's reasons:
  SuccessfulCreatePod, SuccessfulDeletePod, FailedCreatePod ...), beside the planner's own
  (Restarting, BackoffLimitExceeded, Succeeded ...). Events are best effort: a failed Event post is
  logged, never retried.
- In a namespace being deleted nothing can be created: the pass ends quietly (the job goes with it).
- Any other failed create or delete does not stop the pass (the status is still written, so the
  restart count stays right); the outcome asks for a retry, with backoff.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elasticps.api.spec import API_VERSION, KIND
from elasticps.operator.cluster_api import ApiError, ClusterApi
from elasticps.operator.manifests import LABEL_ROLE
from elasticps.operator.rendering import (
    ClusterAction,
    CreateNetworkPolicy,
    CreatePod,
    CreateService,
    DeletePod,
)
from elasticps.planning.actions import DeleteJob, Event, Recheck, SetStatus
from elasticps.planning.status import rfc3339

log = logging.getLogger(__name__)

COMPONENT = "elasticps-operator"
MAX_MESSAGE = 1024  # what `kubectl describe` shows comfortably; the API allows more


@dataclass(frozen=True)
class JobRef:
    namespace: str
    name: str
    uid: str


@dataclass
class Outcome:
    """What the work queue must know after a pass."""

    recheck_after: float | None = None
    retry: bool = False  # something failed that a later pass may get through
    gone: bool = False  # the job no longer exists
    finished: bool = False  # Succeeded or Failed: only events (and Rechecks) need a pass now
    errors: list[str] = field(default_factory=list)


def execute(
    actions: Sequence[ClusterAction], api: ClusterApi, job: JobRef, pod_uids: Mapping[str, str], now: float
) -> Outcome:
    outcome = Outcome()
    events: list[Event] = []
    created: dict[str, list[str]] = {"pods": [], "services": [], "networkpolicies": []}
    deleted: list[str] = []

    def failed(what: str, err: ApiError) -> None:
        outcome.retry = True
        outcome.errors.append(f"{what}: {err}")
        log.warning("%s/%s: %s failed: %s", job.namespace, job.name, what, err)

    for action in actions:
        if isinstance(action, DeletePod):
            try:
                if api.delete_pod(job.namespace, action.name, pod_uids.get(action.name, "")):
                    deleted.append(action.name)
                    events.append(Event("SuccessfulDeletePod", f"Deleted pod {action.name}: {action.reason}."))
            except ApiError as err:
                failed(f"deleting pod {action.name}", err)
                events.append(Event("FailedDeletePod", f"Error deleting pod {action.name}: {err.message}", "Warning"))

    for action in _creation_order(actions):
        kind, what, title = _KINDS[type(action)]
        name = str(action.manifest["metadata"]["name"])
        try:
            if api.create(job.namespace, kind, action.manifest):
                created[kind].append(name)
                events.append(Event(f"SuccessfulCreate{title}", f"Created {what}: {name}"))
        except ApiError as err:
            if err.namespace_terminating:
                # The namespace and the job in it are going: nothing more to create, nothing to retry.
                log.debug("%s/%s: namespace terminating, %s %s not created", job.namespace, job.name, what, name)
                return Outcome()
            failed(f"creating {what} {name}", err)
            events.append(Event(f"FailedCreate{title}", f"Error creating {what} {name}: {err.message}", "Warning"))

    _log_changes(job, created, deleted, actions)
    events.extend(a for a in actions if isinstance(a, Event))
    for event in events:
        _post_event(api, job, event, now)

    for action in actions:
        if isinstance(action, SetStatus):
            if not api.patch_job_status(job.namespace, job.name, action.status):
                outcome.gone = True
                return outcome
        elif isinstance(action, DeleteJob):
            api.delete_job(job.namespace, job.name)
            outcome.gone = True
        elif isinstance(action, Recheck):
            outcome.recheck_after = action.after_s
    return outcome


def _log_changes(
    job: JobRef, created: Mapping[str, Sequence[str]], deleted: Sequence[str], actions: Sequence[ClusterAction]
) -> None:
    """One INFO line per pass that changed something: what it created or deleted, the new phase."""
    parts = []
    for what, names in (("created network policies", created["networkpolicies"]),
                        ("created services", created["services"]), ("created pods", created["pods"]),
                        ("deleted pods", deleted)):  # fmt: skip
        if names:
            parts.append(f"{what} {_names(names)}")
    phase = next((a.status.get("phase") for a in actions if isinstance(a, SetStatus) and "phase" in a.status), None)
    if phase:
        parts.append(f"phase {phase}")
    if parts:
        log.info("%s/%s: %s", job.namespace, job.name, "; ".join(parts))


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


# action type -> (API plural, word in messages, Event reason suffix)
_KINDS: dict[type, tuple[str, str, str]] = {
    CreateNetworkPolicy: ("networkpolicies", "network policy", "NetworkPolicy"),
    CreateService: ("services", "service", "Service"),
    CreatePod: ("pods", "pod", "Pod"),
}


def _creation_order(actions: Sequence[ClusterAction]) -> list[CreateNetworkPolicy | CreateService | CreatePod]:
    policies = [a for a in actions if isinstance(a, CreateNetworkPolicy)]
    services = [a for a in actions if isinstance(a, CreateService)]
    pods = [a for a in actions if isinstance(a, CreatePod)]
    ps_first = sorted(pods, key=lambda a: a.manifest["metadata"].get("labels", {}).get(LABEL_ROLE) != "ps")
    return [*policies, *services, *ps_first]


def event_manifest(job: JobRef, event: Event, now: float) -> dict[str, object]:
    """A core/v1 Event about the TrainingJob, as ``kubectl describe trainingjob`` lists them."""
    stamp = rfc3339(now)
    message = event.message if len(event.message) <= MAX_MESSAGE else event.message[: MAX_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{job.name}.", "namespace": job.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": job.name,
            "namespace": job.namespace,
            "uid": job.uid,
        },
        "reason": event.reason,
        "message": message,
        "type": event.type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": socket.gethostname(),
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _post_event(api: ClusterApi, job: JobRef, event: Event, now: float) -> None:
    try:
        api.create(job.namespace, "events", event_manifest(job, event, now))
    except (ApiError, OSError) as err:
        log.warning("%s/%s: event %s not posted: %s", job.namespace, job.name, event.reason, err)
