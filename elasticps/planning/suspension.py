"""``runPolicy.suspend``: every replica deleted while it is set, the job resumed when it is unset.

Callers: ``plan`` (rule 3 of its list; ``admission`` stops an evicted job the same way). Suspending
counts no restart; resuming restarts the deadline clock (``startTime``) and lets ``scaling`` create
the replicas again (the PS restore from their checkpoints).

The replicas stop in order (``stop_in_order``): the workers first, the PS (or a decentralized job's
coordinator) once no worker is left. With no worker the model stands still, so each sync shard
stops at the same version and checkpoints it on its way out, PS 0 its ledger beside it (``ps/main``):
the job resumes where it stopped, not at its last periodic checkpoint.
"""

from __future__ import annotations

from elasticps.api.replicas import Role
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
    stop_in_order(d, "the job is suspended")


def stop_in_order(d: Draft, reason: str) -> None:
    """Every replica deleted, the workers first: the others once no worker is left (see the module doc)."""
    workers_left = any(pod.role is Role.WORKER for pod in d.pods)
    for pod in d.pods:
        if not pod.deleted and (pod.role is Role.WORKER or not workers_left):
            d.deletes.append(DeleteReplica(pod.name, reason))


def resume_if_suspended(d: Draft) -> None:
    status = d.status
    if status.is_true(JobPhase.SUSPENDED.value):
        status.set(JobPhase.SUSPENDED.value, False, "TrainingJobResumed", "TrainingJob is resumed.")
        status.phase = JobPhase.CREATED
        status.start_time = d.now
        d.events.append(Event("Resumed", "TrainingJob is resumed: creating its pods again."))
