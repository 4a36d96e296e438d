"""Carries out one pass's actions against the API server, in the order the planner's contract wants.

Callers: ``reconciling``, with the actions of ``planning.plan`` (or ``plan_invalid``) as
``rendering`` made them Kubernetes objects. Order: deletes (pods, then a finished job's scheduling
group objects), then the one status patch (so a large
job's status says Created, with its counts as they are, before its first pod is even asked for,
not seconds later), then the status of a queued job's Workload (``ReplaceStatus``), then creates (the scheduling policy's group objects, so a gang scheduler knows
the group before its first pod; the NetworkPolicy and the Services, so the PS pods are never
reachable from outside the job and a worker's first dial finds its PS Service; then PS pods, then
workers), then Events, then ``DeleteJob``; ``Recheck`` is handed back to the work queue.
Decisions stay with the planner; this module only reports what it did:

- The deletes, and the creates of each of those four stages, are sent concurrently, at most
  ``concurrency`` at a time (a bounded thread pool); every request still waits its turn at the
  operator's one client-side rate limit (``throttling``, inside ``ClusterApi``), so a 1,024-worker
  job goes out as fast as the configured QPS lets it, and no faster.
- 409 on a create and 404 on a delete are success (an earlier pass, or someone else, did it).
  A pod is deleted with its observed uid as a precondition, so a replacement created meanwhile
  under the same name is never deleted by mistake (409: already replaced, also success).
- Pods, Services and group objects created or deleted get Events on the TrainingJob (Kubeflow's reasons:
  SuccessfulCreatePod, SuccessfulDeletePod, FailedCreatePod, SuccessfulCreatePodGroup ...), beside the planner's own
  (Restarting, BackoffLimitExceeded, Succeeded ...): one per object while a pass touches at most
  ``EVENT_BATCH`` of a kind (client-go's event correlator starts aggregating at the same count),
  one for the whole batch beyond that ("Created 1026 pods: a, b, c, d and 1022 more"). Events are
  best effort: a failed Event post is logged, never retried.
- In a namespace being deleted nothing can be created: the pass ends quietly (the job goes with it).
- Any other failed create or delete does not stop the pass; the outcome asks for a retry, with backoff.
"""

from __future__ import annotations

import contextvars
import logging
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar, Union

from elasticps.api.spec import API_VERSION, KIND
from elasticps.operator.cluster_api import ApiError, ClusterApi
from elasticps.operator.manifests import LABEL_ROLE
from elasticps.operator.rendering import (
    ClusterAction,
    CreateGroup,
    CreateNetworkPolicy,
    CreatePod,
    CreateService,
    DeleteGroup,
    DeletePod,
    ReplaceStatus,
)
from elasticps.planning.actions import DeleteJob, Event, Recheck, SetStatus
from elasticps.planning.status import rfc3339

log = logging.getLogger(__name__)

COMPONENT = "elasticps-operator"
MAX_MESSAGE = 1024  # what `kubectl describe` shows comfortably; the API allows more
EVENT_BATCH = 10  # up to this many objects of a kind per pass: an Event each; more: one for the batch
DEFAULT_CONCURRENCY = 16
T = TypeVar("T")


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


