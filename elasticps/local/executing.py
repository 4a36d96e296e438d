"""Carries out one pass's actions on this machine: replicas become process starts and stops, the
status patch lands in the job's in-memory ``.status``.

Callers: the local runner, with the actions of ``planning.plan.plan``, in the order they come
(deletes, creates with PS first, Events, the status patch). What has no meaning here is skipped
by design, not forgotten:

- ``CreateReplicaService`` and ``CreateIngressPolicy``: processes dial 127.0.0.1 ports (a PS keeps
  its port across restarts instead of a Service) and nothing else can reach them (the runner also
  tells the planner it observes no Services or policies, so it asks for none);
- ``DeleteJob`` (``ttlSecondsAfterFinished``): there is no object to delete; the run simply ends;
- ``Recheck``: the runner plans again every half second anyway.

``cleanPodPolicy`` needs nothing here either: the runner ends once the job is Succeeded or Failed
and stops every process then, so no replica outlives the run whatever the policy says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elasticps.api.spec import TrainingJob
from elasticps.local.fleet import Fleet
from elasticps.planning.actions import Action, CreateReplica, DeleteReplica, Event, SetStatus
from elasticps.planning.status import apply_merge_patch


def execute(
    actions: Sequence[Action], job: TrainingJob, fleet: Fleet, status: dict[str, Any]
) -> tuple[dict[str, Any], list[Event]]:
    """The job's status after the pass, and the pass's Events (for the person watching)."""
    events: list[Event] = []
    for action in actions:
        if isinstance(action, DeleteReplica):
            fleet.delete(action.name)
        elif isinstance(action, CreateReplica):
            fleet.create(job, action.name, action.role, action.index)
        elif isinstance(action, SetStatus):
            status = apply_merge_patch(status, action.status)
        elif isinstance(action, Event):
            events.append(action)
    return status, events
