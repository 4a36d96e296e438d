"""``runPolicy.suspend``: every replica deleted while it is set, the job resumed when it is unset.

Callers: ``plan`` (rule 3 of its list). Suspending counts no restart; resuming restarts the
deadline clock (``startTime``) and lets ``scaling`` create the replicas again (the PS restore from
their checkpoints).
"""

from __future__ import annotations

from elasticps.api.spec import JobPhase
from elasticps.planning.actions import DeleteReplica, Event
from elasticps.planning.draft import Draft

SUSPENDED = "TrainingJob is suspended."


def suspend(d: Draft) -> None:
    status = d.status
    if not status.is_true(JobPhase.SUSPENDED.value):
        status.set(JobPhase.SUSPENDED.value, True, "TrainingJobSuspended", SUSPENDED)
        status.set_if_present(JobPhase.RUNNING.value, False, "TrainingJobSuspended", SUSPENDED)
        status.set_if_present(JobPhase.RESTARTING.value, False, "TrainingJobSuspended", SUSPENDED)
        d.events.append(Event("Suspended", "TrainingJob is suspended: deleting its pods."))
    status.phase = JobPhase.SUSPENDED
    status.replacing.clear()
    for pod in d.pods:
        if not pod.deleted:
            d.deletes.append(DeleteReplica(pod.name, "the job is suspended"))


def resume_if_suspended(d: Draft) -> None:
    status = d.status
    if status.is_true(JobPhase.SUSPENDED.value):
        status.set(JobPhase.SUSPENDED.value, False, "TrainingJobResumed", "TrainingJob is resumed.")
        status.phase = JobPhase.CREATED
        status.start_time = d.now
        d.events.append(Event("Resumed", "TrainingJob is resumed: creating its pods again."))
