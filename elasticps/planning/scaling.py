"""Scaling and creation: replicas above ``spec.<role>.replicas`` deleted, missing ones created.

Callers: ``plan`` (rule 11 of its list). Neither touches the other replicas nor the restart count.
Only a job whose strategy has PS replicas gets their Services and the ingress policy, and only
where the executor observes such things (``Observed.services`` / ``network_policies`` not None).
Before asking for a replica, the executor's render check (if any) is asked whether it can render
it: the first problem fails the job (InvalidSpec) and nothing is created in that pass.
"""

from __future__ import annotations

from elasticps.api.replicas import Role, parse_replica_name, replica_name
from elasticps.api.spec import JobPhase
from elasticps.planning.actions import CreateIngressPolicy, CreateReplica, CreateReplicaService, DeleteReplica, Event
from elasticps.planning.draft import Draft
from elasticps.planning.ends import fail
from elasticps.planning.roles import ingress_policy_name, job_roles, service_roles


def scale_down(d: Draft) -> None:
    excess = [p for p in d.pods if p.index >= d.desired(p.role)]
    for pod in sorted(excess, key=lambda p: (p.role is Role.PS, -p.index)):
        d.status.replacing.pop(pod.name, None)
        if not pod.deleted:
            reason = f"scaled down to {d.desired(pod.role)} {pod.role.value} replicas"
            d.deletes.append(DeleteReplica(pod.name, reason, scaled=True))
    names = [p.name for p in excess if not p.deleted and p.role is Role.WORKER]
    if names:
        d.events.append(
            Event("ScaledDown", f"Workers scaled down to {d.desired(Role.WORKER)}: deleting {', '.join(names)}.")
        )
    for name in [n for n in d.status.replacing if n not in d.by_name]:
        parsed = parse_replica_name(d.job.name, name)
        if parsed is None or parsed[1] >= d.desired(parsed[0]):
            del d.status.replacing[name]


def create_missing(d: Draft) -> bool:
    """Asks for what is missing; False when the job failed instead (a replica cannot be rendered)."""
    job = d.job
    if job.uses_ps:
        policies = d.obs.network_policies
        if policies is not None and ingress_policy_name(job) not in policies:
            d.creates.append(CreateIngressPolicy(ingress_policy_name(job)))
    if d.obs.services is not None:
        services = {s.name for s in d.obs.services}
        for role in service_roles(job):
            for index in range(d.desired(role)):
                name = replica_name(job, role, index)
                if name not in services:
                    d.creates.append(CreateReplicaService(name, role, index))
    for role in job_roles(job):
        for index in range(d.desired(role)):
            name = replica_name(job, role, index)
            if name in d.by_name:
                continue
            problem = d.check(job, role, index) if d.check is not None else None
            if problem is not None:
                d.creates.clear()
                fail(d, "InvalidSpec", problem)
                return False
            d.creates.append(CreateReplica(name, role, index))
            d.status.replacing.pop(name, None)
    scaled_up(d)
    return True


def scaled_up(d: Draft) -> None:
    """An event when a job that ran wants more workers than the last pass reported (``kubectl
    scale`` or a spec edit), naming those it creates now."""
    before, now = d.status.workers_wanted, d.desired(Role.WORKER)
    if before is None or now <= before or d.status.phase not in (JobPhase.RUNNING, JobPhase.RESTARTING):
        return
    names = [c.name for c in d.creates if isinstance(c, CreateReplica) and c.role is Role.WORKER and c.index >= before]
    d.events.append(Event("ScaledUp", f"Workers scaled up from {before} to {now}: creating {', '.join(names) or 'none'}."))
