"""Failed replicas: judged by their role's restart policy and the backoff limit, replaced in two passes.

A replica that exited with USER_ERROR (2: a mistake in the job's input, said in one line) fails the
job at once, under any policy, with that line as the reason (``UserError``): a replacement would
fail the same way.

Callers: ``plan`` (rule 8 of its list). A replacement keeps the replica's name: this pass deletes
the failed one, counts one restart and records it in ``status.replacing`` (with its uid, when the
executor gives one); a later pass, once the old one is gone, creates it again (``scaling``) and
drops it from ``replacing``. A status patch lost in between never counts a failure twice.
"""

from __future__ import annotations

from elasticps.api.replicas import USER_ERROR, should_restart
from elasticps.planning.actions import DeleteReplica, Event
from elasticps.planning.draft import Draft
from elasticps.planning.ends import fail
from elasticps.planning.observed import RUNNING_PHASES, ObservedPod, PodPhase
from elasticps.planning.roles import role_spec


def failures(d: Draft) -> bool:
    """Replacements for the replicas that ended, or Failed (True) when one may not be replaced."""
    limit = d.job.spec.run_policy.backoff_limit
    for pod in d.pods:
        if pod.index >= d.desired(pod.role):
            continue  # being scaled down
        if pod.name in d.status.replacing and still_replacing(d, pod):
            continue
        if pod.deleted or pod.phase in RUNNING_PHASES:
            continue
        policy = role_spec(d.job, pod.role).restart_policy
        code = pod.exit_code if pod.exit_code is not None else (0 if pod.phase is PodPhase.SUCCEEDED else -1)
        how = f"exit code {code}" if pod.exit_code is not None else (pod.reason or "no exit code")
        if code == USER_ERROR:
            # The replica's own line (exits.py): said once, as the job's reason.
            message = pod.message or f"{pod.name} failed (exit code {code}: a mistake in its input)"
            return fail(d, "UserError", message, stop_running=True)
        if not should_restart(policy, code):
            if pod.phase is PodPhase.SUCCEEDED:
                continue  # a clean exit the policy leaves be
            message = f"{pod.name} failed ({how}); restartPolicy {policy.value} does not replace it."
            return fail(d, "ReplicaFailed", message)
        if d.status.restarts >= limit:
            message = f"{pod.name} failed ({how}) after {d.status.restarts} pod replacements (backoffLimit {limit})."
            return fail(d, "BackoffLimitExceeded", message)
        d.status.restarts += 1
        d.status.replacing[pod.name] = pod.uid
        d.deletes.append(DeleteReplica(pod.name, f"replacing it: {how} (restartPolicy {policy.value})"))
        d.events.append(
            Event(
                "Restarting",
                f"{pod.name} exited ({how}): replacing it (restart {d.status.restarts} of at most {limit}).",
                "Warning",
            )
        )
    return False


def still_replacing(d: Draft, pod: ObservedPod) -> bool:
    """Whether ``pod`` is the old replica of a replacement under way (else: the replacement itself)."""
    old_uid = d.status.replacing[pod.name]
    is_old = (pod.uid == old_uid) if (pod.uid and old_uid) else pod.phase not in RUNNING_PHASES
    if not is_old:
        del d.status.replacing[pod.name]  # created by a pass whose status patch was lost
        return False
    if not pod.deleted:
        d.deletes.append(DeleteReplica(pod.name, "replacing it"))  # the earlier delete did not land
    return True
