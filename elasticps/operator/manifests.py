"""The Pods, Services and NetworkPolicy of a TrainingJob, as plain manifests (dicts) for the API: pure.

Callers: ``rendering`` turns the planner's replica actions into them (``CreatePod`` /
``CreateService`` / ``CreateNetworkPolicy``), and checks for the planner that a replica's pod can be
rendered at all (a template of the wrong shape raises :class:`TemplateError`). Names,
labels and command lines come from ``elasticps.api.replicas``, so a pod runs the same
``elasticps ps`` / ``elasticps worker`` arguments as a process of ``elasticps run``.

Children of job ``J`` (every one labelled and owned by the job, ``controller: true``):
- Service ``J-ps-i``: headless (``clusterIP: None``), selecting PS pod i only, port 2222, with
  ``publishNotReadyAddresses`` so ``J-ps-i.<ns>.svc`` resolves as soon as the pod has an address
  (workers dial the PS before it is ready and retry; a DNS miss would cost them gRPC's re-resolution delay).
- Pod ``J-ps-i``: ``elasticps ps --host=0.0.0.0 --port=2222 --metrics_port=9090 --bulk_port=2224 ...``,
  ports ``grpc`` 2222, ``bulk`` 2224 and ``metrics`` 9090, readiness and liveness probes of Kubernetes' native gRPC kind on 2222
  (the PS serves grpc.health.v1 there). Pod ``J-worker-i``: ``elasticps worker
  --ps_addrs=J-ps-0.<ns>.svc:2222,... --health_port=2223 --metrics_port=9090``, ports ``health`` 2223
  and ``metrics`` 9090, gRPC probes on 2223 (the worker starts its health server only once TensorFlow
  is imported and the model built: its liveness probe waits and tolerates long).
- Every pod carries Prometheus' scrape annotations (``prometheus.io/scrape``, ``port`` 9090,
  ``path`` /metrics) and runs locked down: non-root (uid/gid 1000, fsGroup 1000), no privilege
  escalation, every capability dropped, the RuntimeDefault seccomp profile, a read-only root
  filesystem with an ``emptyDir`` at ``/tmp`` (Python and TensorFlow need a writable temp dir).
- Secret ``J-identity`` (``identity.py``): the key tokens are made under (``key``, hex), the keys
  the servers accept (``accepted``: two while a rotation is under way, ``rotation.py``) and a token
  per member the operator created a pod for (``ps-0``, ``worker-3`` ...), added before that pod is
  created. Every pod mounts its own token from it at ``/var/run/elasticps/identity/token``
  (``ELASTICPS_TOKEN_FILE``); the pods that serve the job's calls (PS, coordinator, a decentralized
  job's workers) also the accepted keys (``keys``, ``ELASTICPS_KEY_FILE``). A mounted Secret
  follows its changes, so keys rotate under running pods. A PS worker never sees a key, so it
  cannot speak as another worker. The template's own identity variables, volume and mount of
  these names are replaced.
- NetworkPolicy ``J-ps``: the job's PS pods accept gRPC (2222) and the bulk tensor channel (2224)
  only from the job's own pods and from the operator's pods (``OPERATOR_PEER``: it asks PS 0's coordinator for progress), and
  metrics (9090) from anywhere, so Prometheus can scrape them.

The role's ``template`` (a pod template: ``metadata.labels/annotations`` and ``spec``) is the base
of the pod: nodeSelector, tolerations, affinity, volumes, serviceAccountName, imagePullSecrets,
sidecars and the like are kept as written. The container named ``elasticps`` in it (if any) is merged
with ours: its env, volumeMounts, securityContext ... stay; image, command and args are ours; resources
are merged key by key with ``spec.<role>.resources`` winning. Our labels win over the template's.
The template wins where it speaks of the rest: its annotations, probes, ports on other numbers,
pod and container ``securityContext`` keys (merged key by key over ours), and a volume named
``tmp`` or a mount at ``/tmp`` of its own.
``restartPolicy`` is always ``Never``: the planner replaces failed pods itself, so each replacement is
seen, counted against ``backoffLimit``, and judged by exit code under ``ExitCode``.

The job's scheduling policy (``scheduling``) decorates the pod last: its labels and annotations go
over the template's (our labels still win), its scheduler name replaces the template's, its
scheduling gates follow the template's. Its group objects get the job's namespace, label and owner
here (:func:`group_manifest`). Policy ``none`` adds nothing: the pod is exactly as described above.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable
from typing import Any

from elasticps import identity
from elasticps.operator import rotation
from elasticps.api.replicas import (
    PS_PORT, Replica, Role, cluster_ps_addresses, coordinator_replica, holds_job_key, peer_worker_replica, ps_replica,
    replica_name, worker_replica,
)  # fmt: skip
from elasticps.api.spec import API_VERSION, KIND, ReplicaSpec, TrainingJob
from elasticps.operator.scheduling.none import NOTHING
from elasticps.operator.scheduling.policy import GroupObject, PodDecoration
from elasticps.planning.roles import LABEL_INDEX as LABEL_INDEX
from elasticps.planning.roles import LABEL_JOB as LABEL_JOB
from elasticps.planning.roles import LABEL_ROLE as LABEL_ROLE
from elasticps.planning.roles import ingress_policy_name, role_spec
from elasticps.planning.roles import selector as selector

CONTAINER = "elasticps"
# Every pod also carries its job's uid: deleting a job deletes its pods with one request selecting
# this label (a job of the same name created meanwhile has another uid, so its pods are left alone).
LABEL_JOB_UID = "elasticps.io/job-uid"
PORT_NAME = "grpc"
HEALTH_PORT = 2223  # the worker's grpc.health.v1 server (the PS answers health on PS_PORT itself)
METRICS_PORT = 9090  # Prometheus /metrics, PS and worker alike
BULK_PORT = 2224  # the PS's raw-TCP tensor channel (ps/bulk.py), dialled by the job's workers
PEER_PORT = 2225  # a decentralized worker's Peer service (decentralized/servicer.py), dialled by its neighbours
DEFAULT_COMMAND = ("elasticps",)
# The operator's imagePullPolicy for a job that names none: an image built on the node (``make
# image``, ``elasticps:latest``) would otherwise be pulled from a registry under Kubernetes' default
# for ``:latest``, Always, and never start (``--image_pull_policy``, the chart's jobImagePullPolicy).
DEFAULT_PULL_POLICY = "IfNotPresent"
TMP_VOLUME = "tmp"
RUN_AS = 1000

# Who may dial a PS besides the job's own pods: the operator (PS 0's GetJobStatus), found by the
# labels its Deployment's pods carry (manifests/operator.yaml and the chart, unless nameOverride is
# set), in any namespace (it usually runs in elasticps-system).
OPERATOR_LABELS = {"app.kubernetes.io/name": "elasticps", "app.kubernetes.io/component": "operator"}
OPERATOR_PEER: dict[str, Any] = {"namespaceSelector": {}, "podSelector": {"matchLabels": OPERATOR_LABELS}}

SCRAPE_ANNOTATIONS = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"}
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}


IDENTITY_KEY = "key"  # the key tokens are made under (hex); the members' tokens are under their names
IDENTITY_ACCEPTED = "accepted"  # the keys the servers accept (hex, one a line: two while rotating)
IDENTITY_PHASE = "elasticps.io/identity-phase"  # the Secret's annotations: where a rotation stands
IDENTITY_SINCE = "elasticps.io/identity-since"
IDENTITY_HONORED = "elasticps.io/identity-rotation"  # the job's last rotate-identity value carried out
IDENTITY_VOLUME = "elasticps-identity"
IDENTITY_DIR = "/var/run/elasticps/identity"  # the pod's token (``token``) and, on servers, keys (``keys``)


def identity_secret_name(job: TrainingJob) -> str:
    return f"{job.name}-identity"


def member(role: Role, index: int) -> str:
    """A replica's name in the job's identity (``ps-0``, ``worker-3``, ``coordinator-0``)."""
    return identity.member_name(role.value, index)


def identity_secret_data(keys: rotation.KeyState, members: Iterable[str]) -> dict[str, str]:
    """The Secret's ``data`` (base64): the keys, and the tokens of ``members`` under the signing key."""
    plain = {
        IDENTITY_KEY: keys.signing.hex(),
        IDENTITY_ACCEPTED: identity.format_keys(keys.accepted),
        **{m: identity.token_for(keys.signing, m) for m in members},
    }
    return {name: base64.b64encode(value.encode()).decode() for name, value in sorted(plain.items())}


