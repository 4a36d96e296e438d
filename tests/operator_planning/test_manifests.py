"""Pod, Service and NetworkPolicy manifests: names, labels, owners, command lines, probes, ports,
security, resources, and the template merge.

(The folder is not named tests/operator: see DESIGN.md.)
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

import job_builders

from elasticps import identity
from elasticps.operator import rotation
from elasticps.api.replicas import Role, cluster_ps_addresses, ps_replica, worker_replica
from elasticps.api.spec import TrainingJob
from elasticps.operator.manifests import (
    CONTAINER,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_JOB_UID,
    LABEL_ROLE,
    OPERATOR_LABELS,
    TemplateError,
    identity_env,
    identity_secret_manifest,
    identity_volume,
    network_policy_manifest,
    pod_manifest,
    selector,
    service_manifest,
)

UID = "0b6e7a52-1111-2222-3333-444455556666"


def make_job(**spec: Any) -> TrainingJob:
    return job_builders.make_job(spec, namespace="team")


def container(pod: dict[str, Any]) -> dict[str, Any]:
    [ours] = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER]
    return ours


OWNER = {
    "apiVersion": "elasticps.io/v1alpha1",
    "kind": "TrainingJob",
    "name": "mnist",
    "uid": UID,
    "controller": True,
    "blockOwnerDeletion": True,
}


@pytest.mark.parametrize(
    "role,index,name",
    [(Role.PS, 0, "mnist-ps-0"), (Role.PS, 1, "mnist-ps-1"), (Role.WORKER, 0, "mnist-worker-0"), (Role.WORKER, 3, "mnist-worker-3")],
)
def test_pod_name_labels_owner(role: Role, index: int, name: str) -> None:
    job = make_job(ps={"replicas": 2}, worker={"replicas": 4})
    pod = pod_manifest(job, UID, role, index)
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert pod["metadata"]["name"] == name
    assert pod["metadata"]["namespace"] == "team"
    assert pod["metadata"]["labels"] == {LABEL_JOB: "mnist", LABEL_ROLE: role.value, LABEL_INDEX: str(index), LABEL_JOB_UID: UID}
    assert pod["metadata"]["ownerReferences"] == [OWNER]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container(pod)["image"] == "elasticps:latest"
    assert container(pod)["command"] == ["elasticps"]


GRPC = {"name": "grpc", "containerPort": 2222, "protocol": "TCP"}
BULK = {"name": "bulk", "containerPort": 2224, "protocol": "TCP"}
HEALTH = {"name": "health", "containerPort": 2223, "protocol": "TCP"}
METRICS = {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}


def test_ps_pod_runs_the_ps_replica_on_port_2222_with_grpc_probes_and_metrics() -> None:
    job = make_job(ps={"replicas": 2}, worker={"replicas": 3})
    c = container(pod_manifest(job, UID, Role.PS, 1))
    assert c["args"] == [*ps_replica(job, 1, host="0.0.0.0", port=2222).args, "--metrics_port=9090", "--bulk_port=2224"]
    assert "--num_ps=2" in c["args"]
    assert not any(a.startswith("--num_workers") for a in c["args"])  # a sync round counts its live workers
    assert c["ports"] == [GRPC, BULK, METRICS]
    assert c["readinessProbe"]["grpc"] == c["livenessProbe"]["grpc"] == {"port": 2222}


def test_worker_pod_dials_every_ps_through_its_service_and_serves_health() -> None:
    job = make_job(ps={"replicas": 2})
    c = container(pod_manifest(job, UID, Role.WORKER, 0))
    assert c["args"] == [*worker_replica(job, 0, cluster_ps_addresses(job)).args, "--health_port=2223", "--metrics_port=9090"]
    assert "--ps_addrs=mnist-ps-0.team.svc:2222,mnist-ps-1.team.svc:2222" in c["args"]
    assert c["ports"] == [HEALTH, METRICS]
    assert c["readinessProbe"]["grpc"] == c["livenessProbe"]["grpc"] == {"port": 2223}
    # TensorFlow's import comes before the health server: the liveness probe is patient
    live = c["livenessProbe"]
    assert live["initialDelaySeconds"] + live["periodSeconds"] * live["failureThreshold"] >= 120


def test_a_decentralized_job_renders_its_coordinator_and_workers_that_find_each_other_by_dns() -> None:
    job = make_job(strategy="decentralized", worker={"replicas": 3}, decentralized={"graph": "complete", "staleness": 2})
    coordinator = container(pod_manifest(job, UID, Role.COORDINATOR, 0))
    assert coordinator["args"][:3] == ["coordinator", "--host=0.0.0.0", "--port=2222"]
    assert coordinator["readinessProbe"]["grpc"] == {"port": 2222}
    assert coordinator["ports"] == [{"name": "grpc", "containerPort": 2222, "protocol": "TCP"}]
    worker = container(pod_manifest(job, UID, Role.WORKER, 1))
    args = worker["args"]
    assert "--strategy=decentralized" in args and "--worker_id=1" in args and "--staleness=2" in args
    assert "--coordinator_addr=mnist-coordinator-0.team.svc:2222" in args
    assert ("--peer_addrs=mnist-worker-0.team.svc:2225,mnist-worker-1.team.svc:2225,"
            "mnist-worker-2.team.svc:2225") in args
    assert not any(a.startswith("--ps_addrs") for a in args)
    assert {"name": "peer", "containerPort": 2225, "protocol": "TCP"} in worker["ports"]
    service = service_manifest(job, UID, 1, Role.WORKER)
    assert service["metadata"]["name"] == "mnist-worker-1" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "peer", "port": 2225, "targetPort": 2225, "protocol": "TCP"}]
    assert service["spec"]["selector"][LABEL_ROLE] == "worker" and service["spec"]["selector"][LABEL_INDEX] == "1"
    assert service_manifest(job, UID, 0, Role.COORDINATOR)["spec"]["ports"][0]["port"] == 2222


@pytest.mark.parametrize("role", [Role.PS, Role.WORKER])
def test_pods_are_scraped_by_prometheus(role: Role) -> None:
    pod = pod_manifest(make_job(), UID, role, 0)
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9090", "prometheus.io/path": "/metrics"}


@pytest.mark.parametrize("role", [Role.PS, Role.WORKER])
def test_pods_run_as_non_root_read_only_with_a_writable_tmp(role: Role) -> None:
    pod = pod_manifest(make_job(), UID, role, 0)
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"}}
    c = container(pod)
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
    assert pod["spec"]["volumes"] == [{"name": "tmp", "emptyDir": {}}, identity_volume(make_job(), role, 0)]
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}, IDENTITY_MOUNT]


def test_the_template_may_loosen_security_and_bring_its_own_tmp() -> None:
    template = {
        "metadata": {"annotations": {"prometheus.io/scrape": "false"}},
        "spec": {
            "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
            "volumes": [{"name": "tmp", "hostPath": {"path": "/scratch"}}],
            "containers": [{"name": CONTAINER, "securityContext": {"readOnlyRootFilesystem": False},
                            "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}]}],
        },
    }
    pod = pod_manifest(make_job(worker={"template": template}), UID, Role.WORKER, 0)
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "false"
    assert pod["spec"]["securityContext"]["runAsUser"] == 0 and pod["spec"]["securityContext"]["runAsNonRoot"] is False
    assert pod["spec"]["securityContext"]["fsGroup"] == 1000
    assert pod["spec"]["volumes"] == [{"name": "tmp", "hostPath": {"path": "/scratch"}}, identity_volume(make_job(), Role.WORKER, 0)]
    c = container(pod)
    assert c["securityContext"]["readOnlyRootFilesystem"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["volumeMounts"] == [{"name": "scratch", "mountPath": "/tmp"}, IDENTITY_MOUNT]


def test_network_policy_lets_only_the_job_and_the_operator_reach_its_ps() -> None:
    policy = network_policy_manifest(make_job(), UID)
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "mnist-ps" and policy["metadata"]["namespace"] == "team"
    assert policy["metadata"]["ownerReferences"] == [OWNER]
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {LABEL_JOB: "mnist", LABEL_ROLE: "ps"}}
    assert spec["policyTypes"] == ["Ingress"]
    grpc, metrics = spec["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": 2222}, {"protocol": "TCP", "port": 2224}]  # and the bulk channel
    assert grpc["from"] == [
        {"podSelector": {"matchLabels": {LABEL_JOB: "mnist"}}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "elasticps",
                                                                   "app.kubernetes.io/component": "operator"}}},
    ]
    assert metrics == {"ports": [{"protocol": "TCP", "port": 9090}]}  # no "from": anyone (Prometheus)
    # it selects every PS pod of the job and no worker
    for role, selected in ((Role.PS, True), (Role.WORKER, False)):
        labels = pod_manifest(make_job(ps={"replicas": 2}), UID, role, 1)["metadata"]["labels"]
        assert (spec["podSelector"]["matchLabels"].items() <= labels.items()) is selected
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}
    assert network_policy_manifest(make_job(), UID, peer)["spec"]["ingress"][0]["from"][1] == peer


def test_command_is_configurable() -> None:
    pod = pod_manifest(make_job(), UID, Role.WORKER, 0, command=("python", "-m", "elasticps"))
    assert container(pod)["command"] == ["python", "-m", "elasticps"]


@pytest.mark.parametrize(
    ("spec", "template", "operator", "expected"),
    [
        pytest.param({}, None, None, "IfNotPresent", id="default: an image built on the node starts"),
        pytest.param({}, None, "Always", "Always", id="the operator's default (the chart's jobImagePullPolicy)"),
        pytest.param({"imagePullPolicy": "Never"}, None, "Always", "Never", id="the job's over the operator's"),
        pytest.param({"imagePullPolicy": "Never"}, "Always", None, "Always", id="the template container's over all"),
    ],
)
def test_image_pull_policy(spec: dict[str, Any], template: str | None, operator: str | None, expected: str) -> None:
    if template is not None:
        spec["worker"] = {"template": {"spec": {"containers": [{"name": CONTAINER, "imagePullPolicy": template}]}}}
    kwargs = {} if operator is None else {"pull_policy": operator}
    pod = pod_manifest(make_job(**spec), UID, Role.WORKER, 0, **kwargs)
    assert container(pod)["imagePullPolicy"] == expected


def test_a_replicas_own_line_becomes_its_termination_message() -> None:
    assert container(pod_manifest(make_job(), UID, Role.PS, 0))["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_resources_and_gpus_from_the_spec() -> None:
    job = make_job(
        image="registry.example/elasticps:1.2",
        worker={"resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": 1}}},
    )
    c = container(pod_manifest(job, UID, Role.WORKER, 0))
    assert c["image"] == "registry.example/elasticps:1.2"
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": "1"}}


def test_an_extended_resource_requested_only_is_also_a_limit() -> None:
    job = make_job(worker={"resources": {"requests": {"nvidia.com/gpu": 2, "cpu": "1"}}})
    resources = container(pod_manifest(job, UID, Role.WORKER, 0))["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": "2"}  # cpu stays a request only


def test_no_resources_no_resources_key() -> None:
    assert "resources" not in container(pod_manifest(make_job(), UID, Role.PS, 0))


TEMPLATE = {
    "metadata": {"labels": {"team": "ml", LABEL_JOB: "spoofed"}, "annotations": {"sidecar.istio.io/inject": "false"}},
    "spec": {
        "serviceAccountName": "trainer",
        "nodeSelector": {"accelerator": "h100"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "mnist"}}],
        "restartPolicy": "Always",
        "containers": [
            {
                "name": CONTAINER,
                "image": "ignored:1",
                "args": ["ignored"],
                "env": [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
            },
            {"name": "log-shipper", "image": "fluent-bit:3"},
        ],
    },
}


def test_template_is_merged_in() -> None:
    job = make_job(worker={"template": TEMPLATE, "resources": {"requests": {"cpu": "4"}}})
    before = copy.deepcopy(job.spec.worker.template)
    pod = pod_manifest(job, UID, Role.WORKER, 2)
    assert job.spec.worker.template == before  # the spec is not modified
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"] == {"team": "ml", LABEL_JOB: "mnist", LABEL_ROLE: "worker", LABEL_INDEX: "2", LABEL_JOB_UID: UID}  # ours win
    assert meta["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9090",
                                   "prometheus.io/path": "/metrics", "sidecar.istio.io/inject": "false"}
    assert spec["serviceAccountName"] == "trainer"
    assert spec["nodeSelector"] == {"accelerator": "h100"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert spec["volumes"] == [*TEMPLATE["spec"]["volumes"], {"name": "tmp", "emptyDir": {}}, identity_volume(job, Role.WORKER, 2)]
    assert spec["restartPolicy"] == "Never"  # the planner replaces pods itself
    ours, sidecar = spec["containers"]
    assert ours["name"] == CONTAINER and sidecar == {"name": "log-shipper", "image": "fluent-bit:3"}
    assert ours["image"] == "elasticps:latest"
    assert ours["args"][0] == "worker"
    assert ours["env"] == [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}, *identity_env(job, Role.WORKER)]
    assert ours["volumeMounts"] == [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}, IDENTITY_MOUNT]
    assert ours["resources"] == {"requests": {"cpu": "4", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}


IDENTITY_MOUNT = {"name": "elasticps-identity", "mountPath": "/var/run/elasticps/identity", "readOnly": True}


def identity_files(pod: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The pod's identity variables, and which Secret entry each mounted identity file holds."""
    env = {e["name"]: e.get("value", "") for e in container(pod)["env"] if e["name"].startswith("ELASTICPS_")}
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "elasticps-identity")
    assert volume["secret"]["secretName"] == "mnist-identity"
    assert IDENTITY_MOUNT in container(pod)["volumeMounts"]
    return env, {item["path"]: item["key"] for item in volume["secret"]["items"]}


