"""Scheduling policies: how a job's pods are prepared for the cluster's scheduler and admission.

A policy (:class:`~elasticps.operator.scheduling.policy.Policy`) is chosen by the job's
``spec.scheduling.policy`` in :data:`~elasticps.operator.scheduling.registry.POLICIES`. It says, for
each replica, what its pod carries besides what ``manifests`` renders (a scheduler name, labels,
annotations, scheduling gates: a :class:`PodDecoration`), and which job-level objects (a PodGroup, a
:class:`GroupObject`) exist while the job runs. ``rendering`` applies both: the decoration to every
pod it renders, the group objects as ``CreateGroup`` / ``DeleteGroup`` actions that ``executing``
carries out. The planner never hears of it.

Policies are pure (no API calls, no kopf): they read the typed job and return values. One module per
policy; ``none`` (:mod:`.none`) decorates nothing.
"""

from elasticps.operator.scheduling.policy import GroupObject as GroupObject
from elasticps.operator.scheduling.policy import PodDecoration as PodDecoration
from elasticps.operator.scheduling.policy import Policy as Policy
from elasticps.operator.scheduling.registry import POLICIES as POLICIES
from elasticps.operator.scheduling.registry import policy_for as policy_for
