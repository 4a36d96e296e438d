"""Workers brought back when records return after they finished: a job never waits for nobody.

Callers: ``plan`` (rule 10 of its list). A worker exits 0 once PS 0's coordinator says the job is
finished. A PS shard that restarts after that from an older checkpoint rolls every shard and the
task ledger back to that version (``coordinator/watching.py``): the records trained since go back
into the queue, and the coordinator no longer says finished. With every worker gone nobody would
train them, so the workers that exited 0 are deleted here and created again by the scaling rule of
a later pass, once they are gone (no restart counted: nothing failed), with a ``Retraining`` event.
Only the coordinator's own answer triggers it (not finished: records, or the final evaluation or
export, to do again), and only once no worker runs: a worker still running takes the work itself.
"""

from __future__ import annotations

from elasticps.api.replicas import Role
from elasticps.planning.actions import DeleteReplica, Event
from elasticps.planning.draft import Draft
from elasticps.planning.observed import RUNNING_PHASES, PodPhase


def retrain(d: Draft) -> None:
    progress = d.obs.coordinator
    if progress is None or progress.finished or not d.job.uses_ps:
        return
    workers = [p for p in d.pods if p.role is Role.WORKER and p.index < d.desired(Role.WORKER)]
    if any(p.phase in RUNNING_PHASES for p in workers):
        return
    done = [p for p in workers if p.phase is PodPhase.SUCCEEDED and not p.deleted]
    if not done:
        return
    names = ", ".join(p.name for p in done)
    for pod in done:
        d.deletes.append(DeleteReplica(pod.name, "records to train again after a rollback"))
    d.events.append(
        Event(
            "Retraining",
            f"Work went back to the queue after the workers finished (a rollback to model version "
            f"{progress.version}, {progress.progress:.0%} of the records done): starting {names} again.",
            "Warning",
        )
    )