def test_each_pod_mounts_its_own_token_and_only_servers_the_keys() -> None:
    token = {"ELASTICPS_TOKEN_FILE": "/var/run/elasticps/identity/token"}
    keys = {"ELASTICPS_KEY_FILE": "/var/run/elasticps/identity/keys"}
    job = make_job()
    assert identity_files(pod_manifest(job, UID, Role.PS, 1)) == ({**token, **keys}, {"token": "ps-1", "keys": "accepted"})
    assert identity_files(pod_manifest(job, UID, Role.WORKER, 3)) == (token, {"token": "worker-3"})
    hop = make_job(strategy="decentralized", worker={"replicas": 3})
    assert identity_files(pod_manifest(hop, UID, Role.WORKER, 2)) == ({**token, **keys}, {"token": "worker-2", "keys": "accepted"})
    assert identity_files(pod_manifest(hop, UID, Role.COORDINATOR, 0))[1]["token"] == "coordinator-0"
    # A template's own identity variables, volume and mount of these names are replaced, its others kept.
    template = {"spec": {
        "volumes": [{"name": "elasticps-identity", "secret": {"secretName": "forged"}}],
        "containers": [{"name": CONTAINER, "env": [{"name": "ELASTICPS_TOKEN", "value": "forged"},
                                                  {"name": "ELASTICPS_JOB_KEY", "value": "ab" * 32},
                                                  {"name": "A", "value": "1"}],
                        "volumeMounts": [{"name": "forged", "mountPath": "/var/run/elasticps/identity"}]}]}}
    pod = pod_manifest(make_job(worker={"template": template}), UID, Role.WORKER, 0)
    assert [e["name"] for e in container(pod)["env"]] == ["A", "ELASTICPS_TOKEN_FILE"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp", "elasticps-identity"]
    assert identity_files(pod) == (token, {"token": "worker-0"})
    assert [m["name"] for m in container(pod)["volumeMounts"]] == ["tmp", "elasticps-identity"]


def test_the_identity_secret_holds_the_keys_the_rotation_and_each_members_token() -> None:
    import base64

    key, following = bytes(range(32)), bytes(range(1, 33))
    keys = rotation.KeyState(key, (following, key), rotation.SWITCHED, 1234.5, "now")
    secret = identity_secret_manifest(make_job(), UID, keys, ["worker-1", "ps-0"])
    assert secret["metadata"]["name"] == "mnist-identity" and secret["metadata"]["namespace"] == "team"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert secret["metadata"]["annotations"] == {
        "elasticps.io/identity-phase": "switched", "elasticps.io/identity-since": "1234.500", "elasticps.io/identity-rotation": "now"}
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {
        "key": key.hex(), "accepted": f"{following.hex()}\n{key.hex()}\n",
        "ps-0": identity.token_for(key, "ps-0"), "worker-1": identity.token_for(key, "worker-1"),
    }


def test_template_without_our_container_gets_it_first() -> None:
    job = make_job(ps={"template": {"spec": {"containers": [{"name": "exporter", "image": "x"}]}}})
    names = [c["name"] for c in pod_manifest(job, UID, Role.PS, 0)["spec"]["containers"]]
    assert names == [CONTAINER, "exporter"]


def test_template_probe_and_ports_are_kept_for_the_ps() -> None:
    probe = {"tcpSocket": {"port": 2222}}
    template = {"spec": {"containers": [{"name": CONTAINER, "readinessProbe": probe,
                                         "ports": [{"containerPort": 9090, "name": "metrics"}, {"containerPort": 2222},
                                                   {"containerPort": 6006, "name": "tensorboard"}]}]}}
    c = container(pod_manifest(make_job(ps={"template": template}), UID, Role.PS, 0))
    assert c["readinessProbe"] == probe
    assert c["livenessProbe"]["grpc"] == {"port": 2222}
    assert c["ports"] == [GRPC, BULK, METRICS, {"containerPort": 6006, "name": "tensorboard"}]  # 2222 and 9090 are ours


@pytest.mark.parametrize(
    "template,where",
    [
        ({"spec": "x"}, "spec.worker.template.spec: must be a mapping"),
        ({"metadata": []}, "spec.worker.template.metadata: must be a mapping"),
        ({"metadata": {"labels": "a=b"}}, "spec.worker.template.metadata.labels: must be a mapping"),
        ({"spec": {"containers": {"name": "x"}}}, "spec.worker.template.spec.containers: must be a list"),
        ({"spec": {"containers": [{"name": CONTAINER, "resources": []}]}}, "resources: must be a mapping"),
        ({"spec": {"volumes": {"name": "x"}}}, "spec.worker.template.spec.volumes: must be a list"),
        ({"spec": {"securityContext": "root"}}, "spec.worker.template.spec.securityContext: must be a mapping"),
        ({"spec": {"containers": [{"name": CONTAINER, "volumeMounts": "x"}]}}, "volumeMounts: must be a list"),
        ({"spec": {"containers": [{"name": CONTAINER, "env": {"A": "1"}}]}}, "env: must be a list"),
    ],
)
def test_malformed_template_is_a_template_error(template: dict[str, Any], where: str) -> None:
    with pytest.raises(TemplateError, match=where.replace("[", r"\[").replace("]", r"\]")):
        pod_manifest(make_job(worker={"template": template}), UID, Role.WORKER, 0)


def test_ps_service_is_headless_and_selects_one_pod() -> None:
    job = make_job(ps={"replicas": 3})
    service = service_manifest(job, UID, 2)
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    assert service["metadata"]["name"] == "mnist-ps-2"
    assert service["metadata"]["namespace"] == "team"
    assert service["metadata"]["ownerReferences"] == [OWNER]
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True
    assert spec["selector"] == {LABEL_JOB: "mnist", LABEL_ROLE: "ps", LABEL_INDEX: "2"}
    assert spec["ports"] == [{"name": "grpc", "port": 2222, "targetPort": 2222, "protocol": "TCP"}]
    # the selector matches exactly the PS pod of the same index
    assert spec["selector"].items() <= pod_manifest(job, UID, Role.PS, 2)["metadata"]["labels"].items()
    assert not spec["selector"].items() <= pod_manifest(job, UID, Role.PS, 1)["metadata"]["labels"].items()


def test_worker_selector() -> None:
    assert selector(make_job(), Role.WORKER) == "elasticps.io/job-name=mnist,elasticps.io/replica-type=worker"


def test_the_operator_peer_matches_the_operators_deployment() -> None:
    # The policy lets the operator dial PS 0 by its pods' labels: those of manifests/operator.yaml.
    path = Path(__file__).resolve().parents[2] / "manifests" / "operator.yaml"
    [deployment] = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "Deployment"]
    assert OPERATOR_LABELS.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
