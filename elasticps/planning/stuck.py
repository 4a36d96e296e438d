"""Replicas stuck Pending: a condition at once, Failed after ``settings.pending_timeout_s``.

Callers: ``plan`` (rule 9 of its list). Two causes, each its own condition type beside the phases:
Unschedulable (the scheduler cannot place the pod; its message) and CannotStart (the container
waits on an error it will not leave by itself; the kubelet's reason and message). Local processes
are never stuck this way.

An image that cannot exist as named (:func:`permanent`: an invalid name, a pull the registry
answers "not found" or "denied", a registry host that does not resolve, an image that must not be
pulled and is absent) fails the job at once with the kubelet's line: waiting would only repeat it.
Other pull errors (a registry that is slow or briefly away) wait out the timeout.
"""

from __future__ import annotations

from collections.abc import Callable

from elasticps.api.spec import JobPhase
from elasticps.planning.actions import Event
from elasticps.planning.draft import Draft
from elasticps.planning.ends import fail
from elasticps.planning.observed import ObservedPod, PodPhase

UNSCHEDULABLE = "Unschedulable"
CANNOT_START = "CannotStart"


PERMANENT_REASONS = ("InvalidImageName", "ErrImageNeverPull")
# What a registry or the resolver answers for an image that is not there as named.
PERMANENT_PULL_ERRORS = ("not found", "manifest unknown", "does not exist", "pull access denied", "no such host")


def permanent(pod: ObservedPod) -> bool:
    """Whether ``pod`` cannot start for good: its image cannot be pulled as named."""
    if pod.reason in PERMANENT_REASONS:
        return True
    message = pod.message.lower()
    return pod.reason == "ErrImagePull" and any(error in message for error in PERMANENT_PULL_ERRORS)


def stuck(d: Draft) -> bool:
    unschedulable = _stuck_on(
        d, UNSCHEDULABLE, lambda p: p.unschedulable_since, "cannot be scheduled", "Scheduled", "Every pod is scheduled."
    )
    cannot_start = _stuck_on(
        d, CANNOT_START, lambda p: p.cannot_start_since, "cannot start", "Started", "Every pod's container starts."
    )
    # A job that never ran shows Pending while one of them holds (a running job keeps its phase).
    held = d.status.is_true(UNSCHEDULABLE) or d.status.is_true(CANNOT_START)
    if held and d.status.phase is JobPhase.CREATED:
        d.status.phase = JobPhase.PENDING
    elif not held and d.status.phase is JobPhase.PENDING:
        d.status.phase = JobPhase.CREATED
    return unschedulable or cannot_start


def _stuck_on(
    d: Draft,
    kind: str,
    since_of: Callable[[ObservedPod], float | None],
    what: str,
    cleared: str,
    cleared_message: str,
) -> bool:
    stuck = [
        p
        for p in d.pods
        if p.phase is PodPhase.PENDING and since_of(p) is not None and not p.deleted and p.index < d.desired(p.role)
    ]
    status = d.status
    if not stuck:
        if status.is_true(kind):
            status.set(kind, False, cleared, cleared_message)
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
    hopeless = [p for p in stuck if kind == CANNOT_START and permanent(p)]
    if hopeless:
        pod = hopeless[0]
        return fail(d, pod.reason or kind, f"{pod.name} cannot start: {pod.reason}: {pod.message} (spec.image names "
                                           f"an image the node cannot pull; a replacement would fail the same way)")
    if not status.is_true(kind):
        d.events.append(Event(reason, message, "Warning"))
    status.set(kind, True, reason, message)
    timeout = d.settings.pending_timeout_s
    if timeout is None:
        return False
    if d.now - since >= timeout:
        return fail(d, reason, f"{message}; pending for {d.now - since:.0f} s (limit {timeout:.0f} s).")
    d.rechecks.append(since + timeout - d.now)
    return False
