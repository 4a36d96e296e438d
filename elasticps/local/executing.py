"""Carries out one pass's actions on this machine: replicas become process starts and stops, the
status patch lands in the job's in-memory ``.status``, and what a person should hear becomes lines.

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

The lines for a person: each replacement the pass began, as ``elasticps run`` has always said it
(``NAME exited with code N: replacing it (replacement k of at most L)``; a replacement is a delete
of an exited replica that the status now lists in ``replacing``), and the planner's Events except
those the run's own output already says (created, running, succeeded, the replacement itself, the failure
that ends it: its last line), a Warning one as ``warning: REASON: message``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elasticps.api.spec import JobPhase, TrainingJob
from elasticps.local.fleet import Fleet
from elasticps.planning.actions import Action, CreateReplica, DeleteReplica, Event, SetStatus
from elasticps.planning.status import apply_merge_patch

QUIET = ("Created", "Succeeded", "Restarting", "Running")  # the progress lines say these


def execute(
    actions: Sequence[Action], job: TrainingJob, fleet: Fleet, status: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The job's status after the pass, and what to tell the person watching."""
    before = status
    exited: dict[str, int] = {}  # the replicas deleted after they exited, with their exit codes
    events: list[Event] = []
    for action in actions:
        if isinstance(action, DeleteReplica):
            slot = fleet.slots.get(action.name)
            code = None if slot is None or slot.process is None else slot.process.exit_code
            if code is not None:
                exited[action.name] = code
            fleet.delete(action.name)
        elif isinstance(action, CreateReplica):
            fleet.create(job, action.name, action.role, action.index)
        elif isinstance(action, SetStatus):
            status = apply_merge_patch(status, action.status)
        elif isinstance(action, Event):
            events.append(action)
    lines = _replacements(exited, before, status, job.spec.run_policy.backoff_limit)
    # The event of the job's end is the run's last line already (the runner says why it failed).
    failed = JobPhase.FAILED.value
    ended = next((str(c.get("reason")) for c in status.get("conditions", []) if c.get("type") == failed
                  and c.get("status") == "True" and before.get("phase") != failed), None)  # fmt: skip
    said = [e for e in events if e.reason not in QUIET and e.reason != ended]
    return status, lines + [f"warning: {e.reason}: {e.message}" if e.type == "Warning" else e.message for e in said]


def _replacements(exited: dict[str, int], before: dict[str, Any], after: dict[str, Any], limit: int) -> list[str]:
    begun = _replacing(after) - _replacing(before)
    count = before.get("restarts", 0) if isinstance(before.get("restarts"), int) else 0
    lines = []
    for name, code in exited.items():  # in the planner's order, the order it counted them
        if name in begun:
            count += 1
            lines.append(f"{name} exited with code {code}: replacing it (replacement {count} of at most {limit})")
    return lines


def _replacing(status: dict[str, Any]) -> set[str]:
    items = status.get("replacing")
    return {str(i["name"]) for i in items if isinstance(i, dict) and "name" in i} if isinstance(items, list) else set()
