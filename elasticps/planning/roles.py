"""Which roles a job's strategy has, how many replicas of each it wants, and the names the
planner gives the things it creates: pure.

Callers: the planner's rules, and the operator's ``manifests`` (the same names, labels and role
specs). The labels are Kubernetes' but the planner reports one selector (``status.workerSelector``,
read by the scale subresource), so they are defined here, once.
Under the ``parameterServer`` strategy a job has PS replicas and workers; a strategy without a PS
would have workers only, so nothing here or in the rules assumes a PS exists: a role the strategy
lacks is wanted zero times, and PS Services and the ingress policy exist only with PS replicas.
"""

from __future__ import annotations

from dataclasses import replace

from elasticps.api.replicas import Role
from elasticps.api.spec import ReplicaSpec, RestartPolicy, TrainingJob

LABEL_JOB = "elasticps.io/job-name"
LABEL_ROLE = "elasticps.io/replica-type"
LABEL_INDEX = "elasticps.io/replica-index"


def role_spec(job: TrainingJob, role: Role) -> ReplicaSpec:
    """The replica spec of ``role``. A decentralized job's coordinator is one replica, always
    restarted, with the workers' resources and pod template (it opens the same data)."""
    if role is Role.PS:
        return job.spec.ps
    if role is Role.COORDINATOR:
        return replace(job.spec.worker, replicas=1, restart_policy=RestartPolicy.ALWAYS)
    return job.spec.worker


def job_roles(job: TrainingJob) -> tuple[Role, ...]:
    """The roles the job's strategy runs, in creation order (a PS or the coordinator before the
    workers that dial it)."""
    return (Role.PS, Role.WORKER) if job.uses_ps else (Role.COORDINATOR, Role.WORKER)


def coordinating(job: TrainingJob) -> Role:
    """The role whose replica 0 coordinates the job (tasks, progress): PS 0, or the coordinator."""
    return Role.PS if job.uses_ps else Role.COORDINATOR


def desired(job: TrainingJob, role: Role) -> int:
    """How many replicas of ``role`` the job wants now (0 for a role its strategy lacks)."""
    return role_spec(job, role).replicas if role in job_roles(job) else 0


def service_roles(job: TrainingJob) -> tuple[Role, ...]:
    """The roles whose every replica gets a headless Service (a stable DNS name others dial): the PS
    shards; or a decentralized job's coordinator and its workers (each dialled by its neighbours)."""
    return (Role.PS,) if job.uses_ps else (Role.COORDINATOR, Role.WORKER)


def ingress_policy_name(job: TrainingJob) -> str:
    """The NetworkPolicy that guards the job's PS replicas."""
    return f"{job.name}-ps"


def selector(job: TrainingJob, role: Role) -> str:
    """The label selector of one role's replicas, as a string (``status.workerSelector``)."""
    return f"{LABEL_JOB}={job.name},{LABEL_ROLE}={role.value}"
