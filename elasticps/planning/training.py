"""What PS 0's coordinator says of the training itself: whether the PS shards agree, whether a
sync job's rounds average fewer gradients than ``gradsToWait`` asks for, and what was rolled back.

Callers: ``plan`` (rule 13 of its list), once the other rules let the job go on. Three condition
types beside the phases, each decided only on an answer from the coordinator (a silent one leaves
them as they were):
- ShardsConsistent: True (reason ShardsAgree) while the shards report their versions and no
  problem; False (reason ShardsDisagree, the coordinator's message) when it reports one. A Warning
  Event when it turns False, a Normal one when it turns True again.
- GradsToWaitClamped: True (reason FewerLiveWorkers) while a sync job's explicit ``gradsToWait``
  is above its live workers, so every round averages fewer gradients (``progress.SyncRounds``),
  with an Event when it starts; False (reason GradsToWaitMet) once it is no longer, and absent in
  a job that never was.
- RolledBack: True with the coordinator's words for its latest rollback (a PS restored from an
  older checkpoint or restarted empty: from and to which version, the records to train again), a
  Warning Event for each new one.
A job without PS (``spec.strategy: decentralized``) has none of them. None changes the phase or
fails the job: the coordinator and the PS act on them, the planner reports them.
"""

from __future__ import annotations

from elasticps.planning.actions import Event
from elasticps.planning.draft import Draft
from elasticps.planning.observed import JobProgress
from elasticps.planning.progress import SyncRounds, sync_rounds

SHARDS_CONSISTENT = "ShardsConsistent"
SHARDS_AGREE = "ShardsAgree"
SHARDS_DISAGREE = "ShardsDisagree"
GRADS_TO_WAIT_CLAMPED = "GradsToWaitClamped"
FEWER_LIVE_WORKERS = "FewerLiveWorkers"
GRADS_TO_WAIT_MET = "GradsToWaitMet"
ROLLED_BACK = "RolledBack"
CHECKPOINT_FAILING = "CheckpointFailing"
CHECKPOINTS_WRITTEN = "CheckpointsWritten"


def training(d: Draft) -> None:
    progress = d.obs.coordinator
    if progress is None:
        return
    shards(d, progress)
    rounds(d, sync_rounds(d.job, progress))
    rolled_back(d, progress)
    checkpoints(d, progress)


def checkpoints(d: Draft, progress: JobProgress) -> None:
    """A shard whose checkpoint writes fail (a full disk, a read-only volume): condition
    CheckpointFailing True with the shards' words and a Warning Event when it starts failing
    (the message follows the latest failure); False again, reason CheckpointsWritten, once every
    shard writes again. Training goes on either way: a failure only makes the next rollback go
    further back."""
    status = d.status
    message = progress.checkpoint_failure
    if message:
        if not status.is_true(CHECKPOINT_FAILING):
            d.events.append(Event(CHECKPOINT_FAILING, message, "Warning"))
        status.set(CHECKPOINT_FAILING, True, CHECKPOINT_FAILING, message)
    elif status.is_true(CHECKPOINT_FAILING):
        written = "Every PS shard writes its checkpoints again."
        d.events.append(Event(CHECKPOINTS_WRITTEN, written))
        status.set(CHECKPOINT_FAILING, False, CHECKPOINTS_WRITTEN, written)


def rolled_back(d: Draft, progress: JobProgress) -> None:
    """A rollback is never silent: the coordinator's words for its latest one (from and to which
    version, the records to train again) as condition RolledBack and a Warning Event, once each."""
    message = progress.last_rollback
    if not message or d.status.condition_message(ROLLED_BACK) == message:
        return
    d.events.append(Event(ROLLED_BACK, message, "Warning"))
    d.status.set(ROLLED_BACK, True, ROLLED_BACK, message)


def shards(d: Draft, progress: JobProgress) -> None:
    status = d.status
    if not d.job.uses_ps:
        return  # no shards to agree: a decentralized job's coordinator stands in for none
    if progress.shard_problem:
        if status.is_true(SHARDS_CONSISTENT) or not status.has(SHARDS_CONSISTENT):
            d.events.append(Event(SHARDS_DISAGREE, progress.shard_problem, "Warning"))
        status.set(SHARDS_CONSISTENT, False, SHARDS_DISAGREE, progress.shard_problem)
        return
    if not progress.shard_versions:
        return  # a coordinator that does not report its shards says nothing of them
    message = shards_agree_message(len(progress.shard_versions))
    if status.has(SHARDS_CONSISTENT) and not status.is_true(SHARDS_CONSISTENT):
        d.events.append(Event(SHARDS_AGREE, message))
    status.set(SHARDS_CONSISTENT, True, SHARDS_AGREE, message)


def shards_agree_message(count: int) -> str:
    return "The PS shard holds the model." if count == 1 else f"The {count} PS shards agree on the model."


def rounds(d: Draft, sync: SyncRounds | None) -> None:
    status = d.status
    if sync is not None and sync.live_workers == 0:
        return  # the coordinator does not know its workers (yet): nothing to judge
    if sync is None or not sync.clamped:
        if status.is_true(GRADS_TO_WAIT_CLAMPED):
            status.set(GRADS_TO_WAIT_CLAMPED, False, GRADS_TO_WAIT_MET, grads_met_message(sync))
        return
    message = clamped_message(sync)
    if not status.is_true(GRADS_TO_WAIT_CLAMPED):
        d.events.append(Event(GRADS_TO_WAIT_CLAMPED, message))
    status.set(GRADS_TO_WAIT_CLAMPED, True, FEWER_LIVE_WORKERS, message)


def clamped_message(sync: SyncRounds) -> str:
    """E.g. ``gradsToWait 4 is above the 2 live workers: rounds average 2 gradients``."""
    workers = "live worker" if sync.live_workers == 1 else "live workers"
    gradients = "gradient" if sync.averaged == 1 else "gradients"
    return (
        f"gradsToWait {sync.requested} is above the {sync.live_workers} {workers}: "
        f"rounds average {sync.averaged} {gradients}"
    )


def grads_met_message(sync: SyncRounds | None) -> str:
    if sync is None:
        return "The job is async: no round waits for gradients."
    if sync.requested == 0:
        return "gradsToWait 0: rounds average one gradient per live worker."
    return f"gradsToWait {sync.requested}: rounds average {sync.averaged} gradients."