def identity_secret_annotations(keys: rotation.KeyState) -> dict[str, str]:
    return {IDENTITY_PHASE: keys.phase, IDENTITY_SINCE: f"{keys.since:.3f}", IDENTITY_HONORED: keys.honored}


def identity_secret_manifest(job: TrainingJob, uid: str, keys: rotation.KeyState, members: Iterable[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": identity_secret_name(job),
            "namespace": job.namespace,
            "labels": {LABEL_JOB: job.name, LABEL_JOB_UID: uid},
            "annotations": identity_secret_annotations(keys),
            "ownerReferences": [owner_reference(job, uid)],
        },
        "data": identity_secret_data(keys, members),
    }


def identity_env(job: TrainingJob, role: Role) -> list[dict[str, Any]]:
    """The container's environment entries of the replica's identity: where its files are."""
    env = [{"name": identity.TOKEN_FILE_ENV, "value": f"{IDENTITY_DIR}/token"}]
    if holds_job_key(job, role):
        env.append({"name": identity.KEY_FILE_ENV, "value": f"{IDENTITY_DIR}/keys"})
    return env


# Names a template's container may not set: the identity comes from the operator's Secret only.
IDENTITY_ENV_NAMES = frozenset({identity.TOKEN_FILE_ENV, identity.KEY_FILE_ENV, identity.TOKEN_ENV, identity.KEY_ENV})