@dataclass
class _Done:
    """What a pass did, by kind (``pods``, ``services``, ``networkpolicies``, a group object's
    plural), for its log line and Events."""

    created: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k, _, _ in _KINDS.values()})
    create_failed: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # kind -> (name, error)
    deleted: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)
    delete_failed: list[tuple[str, str]] = field(default_factory=list)  # (name, error)
    group_deletes: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, name, error; "": deleted)
    kinds: dict[str, tuple[str, str]] = field(default_factory=lambda: {k: (w, t) for k, w, t in _KINDS.values()})
    terminating: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def execute(
    actions: Sequence[ClusterAction],
    api: ClusterApi,
    job: JobRef,
    pod_uids: Mapping[str, str],
    now: float,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Outcome:
    outcome = Outcome()
    done = _Done()

    def failed(what: str, err: ApiError) -> None:
        with done.lock:
            outcome.retry = True
            outcome.errors.append(f"{what}: {err}")
        log.warning("%s/%s: %s failed: %s", job.namespace, job.name, what, err)

    def delete(action: DeletePod) -> None:
        try:
            if api.delete_pod(job.namespace, action.name, pod_uids.get(action.name, "")):
                with done.lock:
                    done.deleted.append((action.name, action.reason))
        except ApiError as err:
            failed(f"deleting pod {action.name}", err)
            with done.lock:
                done.delete_failed.append((action.name, err.message))

    def delete_group(action: DeleteGroup) -> None:
        try:
            if api.delete(job.namespace, action.plural, action.api_version, action.name):
                done.group_deletes.append((action.kind, action.name, ""))
        except ApiError as err:
            failed(f"deleting {action.kind} {action.name}", err)
            done.group_deletes.append((action.kind, action.name, err.message))

    def replace_status(action: ReplaceStatus) -> None:
        kind, name = action.manifest.get("kind"), action.manifest["metadata"]["name"]
        try:
            if api.replace_status(job.namespace, action.plural, action.manifest):
                log.info("%s/%s: %s %s %s", job.namespace, job.name, kind, name, action.what)
            else:  # changed since it was read (or gone): the next pass reads it again
                outcome.retry = True
        except ApiError as err:
            failed(f"writing the status of {kind} {name}", err)

    def create(action: _Create) -> None:
        kind, what, title = _kind(action)
        name = str(action.manifest["metadata"]["name"])
        if done.terminating:
            return
        try:
            if api.create(job.namespace, kind, action.manifest):
                with done.lock:
                    done.kinds.setdefault(kind, (what, title))
                    done.created.setdefault(kind, []).append(name)
            elif isinstance(action, CreateGroup) and action.in_step:
                api.patch_spec(job.namespace, kind, action.manifest)
        except ApiError as err:
            if err.namespace_terminating:
                # The namespace and the job in it are going: nothing more to create, nothing to retry.
                log.debug("%s/%s: namespace terminating, %s %s not created", job.namespace, job.name, what, name)
                done.terminating = True
                return
            failed(f"creating {what} {name}", err)
            with done.lock:
                done.kinds.setdefault(kind, (what, title))
                done.create_failed.setdefault(kind, []).append((name, err.message))

    _fan_out(delete, [a for a in actions if isinstance(a, DeletePod)], concurrency)
    for action in actions:
        if isinstance(action, DeleteGroup):
            delete_group(action)
    for action in actions:
        if isinstance(action, SetStatus) and not api.patch_job_status(job.namespace, job.name, action.status):
            outcome.gone = True
            return outcome
    for action in actions:
        if isinstance(action, ReplaceStatus):
            replace_status(action)
    for stage in _creation_stages(actions):
        _fan_out(create, stage, concurrency)
        if done.terminating:
            return Outcome()

    _log_changes(job, done, actions)
    for event in [*_events(done), *(a for a in actions if isinstance(a, Event))]:
        _post_event(api, job, event, now)
    for action in actions:
        if isinstance(action, DeleteJob):
            api.delete_job(job.namespace, job.name)
            outcome.gone = True
        elif isinstance(action, Recheck):
            outcome.recheck_after = action.after_s
    return outcome


def _fan_out(work: Callable[[T], None], items: Sequence[T], concurrency: int) -> None:
    """``work(item)`` for every item, at most ``concurrency`` at once; returns when all are done. Each
    runs in the caller's context (``counting.current_job``: its requests are counted for the job)."""
    if len(items) <= 1 or concurrency <= 1:
        for item in items:
            work(item)
        return
    with ThreadPoolExecutor(max_workers=min(concurrency, len(items)), thread_name_prefix="elasticps-api") as pool:
        for future in [pool.submit(contextvars.copy_context().run, work, item) for item in items]:
            future.result()  # ApiErrors are handled in ``work``: anything else is a bug, raised here


def _events(done: _Done) -> list[Event]:
    """The Events of what a pass did: one per object up to ``EVENT_BATCH`` of a kind, one per batch above."""
    events: list[Event] = []
    if done.deleted:
        by_reason: dict[str, list[str]] = {}
        for name, reason in done.deleted:
            by_reason.setdefault(reason, []).append(name)
        for reason, names in by_reason.items():
            if len(names) <= EVENT_BATCH:
                events += [Event("SuccessfulDeletePod", f"Deleted pod {n}: {reason}.") for n in names]
            else:
                events.append(Event("SuccessfulDeletePod", f"Deleted {len(names)} pods ({reason}): {_names(names)}."))
    if done.delete_failed:
        events += _failures("FailedDeletePod", "deleting", "pod", "pods", done.delete_failed)
    for kind, name, error in done.group_deletes:
        if error:
            events.append(Event(f"FailedDelete{kind}", f"Error deleting {kind} {name}: {error}", "Warning"))
        else:
            events.append(Event(f"SuccessfulDelete{kind}", f"Deleted {kind} {name}: the job finished."))
    # A pass's group objects first (created first), then the NetworkPolicy, Services and pods.
    for kind, (what, title) in sorted(done.kinds.items(), key=lambda item: item[0] in _PLURALS):
        created = sorted(done.created.get(kind, []), key=_natural)
        if len(created) <= EVENT_BATCH:
            events += [Event(f"SuccessfulCreate{title}", f"Created {what}: {n}") for n in created]
        else:
            events.append(Event(f"SuccessfulCreate{title}", f"Created {len(created)} {kind}: {_names(created)}"))
        if done.create_failed.get(kind):
            events += _failures(f"FailedCreate{title}", "creating", what, kind, done.create_failed[kind])
    return events


def _failures(reason: str, verb: str, what: str, plural: str, failures: Sequence[tuple[str, str]]) -> list[Event]:
    failures = sorted(failures, key=lambda f: _natural(f[0]))
    if len(failures) <= EVENT_BATCH:
        return [Event(reason, f"Error {verb} {what} {name}: {message}", "Warning") for name, message in failures]
    names = [name for name, _ in failures]
    message = f"Error {verb} {len(names)} {plural} ({_names(names)}); the first: {failures[0][1]}"
    return [Event(reason, message, "Warning")]


def _natural(name: str) -> tuple[str, int]:
    """``tj-worker-10`` after ``tj-worker-9``."""
    stem, _, index = name.rpartition("-")
    return (stem, int(index)) if index.isdigit() else (name, -1)


def _log_changes(job: JobRef, done: _Done, actions: Sequence[ClusterAction]) -> None:
    """One INFO line per pass that changed something: what it created or deleted, the new phase."""
    parts = []
    groups = [(f"created {kind}", names) for kind, names in done.created.items() if kind not in _PLURALS]
    deleted = [f"{kind} {name}" for kind, name, error in done.group_deletes if not error]
    for what, names in (*groups, ("deleted", deleted),
                        ("created network policies", done.created["networkpolicies"]),
                        ("created services", done.created["services"]),
                        ("created pods", sorted(done.created["pods"], key=_natural)),
                        ("deleted pods", [n for n, _ in done.deleted])):  # fmt: skip
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
_PLURALS = frozenset(plural for plural, _, _ in _KINDS.values())
_Create = Union[CreateGroup, CreateNetworkPolicy, CreateService, CreatePod]


def _kind(action: _Create) -> tuple[str, str, str]:
    """(API plural, word in messages, Event reason suffix) of a create; a group object's are its own."""
    if isinstance(action, CreateGroup):
        kind = str(action.manifest.get("kind") or action.plural)
        return action.plural, kind, kind
    return _KINDS[type(action)]


def _creation_stages(actions: Sequence[ClusterAction]) -> list[list[_Create]]:
    """The scheduling group objects, the NetworkPolicy, the Services, the PS pods, then the workers:
    each stage sent concurrently, the next one started when the last finished."""
    stages: list[list[_Create]] = [[], [], [], [], []]
    for action in actions:
        if isinstance(action, CreateGroup):
            stages[0].append(action)
        elif isinstance(action, CreateNetworkPolicy):
            stages[1].append(action)
        elif isinstance(action, CreateService):
            stages[2].append(action)
        elif isinstance(action, CreatePod):
            is_ps = action.manifest["metadata"].get("labels", {}).get(LABEL_ROLE) == "ps"
            stages[3 if is_ps else 4].append(action)
    return [stage for stage in stages if stage]


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
