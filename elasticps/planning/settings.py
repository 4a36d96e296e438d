"""How a planner pass is tuned by its executor: pure data and one optional pure callback.

Callers: the operator (``OperatorConfig.planner``, from ``--pending_timeout``; its render check
from ``rendering``) and the local runner (no pending timeout: processes are never unschedulable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from elasticps.api.replicas import Role
from elasticps.api.spec import TrainingJob


@dataclass(frozen=True)
class PlannerSettings:
    pending_timeout_s: float | None = 600.0  # a stuck pod fails the job after this; None: never


class ReplicaCheck(Protocol):
    """Why the executor could not render replica ``index`` of ``role`` (e.g. a pod template of the
    wrong shape), or None when it can. Must be pure: the planner calls it for each replica it is
    about to create, and fails the job (reason InvalidSpec, the returned message) on the first
    problem, before creating anything in that pass."""

    def __call__(self, job: TrainingJob, role: Role, index: int) -> str | None: ...