def identity_volume(job: TrainingJob, role: Role, index: int) -> dict[str, Any]:
    """The replica's identity, mounted from the job's Secret (the kubelet keeps it current as the
    operator rotates keys): its own token, and the accepted keys for a pod that serves the job."""
    items = [{"key": member(role, index), "path": "token"}]
    if holds_job_key(job, role):
        items.append({"key": IDENTITY_ACCEPTED, "path": "keys"})
    return {"name": IDENTITY_VOLUME, "secret": {"secretName": identity_secret_name(job), "items": items, "defaultMode": 0o444}}


class TemplateError(ValueError):
    """A role's pod template has the wrong shape; the message names the field."""


def labels(job: TrainingJob, role: Role, index: int) -> dict[str, str]:
    return {LABEL_JOB: job.name, LABEL_ROLE: role.value, LABEL_INDEX: str(index)}


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
    """The replica a pod runs in a cluster: the PS listens on every address, port 2222; both serve
    metrics on 9090 and the worker its health on 2223 (the probes' ports)."""
    metrics = f"--metrics_port={METRICS_PORT}"
    if role is Role.COORDINATOR:
        return coordinator_replica(job, host="0.0.0.0", port=PS_PORT)
    if not job.uses_ps:
        coordinator = f"{replica_name(job, Role.COORDINATOR, 0)}.{job.namespace}.svc:{PS_PORT}"
        peers = [f"{replica_name(job, Role.WORKER, i)}.{job.namespace}.svc:{PEER_PORT}" for i in range(job.spec.worker.replicas)]
        return peer_worker_replica(job, index, coordinator, peers, extra=(f"--health_port={HEALTH_PORT}", metrics))
    if role is Role.PS:
        return ps_replica(
            job, index, host="0.0.0.0", port=PS_PORT, ps_addresses=cluster_ps_addresses(job),
            extra=(metrics, f"--bulk_port={BULK_PORT}"),
        )  # fmt: skip
    return worker_replica(job, index, cluster_ps_addresses(job), extra=(f"--health_port={HEALTH_PORT}", metrics))


def probes(role: Role) -> dict[str, dict[str, Any]]:
    """Readiness and liveness, both gRPC health checks (Kubernetes >= 1.27, GA).

    The PS serves as soon as its checkpoint is restored: ready within seconds, dead after a minute
    of silence. The worker's health server starts after TensorFlow's import (~10 s) and the model's
    build, so its liveness waits 30 s and then allows 2 minutes of failed checks.
    """
    if role in (Role.PS, Role.COORDINATOR):
        check = {"grpc": {"port": PS_PORT}, "timeoutSeconds": 5}
        return {
            "readinessProbe": {**check, "periodSeconds": 5},
            "livenessProbe": {**check, "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 6},
        }
    check = {"grpc": {"port": HEALTH_PORT}, "timeoutSeconds": 5}
    return {
        "readinessProbe": {**check, "initialDelaySeconds": 5, "periodSeconds": 5},
        "livenessProbe": {**check, "initialDelaySeconds": 30, "periodSeconds": 10, "failureThreshold": 12},
    }


def container_ports(role: Role, peer: bool = False) -> list[dict[str, Any]]:
    """The container's ports; ``peer``: a decentralized worker's Peer service too."""
    metrics = {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}
    if role is Role.COORDINATOR:
        return [{"name": PORT_NAME, "containerPort": PS_PORT, "protocol": "TCP"}]
    if role is Role.PS:
        return [
            {"name": PORT_NAME, "containerPort": PS_PORT, "protocol": "TCP"},
            {"name": "bulk", "containerPort": BULK_PORT, "protocol": "TCP"},
            metrics,
        ]
    own = [{"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"}] if peer else []
    return [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}, *own, metrics]


