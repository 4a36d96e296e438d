"""The rules that end a job or follow its end: deadline, success, a failed export, failure, cleanup, TTL.

Callers: ``plan`` (rules 1, 4, 6 and 7 of its list) and the rules that fail a job (``health``, ``failures``,
``stuck``, ``scaling``), which all end through :func:`fail`.
"""

from __future__ import annotations

from elasticps.api.replicas import Role
from elasticps.api.spec import CleanPodPolicy, JobPhase
from elasticps.planning.actions import DeleteReplica, Event
from elasticps.planning.draft import Draft
from elasticps.planning.observed import RUNNING_PHASES, PodPhase

SHARDS_UNRECOVERABLE = "ShardsUnrecoverable"


def fail(d: Draft, reason: str, message: str, *, stop_running: bool = False) -> bool:
    """Failed with ``reason``; always True (a rule that fails the job ends the pass)."""
    # Replacements begun earlier in this pass do not happen: the replicas are left to cleanPodPolicy.
    d.deletes.clear()
    d.events = [e for e in d.events if e.reason != "Restarting"]
    d.status.restarts = d.restarts_before
    d.status.fail(reason, message)
    d.events.append(Event(reason, message, "Warning"))
    cleanup(d, succeeded=False, stop_running=stop_running)
    ttl(d)
    return True


def past_deadline(d: Draft) -> bool:
    """``activeDeadlineSeconds`` past since ``startTime``: Failed, DeadlineExceeded."""
    limit = d.job.spec.run_policy.active_deadline_seconds
    start = d.status.start_time
    if not limit or start is None:
        return False
    if d.now - start < limit:
        d.rechecks.append(start + limit - d.now)
        return False
    message = f"TrainingJob ran longer than activeDeadlineSeconds={limit}."
    return fail(d, "DeadlineExceeded", message, stop_running=True)


def succeeded(d: Draft) -> bool:
    """The coordinator says the training is done and no worker still runs: Succeeded."""
    coordinator = d.obs.coordinator
    if coordinator is None or not coordinator.finished:
        return False
    if any(p.role is Role.WORKER and p.phase in (PodPhase.RUNNING, PodPhase.UNKNOWN) and not p.deleted for p in d.pods):
        return False  # told the training is done, they are exiting
    message = f"TrainingJob {d.job_id} successfully completed."
    d.status.finish(JobPhase.SUCCEEDED, "TrainingJobSucceeded", message)
    d.events.append(Event("Succeeded", message))
    cleanup(d, succeeded=True)
    ttl(d)
    return True


def export_failed(d: Draft) -> bool:
    """The coordinator gave up on an export the output refused every attempt: Failed, reason
    ExportFailed, with its message (what, where, the last error, the checkpoints kept). The running
    replicas are stopped whatever ``cleanPodPolicy`` says: they have nothing left to do."""
    coordinator = d.obs.coordinator
    if coordinator is None or not coordinator.export_error:
        return False
    return fail(d, "ExportFailed", f"TrainingJob {d.job_id}: {coordinator.export_error}", stop_running=True)


def unrecoverable(d: Draft) -> bool:
    """The coordinator cannot bring the PS shards to one version (a storage fault left no
    checkpoint version every shard and the ledger can read): Failed, reason ShardsUnrecoverable,
    with its message naming the shards and their files; the running replicas are stopped."""
    coordinator = d.obs.coordinator
    if coordinator is None or not coordinator.unrecoverable:
        return False
    return fail(d, SHARDS_UNRECOVERABLE, f"TrainingJob {d.job_id}: {coordinator.unrecoverable}", stop_running=True)


def cleanup(d: Draft, *, succeeded: bool, stop_running: bool = False) -> None:
    """The replicas a finished job deletes, per ``cleanPodPolicy`` (see the rules in ``plan``)."""
    policy = d.job.spec.run_policy.clean_pod_policy
    if not succeeded and d.status.condition_reason(JobPhase.FAILED.value) in ("DeadlineExceeded", "ExportFailed", SHARDS_UNRECOVERABLE):
        stop_running = True
    for pod in d.pods:
        if pod.deleted:
            continue
        running = pod.phase in RUNNING_PHASES
        if policy is CleanPodPolicy.ALL or (running and (succeeded or stop_running or policy is CleanPodPolicy.RUNNING)):
            why = "the job succeeded" if succeeded else "the job failed"
            d.deletes.append(DeleteReplica(pod.name, f"{why} (cleanPodPolicy {policy.value})"))


def ttl(d: Draft) -> None:
    """``ttlSecondsAfterFinished`` past since ``completionTime``: delete the job (else recheck then)."""
    limit = d.job.spec.run_policy.ttl_seconds_after_finished
    done = d.status.completion_time
    if limit < 0 or done is None:
        return
    if d.now - done >= limit:
        d.delete_job = True
    else:
        d.rechecks.append(done + limit - d.now)
