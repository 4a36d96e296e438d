"""The phase of a job that goes on: Restarting while replacements are under way, else Running once
its replicas run.

Callers: ``plan`` (rule 12 of its list), after every other rule let the job go on.
"""

from __future__ import annotations

from elasticps.api.replicas import Role
from elasticps.api.spec import JobPhase
from elasticps.planning.actions import Event
from elasticps.planning.draft import Draft
from elasticps.planning.observed import PodPhase


def phase(d: Draft) -> None:
    status = d.status
    if status.replacing:
        names = ", ".join(sorted(status.replacing))
        status.set(JobPhase.RESTARTING.value, True, "TrainingJobRestarting", f"Replacing {names}.")
        status.set_if_present(JobPhase.RUNNING.value, False, "TrainingJobRestarting", f"Replacing {names}.")
        status.phase = JobPhase.RESTARTING
        return
    current = [p for p in d.pods if not p.deleted and p.index < d.desired(p.role)]
    running = [p for p in current if p.phase is PodPhase.RUNNING]
    # Every PS (or the coordinator of a strategy without PS) the job wants and at least one worker:
    # an elastic job trains on what it has.
    ps_running = all(sum(p.role is role for p in running) == d.desired(role) for role in Role if role is not Role.WORKER)
    if status.phase is JobPhase.RESTARTING:
        # Recovered only once every replacement runs (a worker that exited 0 is fine).
        workers = [p for p in current if p.role is Role.WORKER and p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED)]
        if len(workers) < d.desired(Role.WORKER):
            return
    if ps_running and any(p.role is Role.WORKER for p in running):
        if status.phase is not JobPhase.RUNNING:
            again = " again: every replacement runs" if status.phase is JobPhase.RESTARTING else ""
            ready = f"{len([p for p in running if p.role is Role.WORKER])} of {d.desired(Role.WORKER)} workers"
            d.events.append(Event("Running", f"TrainingJob {d.job_id} is running{again} ({ready} running)."))
        status.set(JobPhase.RUNNING.value, True, "TrainingJobRunning", f"TrainingJob {d.job_id} is running.")
        status.set_if_present(JobPhase.RESTARTING.value, False, "TrainingJobRunning", "Every replacement is running.")
        status.phase = JobPhase.RUNNING
