"""A TrainingJob's ``.status`` as one planner pass reads, edits and writes it back: pure.

Callers: the planner's rules (through ``draft``); the operator (times in Events); the local
runner, which keeps the job's ``.status`` in memory and applies each ``SetStatus`` patch with
:func:`apply_merge_patch`. :class:`StatusDraft` parses what earlier passes wrote (tolerating
anything, so a hand-edited status never crashes the operator), keeps the conditions with Kubeflow's
rules (one entry per type; ``lastTransitionTime`` moves when ``status`` changes, ``lastUpdateTime``
when status, reason or message do) and ends as a JSON merge patch holding only what changed.
Every key written here is declared in the CRD (``elasticps.api.schema.status_schema``), so the
API server prunes none of it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from elasticps.api.spec import JobPhase

# What the coordinator reports: kept from the previous status while PS 0 does not answer.
COORDINATOR_KEYS = (
    "modelVersion", "epoch", "progress", "metrics", "shardVersions", "liveWorkers", "gradsToWait", "output",
    "predictions",
)


# Conditions a person should see at a glance while the job is not finished, in this state (the
# first found is shown).
TRAINING_HEALTHY = "TrainingHealthy"
ATTENTION = (
    ("CannotStart", "True"), ("Unschedulable", "True"), (TRAINING_HEALTHY, "False"), (JobPhase.RESTARTING.value, "True"),
)


def wanted(workers: object) -> int | None:
    """The wanted count of a reported ``workers`` field ("ready/wanted"); None when there is none."""
    if not isinstance(workers, str) or "/" not in workers:
        return None
    text = workers.rsplit("/", 1)[1]
    return int(text) if text.isdigit() else None


class StatusDraft:
    """The job's status as read, edited by one pass, and diffed into a merge patch at the end."""

    def __init__(self, raw: Mapping[str, Any], now: float) -> None:
        self.raw = raw
        self.now = now
        self.stamp = rfc3339(now)
        try:
            self.phase: JobPhase | None = JobPhase(raw.get("phase"))
        except ValueError:
            self.phase = None
        items = raw.get("conditions")
        self.conditions: list[dict[str, Any]] = [
            dict(c) for c in (items if isinstance(items, list) else []) if isinstance(c, dict) and "type" in c
        ]
        restarts = raw.get("restarts")
        self.restarts = restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else 0
        self.replacing: dict[str, str] = {}
        replacing = raw.get("replacing")
        for item in replacing if isinstance(replacing, list) else []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                self.replacing[item["name"]] = str(item.get("uid") or "")
        self.start_time = parse_time(raw.get("startTime"))
        self.completion_time = parse_time(raw.get("completionTime"))
        self.workers_wanted = wanted(raw.get("workers"))  # as the last pass reported it

    # conditions
    def _find(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == kind), None)

    def has(self, kind: str) -> bool:
        return self._find(kind) is not None

    def is_true(self, kind: str) -> bool:
        found = self._find(kind)
        return found is not None and found.get("status") == "True"

    def condition_reason(self, kind: str) -> str:
        found = self._find(kind)
        return str(found.get("reason", "")) if found is not None else ""

    def condition_message(self, kind: str) -> str:
        found = self._find(kind)
        return str(found.get("message", "")) if found is not None else ""

    def set(self, kind: str, true: bool, reason: str, message: str) -> None:
        value = "True" if true else "False"
        found = self._find(kind)
        if found is None:
            self.conditions.append(
                {
                    "type": kind,
                    "status": value,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": self.stamp,
                    "lastUpdateTime": self.stamp,
                }
            )
            return
        if found.get("status") != value:
            found["lastTransitionTime"] = self.stamp
        if (found.get("status"), found.get("reason"), found.get("message")) != (value, reason, message):
            found.update(status=value, reason=reason, message=message, lastUpdateTime=self.stamp)

    def set_if_present(self, kind: str, true: bool, reason: str, message: str) -> None:
        found = self._find(kind)
        if found is not None and found.get("status") != ("True" if true else "False"):
            self.set(kind, true, reason, message)

    def finish(self, phase: JobPhase, reason: str, message: str) -> None:
        self.set(phase.value, True, reason, message)
        for kind in (JobPhase.RUNNING.value, JobPhase.RESTARTING.value):
            self.set_if_present(kind, False, reason, message)
        self.phase = phase
        self.completion_time = self.now
        self.replacing.clear()

    def fail(self, reason: str, message: str) -> None:
        self.finish(JobPhase.FAILED, reason, message)

    # the patch
    def patch(self, observed_fields: dict[str, Any]) -> dict[str, Any]:
        """The merge patch of ``.status``: this pass's edits plus ``observed_fields`` (counts, progress)."""
        desired = {key: self.raw[key] for key in COORDINATOR_KEYS if key in self.raw}
        desired.update(observed_fields)
        if self.phase is not None:
            desired["phase"] = self.phase.value
        desired["conditions"] = self.conditions
        desired["restarts"] = self.restarts
        desired["replacing"] = [{"name": n, "uid": u} if u else {"name": n} for n, u in sorted(self.replacing.items())]
        if self.start_time is not None:
            desired["startTime"] = rfc3339(self.start_time)
        if self.completion_time is not None:
            desired["completionTime"] = rfc3339(self.completion_time)
        reason, message = self.headline()
        for key, value in (("reason", reason), ("message", message)):
            if value or key in self.raw:
                desired[key] = value or None  # None: the merge patch deletes it
        return merge_patch(self.raw, desired)

    def headline(self) -> tuple[str, str]:
        """``status.reason`` and ``status.message``, what ``kubectl get tj`` shows beside the phase: a
        failed job's condition; else the first of ATTENTION in the state that needs one (a job that
        succeeded while its loss said Diverged or Stalled shows that); none while all is well."""
        if self.phase is JobPhase.FAILED:
            attention: tuple[tuple[str, str], ...] = ((JobPhase.FAILED.value, "True"),)
        elif self.phase is JobPhase.SUCCEEDED:
            attention = ((TRAINING_HEALTHY, "False"),)
        else:
            attention = ATTENTION
        for kind, state in attention:
            found = self._find(kind)
            if found is not None and found.get("status") == state:
                return str(found.get("reason", "")), str(found.get("message", ""))
        return "", ""


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new`` for the keys of ``new``.

    Keys of ``old`` that ``new`` lacks are left alone at the top level (another writer's, e.g.
    kopf's), and deleted (``None``) inside nested mappings, which ``new`` owns whole.
    """
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            inner.update({k: None for k in before if k not in value})
            if inner:
                patch[key] = inner
        elif before != value or key not in old:
            patch[key] = value
    return patch


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7386), as the API server does it:
    ``None`` deletes a key, mappings merge key by key, anything else replaces. Neither is changed."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def rfc3339(t: float) -> str:
    """Epoch seconds as Kubernetes writes times (``2024-05-01T12:00:00Z``, whole seconds)."""
    return datetime.fromtimestamp(math.floor(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
