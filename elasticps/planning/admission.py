"""Admission by the cluster's queue (Kueue): a queued job runs no replica until it is admitted.

Callers: ``plan`` (rule 3a of its list, after ``runPolicy.suspend``; rule 1 for a finished job).
Only a job the executor observed an :class:`~elasticps.planning.observed.Admission` for is
concerned (the operator, for a job labelled with a queue name); every other job passes untouched.

The protocol is Kueue's for a job kind it does not know itself (an "external framework"):
1. The job asks once (``RequestAdmission``: one pod set per role, the workers' at least
   ``minReplicas``), then waits: phase Queued, condition Queued True with the queue's reason.
2. Admitted: condition Admitted True, Queued False; ``startTime`` restarts (the deadline counts
   from the admission); the replicas are created, never more per role than the queue admitted
   (``Draft.desired``: fewer workers under partial admission).
3. Evicted (preempted by a job of higher priority, quota reclaimed) or the admission lost: every
   replica is deleted, the workers first (``suspension.stop_in_order``: the sync shards then
   checkpoint the version they stop at), condition Suspended True with the queue's reason; once none
   is left the job gives the quota back (``ReleaseAdmission``) and is queued again; on its next
   admission the PS restore from that checkpoint, as after ``runPolicy.suspend``.
4. Finished (Succeeded or Failed): the queue is told (``FinishAdmission``), once.
"""

from __future__ import annotations

from elasticps.api.replicas import Role
from elasticps.api.spec import JobPhase
from elasticps.planning.actions import Event, FinishAdmission, ReleaseAdmission, RequestAdmission
from elasticps.planning.draft import Draft
from elasticps.planning.roles import desired, job_roles
from elasticps.planning.suspension import stop_in_order

QUEUED = JobPhase.QUEUED.value
ADMITTED = "Admitted"


def request(d: Draft) -> tuple[tuple[Role, int, int], ...]:
    """The pod sets the job asks the queue for: every role's replicas; workers may start with
    ``minReplicas`` (0: all of them), the other roles only whole."""
    sets = []
    for role in job_roles(d.job):
        count = desired(d.job, role)
        least = d.job.spec.worker.min_replicas if role is Role.WORKER else 0
        sets.append((role, count, least or count))
    return tuple(sets)


def gate(d: Draft) -> bool:
    """Rule 3a: True when the job may run its replicas this pass; False while it waits for the
    queue or gives back an admission it lost (the pass ends there)."""
    admission = d.obs.admission
    if admission is None:
        return True
    status = d.status
    if not admission.requested:
        d.creates.append(RequestAdmission(request(d)))
    if admission.admitted and not admission.evicted:
        if not status.is_true(ADMITTED):
            where = f" by ClusterQueue {admission.cluster_queue}" if admission.cluster_queue else ""
            workers = admission.counts.get(Role.WORKER)
            sized = f" with {workers} of {desired(d.job, Role.WORKER)} workers" if workers is not None else ""
            message = f"TrainingJob is admitted{where}{sized}."
            status.set(ADMITTED, True, "Admitted", message)
            status.set_if_present(QUEUED, False, "Admitted", message)
            if status.is_true(JobPhase.SUSPENDED.value):
                status.set(JobPhase.SUSPENDED.value, False, "Admitted", message)
            status.phase = JobPhase.CREATED
            status.start_time = d.now
            d.events.append(Event("Admitted", message))
        return True
    live = [pod for pod in d.pods if not pod.deleted]
    if admission.evicted:
        why = f"TrainingJob is evicted by its queue: {admission.evicted}"
        if not status.is_true(JobPhase.SUSPENDED.value):
            status.set(JobPhase.SUSPENDED.value, True, "Evicted", why)
            d.events.append(Event("Evicted", why, "Warning"))
        status.set_if_present(JobPhase.RUNNING.value, False, "Evicted", why)
        status.set_if_present(JobPhase.RESTARTING.value, False, "Evicted", why)
    stop_in_order(d, "the job is not admitted by its queue")
    status.replacing.clear()
    if status.is_true(ADMITTED):
        status.set(ADMITTED, False, "Evicted" if admission.evicted else "NotAdmitted",
                   admission.evicted or "TrainingJob is no longer admitted by its queue.")
    if not d.pods and admission.holds_quota:
        d.creates.append(ReleaseAdmission(admission.evicted or "the job's pods are gone"))
    waiting = admission.waiting or f"waiting for LocalQueue {admission.queue} to admit it"
    message = f"TrainingJob is queued: {waiting}"
    if not status.is_true(QUEUED) or status.condition_message(QUEUED) != message:
        if not status.is_true(QUEUED):
            d.events.append(Event("Queued", message))
        status.set(QUEUED, True, "Queued", message)
    status.phase = JobPhase.SUSPENDED if live else JobPhase.QUEUED
    return False


def finished(d: Draft) -> None:
    """Rule 1's part: a job that ended tells its queue, once, so that the quota is free."""
    admission = d.obs.admission
    if admission is None or not admission.requested or admission.finished:
        return
    succeeded = d.status.phase is JobPhase.SUCCEEDED
    message = d.status.condition_message(JobPhase.SUCCEEDED.value if succeeded else JobPhase.FAILED.value)
    d.creates.append(FinishAdmission(succeeded, message or f"TrainingJob {'succeeded' if succeeded else 'failed'}."))
