"""``spec.scheduling.policy: coscheduling``: gang scheduling by the scheduler-plugins' Coscheduling
plugin (a kube-scheduler built with it, named ``spec.scheduling.schedulerName``).

The job's PS replicas and its fewest workers (``worker.minReplicas``, else all of ``replicas``) are
one gang: a PodGroup named after the job with that ``minMember``, and every pod labelled
``scheduling.x-k8s.io/pod-group`` with it and sent to that scheduler. The plugin binds none of the
gang's pods until it can bind ``minMember`` of them at once, so two jobs that each need more than half
of the free nodes no longer both start half and wait on each other: one starts whole, the other
waits whole. Workers beyond the minimum join as they fit, as in any elastic job. A pod that waits on
its gang says so in its PodScheduled condition, which the job's Unschedulable condition carries.
"""

from __future__ import annotations

from elasticps.api.replicas import Role
from elasticps.api.spec import TrainingJob
from elasticps.operator.scheduling.policy import GroupObject, PodDecoration

API_VERSION = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def min_member(job: TrainingJob) -> int:
    """The gang: every PS (or a decentralized job's coordinator) and the fewest workers the job runs with."""
    servers = job.spec.ps.replicas if job.uses_ps else 1
    return servers + (job.spec.worker.min_replicas or job.spec.worker.replicas)


class Coscheduling:
    """The scheduler name and the group label on every pod; one PodGroup per job."""

    def pod(self, job: TrainingJob, role: Role, index: int) -> PodDecoration:
        return PodDecoration(scheduler_name=job.spec.scheduling.scheduler_name, labels={POD_GROUP_LABEL: job.name})

    def groups(self, job: TrainingJob) -> tuple[GroupObject, ...]:
        manifest = {
            "apiVersion": API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": job.name},
            "spec": {"minMember": min_member(job)},
        }
        return (GroupObject("podgroups", manifest),)
