"""What the training loss says, as the coordinator judged it: condition TrainingHealthy, and a
failed job where the spec asks for it.

Callers: ``plan`` (rule 5 of its list), on the coordinator's answer only (a silent one leaves the
condition as it was). The coordinator (``coordinator/health.py``) reports Diverged (a loss that is
not finite, or ten times its first values) or Stalled (not below its first values after
``spec.training.stallEpochs`` epochs of records). Then:
- TrainingHealthy False, the verdict as reason, the coordinator's words as message, and a Warning
  Event as it turns False; True again (reason Learning, a Normal Event) once the loss falls. A job
  that was never judged unhealthy has no such condition.
- ``spec.training.failUnhealthy``: the job fails with that reason instead (its coordinator hands
  out no more tasks, so no final export of a useless model); running replicas are stopped.
"""

from __future__ import annotations

from elasticps.planning.actions import Event
from elasticps.planning.draft import Draft
from elasticps.planning.ends import fail
from elasticps.planning.status import TRAINING_HEALTHY

LEARNING = "Learning"


def unhealthy(d: Draft) -> bool:
    """Sets TrainingHealthy from the coordinator's verdict; True when the job failed on it."""
    progress = d.obs.coordinator
    if progress is None:
        return False
    status = d.status
    if not progress.health:
        if status.has(TRAINING_HEALTHY) and not status.is_true(TRAINING_HEALTHY):
            message = "The training loss falls again."
            status.set(TRAINING_HEALTHY, True, LEARNING, message)
            d.events.append(Event(LEARNING, message))
        return False
    message = progress.health_message or progress.health
    if d.job.spec.training.fail_unhealthy:
        return fail(d, progress.health, f"{message} (spec.training.failUnhealthy)", stop_running=True)
    if status.is_true(TRAINING_HEALTHY) or not status.has(TRAINING_HEALTHY):
        d.events.append(Event(progress.health, message, "Warning"))
    status.set(TRAINING_HEALTHY, False, progress.health, message)
    return False