def network_policy_manifest(job: TrainingJob, uid: str, operator_peer: dict[str, Any] | None = None) -> dict[str, Any]:
    """NetworkPolicy ``{job}-ps``: the job's PS pods take gRPC from the job's pods and the operator only.

    Selecting the PS pods makes them isolated for ingress; what the rules list is all they accept:
    ports 2222 (gRPC) and 2224 (the bulk tensor channel) from pods labelled ``elasticps.io/job-name={job}`` in the job's namespace and from
    ``operator_peer`` (default :data:`OPERATOR_PEER`), port 9090 from anywhere (Prometheus). The
    kubelet's probes are not subject to it. Workers are not selected: nothing dials them.
    """
    peer = copy.deepcopy(OPERATOR_PEER if operator_peer is None else operator_peer)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": ingress_policy_name(job),
            "namespace": job.namespace,
            "labels": {LABEL_JOB: job.name},
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_JOB: job.name, LABEL_ROLE: Role.PS.value}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {LABEL_JOB: job.name}}}, peer],
                    "ports": [{"protocol": "TCP", "port": PS_PORT}, {"protocol": "TCP", "port": BULK_PORT}],
                },
                {"ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ],
        },
    }


def service_manifest(job: TrainingJob, uid: str, index: int, role: Role = Role.PS) -> dict[str, Any]:
    """The headless Service ``{job}-{role}-{index}`` that gives a replica a stable DNS name: a PS or a
    decentralized job's coordinator (gRPC on 2222), or a decentralized worker (its Peer service)."""
    name = replica_name(job, role, index)
    own = labels(job, role, index)
    port = PEER_PORT if role is Role.WORKER else PS_PORT
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
            "ports": [{"name": PORT_NAME if port == PS_PORT else "peer", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def group_manifest(job: TrainingJob, uid: str, group: GroupObject) -> dict[str, Any]:
    """A scheduling policy's group object, in the job's namespace, labelled and owned by the job (the
    garbage collector deletes it with the job, as it does the pods)."""
    manifest = copy.deepcopy(dict(group.manifest))
    meta = _mapping(manifest.get("metadata"), f"{group.plural} {group.name}: metadata")
    manifest["metadata"] = {
        **meta,
        "namespace": job.namespace,
        "labels": {**_mapping(meta.get("labels"), f"{group.plural} {group.name}: labels"), LABEL_JOB: job.name},
        "ownerReferences": [owner_reference(job, uid)],
    }
    return manifest


def pod_manifest(
    job: TrainingJob,
    uid: str,
    role: Role,
    index: int,
    *,
    command: tuple[str, ...] = DEFAULT_COMMAND,
    decoration: PodDecoration = NOTHING,
    pull_policy: str = DEFAULT_PULL_POLICY,
) -> dict[str, Any]:
    """The pod of replica ``index`` of ``role``, the role's template merged in and ``decoration``
    (from the job's scheduling policy) on top (see the module doc). The container's
    imagePullPolicy: the template container's, else ``spec.imagePullPolicy``, else ``pull_policy``
    (the operator's default).

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
        "labels": {
            **_mapping(t_meta.get("labels"), f"{where}.metadata.labels"), **decoration.labels, **own, LABEL_JOB_UID: uid
        },
        "ownerReferences": [owner_reference(job, uid)],
    }
    metadata["annotations"] = {
        **SCRAPE_ANNOTATIONS, **_mapping(t_meta.get("annotations"), f"{where}.metadata.annotations"), **decoration.annotations
    }

    containers = t_spec.get("containers", [])
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        raise TemplateError(f"{where}.spec.containers: must be a list of containers")
    base: dict[str, Any] = next((c for c in containers if c.get("name") == CONTAINER), {})
    others = [c for c in containers if c.get("name") != CONTAINER]
    volumes = t_spec.get("volumes", [])
    if not isinstance(volumes, list):
        raise TemplateError(f"{where}.spec.volumes: must be a list")
    if not any(isinstance(v, dict) and v.get("name") == TMP_VOLUME for v in volumes):
        volumes = [*volumes, {"name": TMP_VOLUME, "emptyDir": {}}]
    volumes = [*(v for v in volumes if not (isinstance(v, dict) and v.get("name") == IDENTITY_VOLUME)),
               identity_volume(job, role, index)]  # fmt: skip
    pod_spec = {
        **t_spec,
        "securityContext": {**POD_SECURITY, **_mapping(t_spec.get("securityContext"), f"{where}.spec.securityContext")},
        "restartPolicy": "Never",
        "volumes": volumes,
        "containers": [
            _container(job, rep, spec, base, command, f"{where}.spec.containers[{CONTAINER}]", pull_policy), *others
        ],
    }
    if decoration.scheduler_name:
        pod_spec["schedulerName"] = decoration.scheduler_name
    if decoration.scheduling_gates:
        gates = t_spec.get("schedulingGates", [])
        if not isinstance(gates, list):
            raise TemplateError(f"{where}.spec.schedulingGates: must be a list")
        named = [g.get("name") for g in gates if isinstance(g, dict)]
        pod_spec["schedulingGates"] = [*gates, *({"name": n} for n in decoration.scheduling_gates if n not in named)]
    if decoration.node_selector:
        selector = _mapping(t_spec.get("nodeSelector"), f"{where}.spec.nodeSelector")
        pod_spec["nodeSelector"] = {**selector, **decoration.node_selector}
    if decoration.tolerations:
        tolerations = t_spec.get("tolerations", [])
        if not isinstance(tolerations, list):
            raise TemplateError(f"{where}.spec.tolerations: must be a list")
        pod_spec["tolerations"] = [*tolerations, *(dict(t) for t in decoration.tolerations if t not in tolerations)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _container(
    job: TrainingJob,
    rep: Replica,
    spec: ReplicaSpec,
    base: dict[str, Any],
    command: tuple[str, ...],
    where: str,
    pull_policy: str,
) -> dict[str, Any]:
    container = {**base, "name": CONTAINER, "image": job.spec.image, "command": list(command), "args": list(rep.args)}
    container.setdefault("imagePullPolicy", job.spec.image_pull_policy or pull_policy)
    resources = _resources(spec, _mapping(base.get("resources"), f"{where}.resources"), where)
    if resources:
        container["resources"] = resources
    else:
        container.pop("resources", None)
    ports = base.get("ports", [])
    if not isinstance(ports, list):
        raise TemplateError(f"{where}.ports: must be a list")
    ours = container_ports(rep.role, peer=not job.uses_ps)
    taken = [p["containerPort"] for p in ours] + [p["name"] for p in ours]  # a list: template values may be unhashable
    kept = [p for p in ports if not (isinstance(p, dict) and (p.get("containerPort") in taken or p.get("name") in taken))]
    container["ports"] = [*ours, *kept]
    for kind, probe in probes(rep.role).items():
        container.setdefault(kind, probe)
    # The replica's one-line reason (exits.py writes it to /dev/termination-log) becomes its
    # terminated state's message, which the planner makes the job's; a replica that could not write
    # one leaves the tail of its log there instead.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    security = _mapping(base.get("securityContext"), f"{where}.securityContext")
    container["securityContext"] = {**CONTAINER_SECURITY, **security}
    env = base.get("env", [])
    if not isinstance(env, list):
        raise TemplateError(f"{where}.env: must be a list")
    ours_env = identity_env(job, rep.role)
    container["env"] = [*(e for e in env if not (isinstance(e, dict) and e.get("name") in IDENTITY_ENV_NAMES)), *ours_env]
    mounts = base.get("volumeMounts", [])
    if not isinstance(mounts, list):
        raise TemplateError(f"{where}.volumeMounts: must be a list")
    if not any(isinstance(m, dict) and m.get("mountPath") == "/tmp" for m in mounts):
        mounts = [*mounts, {"name": TMP_VOLUME, "mountPath": "/tmp"}]
    theirs = [m for m in mounts if not (isinstance(m, dict) and (m.get("name") == IDENTITY_VOLUME or m.get("mountPath") == IDENTITY_DIR))]
    container["volumeMounts"] = [*theirs, {"name": IDENTITY_VOLUME, "mountPath": IDENTITY_DIR, "readOnly": True}]
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
