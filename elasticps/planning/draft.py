"""One planner pass under way: what it observed and what it will do, gathered by the rules.

Callers: ``plan`` creates a :class:`Draft` per pass and hands it to each rule module in turn
(``ends``, ``suspension``, ``failures``, ``stuck``, ``scaling``, ``phase``, ``training``); they
append deletes, creates, Events and rechecks, and edit the
:class:`~elasticps.planning.status.StatusDraft`. At the end :meth:`Draft.actions` puts them in the
order every executor carries them out.
"""

from __future__ import annotations

from typing import Any

from elasticps.api.replicas import Role
from elasticps.api.spec import TrainingJob
from elasticps.planning.actions import Action, DeleteJob, DeleteReplica, Event, Recheck, SetStatus
from elasticps.planning.observed import Observed, ObservedPod
from elasticps.planning.roles import desired
from elasticps.planning.settings import PlannerSettings, ReplicaCheck
from elasticps.planning.status import StatusDraft


class Draft:
    def __init__(
        self, job: TrainingJob, observed: Observed, settings: PlannerSettings, check: ReplicaCheck | None
    ) -> None:
        self.job, self.obs, self.settings, self.check = job, observed, settings, check
        self.now = observed.now
        self.status = StatusDraft(observed.status, observed.now)
        self.restarts_before = self.status.restarts
        # PS replicas first, then workers, each by index: rules judge them in this order.
        self.pods: list[ObservedPod] = sorted(observed.pods, key=lambda p: (p.role is Role.WORKER, p.index, p.name))
        self.by_name = {p.name: p for p in self.pods}
        self.deletes: list[DeleteReplica] = []
        self.creates: list[Action] = []
        self.events: list[Event] = []
        self.rechecks: list[float] = []
        self.delete_job = False

    def desired(self, role: Role) -> int:
        """The replicas of ``role`` the job wants now: its spec's, never more than its queue admitted."""
        wanted = desired(self.job, role)
        admission = self.obs.admission
        if admission is not None and admission.admitted:
            return min(wanted, admission.counts.get(role, wanted))
        return wanted

    @property
    def job_id(self) -> str:
        return f"{self.job.namespace}/{self.job.name}"

    def actions(self, observed_fields: dict[str, Any]) -> list[Action]:
        """The pass's actions in the executors' order; ``observed_fields`` join the status patch."""
        deletes: dict[str, DeleteReplica] = {}
        for delete in self.deletes:
            deletes.setdefault(delete.name, delete)  # one per replica, with the first reason
        actions: list[Action] = [*deletes.values(), *self.creates, *self.events]
        patch = self.status.patch(observed_fields)
        if patch:
            actions.append(SetStatus(patch))
        if self.delete_job:
            actions.append(DeleteJob())
        elif self.rechecks:
            actions.append(Recheck(max(1.0, min(self.rechecks))))
        return actions
