"""The Pods and Services of a TrainingJob, as plain manifests (dicts) for the Kubernetes API: pure.

Callers: the planner (``planning.py``) puts them into ``CreatePod`` / ``CreateService`` actions. Names,
labels and command lines come from ``elasticps.api.replicas``, so a pod runs the same
``elasticps ps`` / ``elasticps worker`` arguments as a process of ``elasticps run``.

Children of job ``J`` (every one labelled and owned by the job, ``controller: true``):
- Service ``J-ps-i``: headless (``clusterIP: None``), selecting PS pod i only, port 2222, with
  ``publishNotReadyAddresses`` so ``J-ps-i.<ns>.svc`` resolves as soon as the pod has an address
  (workers dial the PS before it is ready and retry; a DNS miss would cost them gRPC's re-resolution delay).
- Pod ``J-ps-i``: ``elasticps ps --host=0.0.0.0 --port=2222 ...`` with a gRPC readiness probe (the PS
  serves grpc.health.v1); pod ``J-worker-i``: ``elasticps worker --ps_addrs=J-ps-0.<ns>.svc:2222,...``.

The role's ``template`` (a pod template: ``metadata.labels/annotations`` and ``spec``) is the base
of the pod: nodeSelector, tolerations, affinity, volumes, serviceAccountName, imagePullSecrets,
sidecars and the like are kept as written. The container named ``elasticps`` in it (if any) is merged
with ours: its env, volumeMounts, securityContext ... stay; image, command and args are ours; resources
are merged key by key with ``spec.<role>.resources`` winning. Our labels win over the template's.
``restartPolicy`` is always ``Never``: the planner replaces failed pods itself, so each replacement is
seen, counted against ``backoffLimit``, and judged by exit code under ``ExitCode``.
"""

from __future__ import annotations

import copy
from typing import Any

from elasticps.api.replicas import PS_PORT, Replica, Role, cluster_ps_addresses, ps_replica, replica_name, worker_replica
from elasticps.api.spec import API_VERSION, KIND, ReplicaSpec, TrainingJob

LABEL_JOB = "elasticps.io/job-name"
LABEL_ROLE = "elasticps.io/replica-type"
LABEL_INDEX = "elasticps.io/replica-index"
CONTAINER = "elasticps"
PORT_NAME = "grpc"
DEFAULT_COMMAND = ("elasticps",)


class TemplateError(ValueError):
    """A role's pod template has the wrong shape; the message names the field."""


def role_spec(job: TrainingJob, role: Role) -> ReplicaSpec:
    return job.spec.ps if role is Role.PS else job.spec.worker


def labels(job: TrainingJob, role: Role, index: int) -> dict[str, str]:
    return {LABEL_JOB: job.name, LABEL_ROLE: role.value, LABEL_INDEX: str(index)}


def selector(job: TrainingJob, role: Role) -> str:
    """The label selector of one role's pods, as a string (``status.workerSelector``)."""
    return f"{LABEL_JOB}={job.name},{LABEL_ROLE}={role.value}"


def owner_reference(job: TrainingJob, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def replica(job: TrainingJob, role: Role, index: int) -> Replica:
    """The replica a pod runs in a cluster: the PS listens on every address, port 2222."""
    if role is Role.PS:
        return ps_replica(job, index, host="0.0.0.0", port=PS_PORT)
    return worker_replica(job, index, cluster_ps_addresses(job))


def service_manifest(job: TrainingJob, uid: str, index: int) -> dict[str, Any]:
    """The headless Service ``{job}-ps-{index}`` that gives PS ``index`` a stable DNS name."""
    name = replica_name(job, Role.PS, index)
    own = labels(job, Role.PS, index)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": dict(own),
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": dict(own),
            "ports": [{"name": PORT_NAME, "port": PS_PORT, "targetPort": PS_PORT, "protocol": "TCP"}],
        },
    }


def pod_manifest(
    job: TrainingJob, uid: str, role: Role, index: int, *, command: tuple[str, ...] = DEFAULT_COMMAND
) -> dict[str, Any]:
    """The pod of replica ``index`` of ``role``, the role's template merged in (see the module doc).

    Raises :class:`TemplateError` when the template is not shaped like a pod template.
    """
    spec = role_spec(job, role)
    rep = replica(job, role, index)
    where = f"spec.{role.value}.template"
    template = copy.deepcopy(spec.template)
    t_meta = _mapping(template.get("metadata"), f"{where}.metadata")
    t_spec = _mapping(template.get("spec"), f"{where}.spec")
    own = labels(job, role, index)

    metadata: dict[str, Any] = {
        "name": rep.name,
        "namespace": job.namespace,
        "labels": {**_mapping(t_meta.get("labels"), f"{where}.metadata.labels"), **own},
        "ownerReferences": [owner_reference(job, uid)],
    }
    annotations = _mapping(t_meta.get("annotations"), f"{where}.metadata.annotations")
    if annotations:
        metadata["annotations"] = annotations

    containers = t_spec.get("containers", [])
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        raise TemplateError(f"{where}.spec.containers: must be a list of containers")
    base: dict[str, Any] = next((c for c in containers if c.get("name") == CONTAINER), {})
    others = [c for c in containers if c.get("name") != CONTAINER]
    pod_spec = {
        **t_spec,
        "restartPolicy": "Never",
        "containers": [_container(job, rep, spec, base, command, f"{where}.spec.containers[{CONTAINER}]"), *others],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _container(
    job: TrainingJob,
    rep: Replica,
    spec: ReplicaSpec,
    base: dict[str, Any],
    command: tuple[str, ...],
    where: str,
) -> dict[str, Any]:
    container = {**base, "name": CONTAINER, "image": job.spec.image, "command": list(command), "args": list(rep.args)}
    resources = _resources(spec, _mapping(base.get("resources"), f"{where}.resources"), where)
    if resources:
        container["resources"] = resources
    else:
        container.pop("resources", None)
    if rep.role is Role.PS:
        ports = base.get("ports", [])
        if not isinstance(ports, list):
            raise TemplateError(f"{where}.ports: must be a list")
        kept = [p for p in ports if not (isinstance(p, dict) and p.get("containerPort") == PS_PORT)]
        container["ports"] = [{"name": PORT_NAME, "containerPort": PS_PORT, "protocol": "TCP"}, *kept]
        container.setdefault("readinessProbe", {"grpc": {"port": PS_PORT}, "periodSeconds": 5})
    return container


def _resources(spec: ReplicaSpec, base: dict[str, Any], where: str) -> dict[str, Any]:
    """The template container's resources with the spec's on top, key by key.

    An extended resource (a name with a domain, e.g. ``nvidia.com/gpu``) given only as a request is
    also made a limit: Kubernetes requires extended resources in limits (and equal to any request).
    """
    requests = {**_mapping(base.get("requests"), f"{where}.requests"), **spec.resources.requests}
    limits = {**_mapping(base.get("limits"), f"{where}.limits"), **spec.resources.limits}
    for name, quantity in requests.items():
        if "/" in name and name not in limits:
            limits[name] = quantity
    merged = {k: v for k, v in base.items() if k not in ("requests", "limits")}
    if requests:
        merged["requests"] = requests
    if limits:
        merged["limits"] = limits
    return merged


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TemplateError(f"{where}: must be a mapping")
    return value
