"""The planner's entry points: ``plan(job, observed, settings, check) -> actions``, ``plan_invalid``.

Callers: both executors, once per pass. The operator (``elasticps.operator.reconciling``) lists the
job's pods and Services, asks PS 0's coordinator for progress, plans, renders the actions to
Kubernetes objects and patches status once; the local runner (``elasticps.local.runner``) observes
its processes, plans and starts or stops processes, keeping ``.status`` in memory. Nothing here
talks to Kubernetes, processes or the network, so every rule below is a table-driven unit test
(``tests/operator_planning``). A pass is idempotent: the same observation gives the same actions,
and a replica that exists (even one being deleted) is never created again.

Rules, in the order a pass applies them (the first that ends the job wins); the modules named
implement them:
1. Finished (status.phase Succeeded or Failed): only clean up replicas per ``cleanPodPolicy``, tell
   the job's queue it ended (``admission``) and, when ``ttlSecondsAfterFinished`` has passed since
   ``completionTime``, ``DeleteJob`` (``ends``).
2. First pass: condition Created, ``startTime``.
3. ``runPolicy.suspend``: delete every replica (no restart counted), condition Suspended. Unsetting
   it resumes: Suspended turns False, ``startTime`` restarts (the deadline counts from the resume),
   the replicas are created again (the PS restore from their checkpoint) (``suspension``).
3a. A job its executor queues (Kueue, ``Observed.admission``): it asks its queue once and runs no
   replica until admitted (phase Queued, condition Queued says why); admitted, it runs at most the
   replicas the queue admitted; evicted, its replicas are deleted (condition Suspended) and its quota
   given back once they are gone, and it is queued again (``admission``).
4. ``activeDeadlineSeconds`` past since ``startTime``: Failed, reason DeadlineExceeded; running
   replicas are stopped whatever ``cleanPodPolicy`` says (a deadline is there to stop spending).
5. What the training loss says, on the coordinator's answer: condition TrainingHealthy False
   (reason Diverged or Stalled, a Warning Event) or True again (reason Learning); Failed with that
   reason under ``spec.training.failUnhealthy``, running replicas stopped (``health``).
6. The coordinator says the training is finished and no worker is still running: Succeeded,
   ``completionTime``. PS replicas never exit on their own, so every replica still pending or
   running is deleted on success, whatever the policy; ``All`` also deletes the finished ones
   (``None`` and ``Running`` keep them, and their logs) (``ends``).
7. The coordinator gave up on an export (the output refused it every attempt): Failed, reason
   ExportFailed, with the coordinator's message (where, the last error, the checkpoints kept);
   or it cannot bring the PS shards to one version (no checkpoint version every shard and the
   ledger can read): Failed, reason ShardsUnrecoverable, naming the shards and their files;
   running replicas are stopped, as for a deadline (``ends``).
8. A replica that exited 2 (a mistake in the job's input, said in its own line): Failed at once,
   reason UserError, that line as the message, under any restartPolicy. Any other replica that
   failed (or exited 0 under ``Always``) is judged by its role's restartPolicy
   (``replicas.should_restart``; a failure without an exit code, e.g. an eviction, counts as a
   signal): not restartable -> Failed, reason ReplicaFailed; ``status.restarts`` already at
   ``backoffLimit`` -> Failed, reason BackoffLimitExceeded; otherwise it is replaced under the same
   name in two passes: this pass deletes it, counts one restart and records it in
   ``status.replacing``; a later pass, once the old replica is gone, creates it again and drops it
   from ``replacing``. A job that fails applies ``cleanPodPolicy`` (None keeps every replica)
   (``failures``).
9. A pending pod the scheduler cannot place: condition Unschedulable at once, with the scheduler's
   message; Failed (reason Unschedulable) after ``settings.pending_timeout_s``. A pod whose
   container cannot start (image pull, bad config): condition CannotStart at once, with the
   kubelet's reason and message; Failed with that reason after the same time (``stuck``).
10. Work that went back to the queue after every worker exited 0 (a PS restored from an older
   checkpoint after the job's end rolled the ledger back): those workers are deleted and created
   again by the next rule on a later pass, no restart counted, a Retraining event (``retraining``).
11. Scaling: replicas above ``spec.<role>.replicas`` are deleted, highest index first; missing
   replicas are created, and, when the strategy has PS replicas, their Services and the job's
   ingress policy ``{job}-ps`` where the executor observes such things (``Observed.services`` /
   ``network_policies`` None leaves them alone: the local runner has neither, and an operator
   without RBAC for NetworkPolicies still runs jobs). Neither touches the other replicas nor the
   restart count. A replica the executor's render check refuses fails the job, reason InvalidSpec,
   before anything is created (``scaling``).
12. Phase: Restarting from a replacement's delete until every desired replica runs again (or exited
   0); otherwise Running once every PS (none without a PS strategy) and at least one worker run
   (an elastic job trains on what it has) (``phase``).
13. What the coordinator says of the training, on its answer only: condition ShardsConsistent
   (False, reason ShardsDisagree with the coordinator's message, when the PS shards disagree or
   lost their model; a Warning Event as it turns False, a Normal one as it recovers), and
   condition GradsToWaitClamped (True while a sync job's explicit ``gradsToWait`` is above its live
   workers, with an Event as it starts) (``training``).

Conditions are Kubeflow's (Created, Running, Restarting, Succeeded, Suspended, Failed, plus
Unschedulable, CannotStart, ShardsConsistent, GradsToWaitClamped and TrainingHealthy): one entry per type; ``lastTransitionTime`` changes when ``status``
does, ``lastUpdateTime`` when status, reason or message do. Running and Restarting exclude each
other; Succeeded and Failed turn both False. ``SetStatus`` carries a JSON merge patch of
``.status`` that holds only what changed (``None`` deletes a key), and is left out when nothing
did (``status``). Every patch also reports counts and progress (``reporting``).
"""

