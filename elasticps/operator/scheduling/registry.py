"""The built-in scheduling policies, one per value of ``spec.scheduling.policy``.

A new integration is a module beside this one (a class with ``pod`` and ``groups``) and its entry
here, under a new member of ``api.spec.SchedulingPolicy``. ``rendering.Renderer`` takes another
mapping where a test brings its own policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from elasticps.api.spec import SchedulingPolicy, TrainingJob
from elasticps.operator.scheduling.coscheduling import Coscheduling
from elasticps.operator.scheduling.none import NoPolicy
from elasticps.operator.scheduling.policy import Policy

POLICIES: Mapping[SchedulingPolicy, Policy] = MappingProxyType({
    SchedulingPolicy.NONE: NoPolicy(),
    SchedulingPolicy.COSCHEDULING: Coscheduling(),
})  # fmt: skip


def policy_for(job: TrainingJob, policies: Mapping[SchedulingPolicy, Policy] = POLICIES) -> Policy:
    """The policy ``job`` asks for in ``policies``; KeyError names a value without one (a bug:
    every member of ``SchedulingPolicy`` has an entry, ``tests/operator_planning`` checks it)."""
    return policies[job.spec.scheduling.policy]