from __future__ import annotations

from elasticps.api.spec import JobPhase, TrainingJob
from elasticps.planning import admission
from elasticps.planning.actions import Action, Event, SetStatus
from elasticps.planning.draft import Draft
from elasticps.planning.ends import cleanup, export_failed, past_deadline, succeeded, ttl, unrecoverable
from elasticps.planning.failures import failures
from elasticps.planning.health import unhealthy
from elasticps.planning.observed import Observed
from elasticps.planning.phase import phase
from elasticps.planning.reporting import observed_fields
from elasticps.planning.retraining import retrain
from elasticps.planning.scaling import create_missing, scale_down
from elasticps.planning.settings import PlannerSettings, ReplicaCheck
from elasticps.planning.status import StatusDraft
from elasticps.planning.stuck import stuck
from elasticps.planning.suspension import resume_if_suspended, suspend
from elasticps.planning.training import training


def plan(
    job: TrainingJob,
    observed: Observed,
    settings: PlannerSettings = PlannerSettings(),
    check: ReplicaCheck | None = None,
) -> list[Action]:
    """The actions that move the job's replicas towards ``job``, given what was observed."""
    d = Draft(job, observed, settings, check)
    _apply_rules(d)
    return d.actions(observed_fields(d))


def _apply_rules(d: Draft) -> None:
    status = d.status
    if status.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):  # 1
        cleanup(d, succeeded=status.phase is JobPhase.SUCCEEDED)
        admission.finished(d)
        ttl(d)
        return
    if not status.has(JobPhase.CREATED.value):  # 2
        message = f"TrainingJob {d.job_id} is created."
        status.set(JobPhase.CREATED.value, True, "TrainingJobCreated", message)
        status.phase = JobPhase.CREATED
        status.start_time = d.now
        d.events.append(Event("Created", message))
    if status.start_time is None:
        status.start_time = d.now
    if d.job.spec.run_policy.suspend:  # 3
        suspend(d)
        return
    if not admission.gate(d):  # 3a
        return
    resume_if_suspended(d)
    if past_deadline(d) or unhealthy(d) or succeeded(d) or export_failed(d) or unrecoverable(d) or failures(d) or stuck(d):  # 4-9
        return
    retrain(d)  # 10
    scale_down(d)  # 11
    if create_missing(d):
        phase(d)  # 12
        training(d)  # 13


def plan_invalid(observed: Observed, message: str) -> list[Event | SetStatus]:
    """A job whose spec cannot be parsed (``SpecError``): Failed, reason InvalidSpec, nothing created."""
    status = StatusDraft(observed.status, observed.now)
    if status.phase is JobPhase.FAILED:
        return []
    status.fail("InvalidSpec", message)
    patch = status.patch({})
    return [Event("InvalidSpec", message, "Warning"), *([SetStatus(patch)] if patch else [])]
