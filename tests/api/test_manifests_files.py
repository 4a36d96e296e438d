"""The deployable files, without a cluster: manifests/ (RBAC, operator Deployment, examples) and the
Helm chart helm/elasticps (its CRD copy, ``helm lint``, ``helm template`` rendered and validated
against Kubernetes 1.34's OpenAPI schemas with kubernetes-validate, strict).

Least privilege is checked both ways: the RBAC rules grant every permission in ``REQUIRED`` and
nothing else. ``REQUIRED`` is derived by hand from the code and kept here, next to checks that
fail when the code grows a call the list does not know (a new ``ClusterApi`` method, a kopf
handler on another resource). tests/e2e_cluster/test_helm.py proves it on a real API server: the
operator runs with exactly these permissions.
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
CHART = ROOT / "helm" / "elasticps"
K8S_VERSION = "1.34.0"

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)

# Who makes each call (elasticps/operator/...):
NAMESPACED: dict[Permission, str] = {
    ("elasticps.io", "trainingjobs", "get"): "cluster_api.get_job (each pass reads its job)",
    ("elasticps.io", "trainingjobs", "list"): "kopf: the watch stream's initial listing",
    ("elasticps.io", "trainingjobs", "watch"): "kopf: on.create/update/resume/event handlers",
    ("elasticps.io", "trainingjobs", "patch"): "kopf: progress and diff-base annotations (elasticps.io/...)",
    ("elasticps.io", "trainingjobs", "delete"): "cluster_api.delete_job (runPolicy.ttlSecondsAfterFinished)",
    ("elasticps.io", "trainingjobs/status", "patch"): "cluster_api.patch_job_status",
    ("elasticps.io", "trainingjobs/finalizers", "update"): (
        "children's ownerReferences carry blockOwnerDeletion (OwnerReferencesPermissionEnforcement)"
    ),
    ("", "pods", "list"): "cluster_api.list_pods, list_job_pods (podwatch's listing)",
    ("", "pods", "watch"): "cluster_api.watch_job_pods (podwatch: every labelled pod's changes)",
    ("", "pods", "create"): "cluster_api.create('pods'), dry_run_pod (a dry run needs the verb it tries)",
    ("", "pods", "delete"): "cluster_api.delete_pod",
    ("", "pods", "deletecollection"): "cluster_api.delete_pods (a deleted job's pods, at once)",
    ("", "services", "list"): "cluster_api.list_services",
    ("", "services", "create"): "cluster_api.create('services')",
    ("", "secrets", "get"): "cluster_api.get_secret (a job's identity Secret: operator/identities.py)",
    ("", "secrets", "create"): "cluster_api.create('secrets')",
    ("", "secrets", "patch"): "cluster_api.patch_secret (a member's token added before its pod)",
    ("", "events", "create"): "cluster_api.create('events'); kopf's posted warnings",
    ("networking.k8s.io", "networkpolicies", "list"): "cluster_api.list_network_policies",
    ("networking.k8s.io", "networkpolicies", "create"): "cluster_api.create('networkpolicies')",
}
CLUSTER_SCOPED: dict[Permission, str] = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"): "kopf: resource scanning at start-up",
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"): "kopf: CRDs added or removed at run time",
}
REQUIRED = {**NAMESPACED, **CLUSTER_SCOPED}

# Every public ClusterApi method and the permissions its request needs.
CLUSTER_API_CALLS: dict[str, set[Permission]] = {
    "get_job": {("elasticps.io", "trainingjobs", "get")},
    "list_pods": {("", "pods", "list")},
    "list_job_pods": {("", "pods", "list")},
    "watch_job_pods": {("", "pods", "watch")},
    "list_services": {("", "services", "list")},
    "list_network_policies": {("networking.k8s.io", "networkpolicies", "list")},
    "create": {
        ("", "pods", "create"), ("", "services", "create"), ("", "events", "create"), ("", "secrets", "create"),
        ("networking.k8s.io", "networkpolicies", "create"),
    },  # fmt: skip
    # A scheduling policy's group objects (a PodGroup ...): the policy that makes them brings their
    # RBAC rule; the built-in policy ``none`` makes none, so nothing is needed for it.
    "dry_run_pod": {("", "pods", "create")},
    "delete": set(),
    "patch_spec": set(),  # a policy's group object kept in step with the job: COSCHEDULING grants it
    "delete_pod": {("", "pods", "delete")},
    "delete_pods": {("", "pods", "deletecollection")},
    "patch_job_status": {("elasticps.io", "trainingjobs/status", "patch")},
    "get_secret": {("", "secrets", "get")},
    "patch_secret": {("", "secrets", "patch")},
    "delete_job": {("elasticps.io", "trainingjobs", "delete")},
    "close": set(),
    # Kueue's objects (a queued job's Workload, the flavors it was admitted on, its priority class):
    # granted only with the chart's kueue.enabled (KUEUE below), as a policy's group objects are.
    "get": set(),
    "replace_status": set(),
}
# What kueue.enabled adds: the Workloads in the job's namespace, flavors and priority classes cluster-wide.
KUEUE_NAMESPACED: set[Permission] = {
    ("kueue.x-k8s.io", "workloads", "get"), ("kueue.x-k8s.io", "workloads", "create"),
    ("kueue.x-k8s.io", "workloads", "list"), ("kueue.x-k8s.io", "workloads", "watch"),  # --kueue: the watch
    ("kueue.x-k8s.io", "workloads/status", "update"),
}
COSCHEDULING: set[Permission] = {
    ("scheduling.x-k8s.io", "podgroups", "create"), ("scheduling.x-k8s.io", "podgroups", "delete"),
    ("scheduling.x-k8s.io", "podgroups", "patch"),
}
KUEUE_CLUSTER: set[Permission] = {
    ("kueue.x-k8s.io", "resourceflavors", "get"), ("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
}
# The resources kopf watches (list + watch) for our handlers: (group, plural).
KOPF_WATCHED = {("elasticps.io", "trainingjobs")}


def expand(rules: list[dict[str, Any]]) -> set[Permission]:
    granted = set()
    for rule in rules:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((group, resource, verb))
    return granted


def no_wildcards(rules: list[dict[str, Any]]) -> None:
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], f"wildcard in {key}: {rule}"
            assert all("*" not in value for value in rule[key]), f"wildcard in {key}: {rule}"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# ---- the permission list follows the code ---------------------------------------------------------------
def test_every_cluster_api_method_has_its_permissions_listed() -> None:
    from elasticps.operator.cluster_api import ClusterApi

    methods = {n for n, _ in inspect.getmembers(ClusterApi, inspect.isfunction) if not n.startswith("_")}
    unknown = methods - set(CLUSTER_API_CALLS)
    assert not unknown, f"ClusterApi methods without permissions in this test (and in the RBAC files): {unknown}"
    needed = set().union(*CLUSTER_API_CALLS.values())
    assert needed <= set(NAMESPACED), needed - set(NAMESPACED)


def test_every_kind_the_operator_creates_is_listed() -> None:
    """``ClusterApi.create`` takes the plural: every plural ``executing`` and ``identities`` pass must be granted."""
    from elasticps.operator import executing, identities

    source = inspect.getsource(executing) + inspect.getsource(identities)
    plurals = {"pods", "services", "events", "networkpolicies", "secrets"}
    mentioned = {p for p in ("pods", "services", "events", "networkpolicies", "configmaps", "secrets", "jobs")
                 if f'"{p}"' in source}  # fmt: skip
    assert mentioned <= plurals, f"executing.py creates {mentioned - plurals}: add the permissions here and in RBAC"
    kinds = getattr(executing, "_KINDS", None)
    if isinstance(kinds, dict):
        assert {str(v[0]) for v in kinds.values()} <= plurals
    created = {resource for _group, resource, verb in NAMESPACED if verb == "create"}
    assert plurals == created


def test_kopf_watches_only_the_listed_resources() -> None:
    import kopf

    from elasticps.operator import handlers  # noqa: F401 - registers the handlers

    registry: Any = kopf.get_default_registry()
    selectors = set()
    for part in ("_watching", "_changing", "_spawning", "_indexing", "_webhooks"):
        for handler in getattr(registry, part).get_all_handlers():
            if handler.selector is not None:
                selector = handler.selector
                selectors.add((selector.group or "", selector.plural or selector.any_name))
    assert selectors == KOPF_WATCHED
    for group, plural in KOPF_WATCHED:
        assert {(group, plural, "list"), (group, plural, "watch")} <= set(NAMESPACED)


# ---- manifests/ ---------------------------------------------------------------------------------------------
def test_cluster_rbac_grants_exactly_what_the_operator_calls() -> None:
    docs = documents(MANIFESTS / "rbac.yaml")
    [account] = by_kind(docs, "ServiceAccount")
    assert account["metadata"] == {**account["metadata"], "name": "elasticps-operator", "namespace": "elasticps-system"}
    [role] = by_kind(docs, "ClusterRole")
    no_wildcards(role["rules"])
    granted = expand(role["rules"])
    assert granted - set(REQUIRED) == set(), "granted beyond what the operator calls"
    assert set(REQUIRED) - granted == set(), "missing what the operator calls"
    [binding] = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "elasticps-operator", "namespace": "elasticps-system"}]
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")


def test_namespaced_rbac_grants_the_namespaced_part_and_nothing_cluster_scoped() -> None:
    docs = documents(MANIFESTS / "rbac-namespaced.yaml")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    [role] = by_kind(docs, "Role")
    no_wildcards(role["rules"])
    assert expand(role["rules"]) == set(NAMESPACED)
    [binding] = by_kind(docs, "RoleBinding")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "elasticps-operator", "namespace": "elasticps-system"}]


def operator_argv(container: dict[str, Any]) -> list[str]:
    assert container["command"] == ["elasticps"]
    return list(container["args"])


def check_operator_deployment(deployment: dict[str, Any], namespaces: tuple[str, ...] = ()) -> None:
    """The Deployment runs ``elasticps operator`` with flags the real CLI accepts, safely."""
    from elasticps.cli import _parser

    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}  # kopf standalone: never two
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == "elasticps-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    args = _parser().parse_args(operator_argv(container))
    assert args.command == "operator"
    assert args.namespace == list(namespaces)
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["healthz"]
    assert args.liveness == f"http://0.0.0.0:{port}/healthz"
    for kind in ("livenessProbe", "readinessProbe"):  # ready: kopf's handlers run (rollout status means it)
        probe = container[kind]["httpGet"]
        assert probe["path"] == "/healthz" and probe["port"] in ("healthz", port)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"/tmp"} <= {m["mountPath"] for m in container["volumeMounts"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_operator_deployment() -> None:
    docs = documents(MANIFESTS / "operator.yaml")
    [deployment] = by_kind(docs, "Deployment")
    assert deployment["metadata"]["namespace"] == "elasticps-system"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "elasticps:latest"
    check_operator_deployment(deployment)


@pytest.mark.parametrize("name", ["rbac.yaml", "rbac-namespaced.yaml", "operator.yaml"])
def test_manifests_validate_against_kubernetes_1_34(name: str) -> None:
    for doc in documents(MANIFESTS / name):
        validate(doc)


@pytest.mark.parametrize("path", sorted((MANIFESTS / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_parse(path: Path) -> None:
    from elasticps.api.parsing import load_job_file

    job = load_job_file(path)
    assert job.spec.image == "elasticps:latest" and job.name.startswith("mnist-")


def test_the_real_node_example_trains_as_the_async_example_with_checkpoints() -> None:
    """The README's one-machine path applies mnist-async-real-node.yaml: the cluster example's job,
    placed on the real node, with checkpoints on (a deleted PS comes back from one)."""
    generic = yaml.safe_load((MANIFESTS / "examples" / "mnist-async.yaml").read_text())["spec"]
    real = yaml.safe_load((MANIFESTS / "examples" / "mnist-async-real-node.yaml").read_text())["spec"]
    training = dict(real["training"])
    assert training.pop("checkpointDir").startswith("/jobs/") and training.pop("checkpointSteps") > 0
    assert training == generic["training"] and real["model"] == generic["model"] and real["data"] == generic["data"]
    for role in ("ps", "worker"):
        pod = real[role]["template"]["spec"]
        assert pod["nodeSelector"] == {"elasticps.io/real-node": "true"}
        assert {v["hostPath"]["path"] for v in pod["volumes"]} == {"/var/lib/elasticps/mnist", "/var/lib/elasticps/jobs"}
        assert real[role]["replicas"] == generic[role]["replicas"]


def test_sync_example_is_sync_with_a_backup_worker() -> None:
    from elasticps.api.parsing import load_job_file

    job = load_job_file(MANIFESTS / "examples" / "mnist-sync.yaml")
    assert job.spec.training.use_async is False
    assert 0 < job.spec.training.grads_to_wait < job.spec.worker.replicas


# ---- the Helm chart ----------------------------------------------------------------------------------------
def test_chart_crd_is_the_generated_crd() -> None:
    assert [p.name for p in (CHART / "crds").iterdir()] == ["crd.yaml"]
    assert (CHART / "crds" / "crd.yaml").read_bytes() == (MANIFESTS / "crd.yaml").read_bytes(), (
        "helm/elasticps/crds/crd.yaml differs from manifests/crd.yaml: cp manifests/crd.yaml helm/elasticps/crds/"
    )


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "elasticps" and chart["appVersion"] == "0.1.0"


@pytest.fixture(scope="module")
def helm() -> str:
    found = subprocess.run(
        ["bash", "-c", "source hack/cluster/versions.sh; echo $ASSETS_DIR"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    for candidate in (Path(found) / "helm" if found else None, shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    reason = f"no helm binary (looked in {found or 'hack/cluster ASSETS_DIR'}/helm and PATH; bash hack/cluster/build.sh caches one)"
    print(f"\nSKIPPING: {reason}", file=sys.stderr)
    pytest.skip(reason)


def render(helm: str, *sets: str) -> list[dict[str, Any]]:
    command = [helm, "template", "elasticps", str(CHART), "--namespace", "elasticps-system"]
    for value in sets:
        command += ["--set", value]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.parametrize("sets", [(), ("watchNamespaces={a,b}",), ("metrics.enabled=true", "metrics.podMonitor.enabled=true"),
                                  ("kueue.enabled=true",), ("coscheduling.enabled=true",)])
def test_helm_lint(helm: str, sets: tuple[str, ...]) -> None:
    command = [helm, "lint", "--strict", str(CHART)]
    for value in sets:
        command += ["--set", value]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


def test_helm_default_renders_the_cluster_wide_operator(helm: str) -> None:
    docs = render(helm)
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    [role] = by_kind(docs, "ClusterRole")
    no_wildcards(role["rules"])
    assert expand(role["rules"]) == set(REQUIRED)
    [plain] = by_kind(documents(MANIFESTS / "rbac.yaml"), "ClusterRole")
    assert role["rules"] == plain["rules"]  # the chart and manifests/ grant the same
    [binding] = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "elasticps-operator", "namespace": "elasticps-system"}]
    [account] = by_kind(docs, "ServiceAccount")
    assert account["metadata"]["name"] == "elasticps-operator" and account["metadata"]["namespace"] == "elasticps-system"
    [deployment] = by_kind(docs, "Deployment")
    check_operator_deployment(deployment)
    # Metrics on by default: the operator serves them and the pod says where.
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert "--metrics_port=9090" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    for doc in docs:
        validate(doc)


def test_helm_coscheduling_adds_exactly_the_pod_groups(helm: str) -> None:
    [role] = by_kind(render(helm, "coscheduling.enabled=true"), "ClusterRole")
    assert expand(role["rules"]) == set(REQUIRED) | COSCHEDULING


def test_helm_kueue_adds_exactly_what_admission_needs(helm: str) -> None:
    [role] = by_kind(render(helm, "kueue.enabled=true"), "ClusterRole")
    no_wildcards(role["rules"])
    assert expand(role["rules"]) == set(REQUIRED) | KUEUE_NAMESPACED | KUEUE_CLUSTER
    roles = by_kind(render(helm, "kueue.enabled=true", "watchNamespaces={a}"), "Role")
    assert [expand(r["rules"]) for r in roles] == [set(NAMESPACED) | KUEUE_NAMESPACED]
    [deployment] = by_kind(render(helm, "kueue.enabled=true"), "Deployment")
    assert "--kueue" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    [deployment] = by_kind(render(helm), "Deployment")
    assert "--kueue" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_helm_sets_the_operators_client_rate_limit(helm: str) -> None:
    from elasticps.cli import _parser
    from elasticps.operator.main import config_from_args

    def config(*sets: str) -> Any:
        [deployment] = by_kind(render(helm, *sets), "Deployment")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        return config_from_args(_parser().parse_args(operator_argv(container)))

    default = config()
    assert (default.kube_api_qps, default.kube_api_burst, default.kube_api_concurrency) == (50, 100, 16)
    raised = config("kubeApi.qps=400", "kubeApi.burst=800", "kubeApi.concurrency=32")
    assert (raised.kube_api_qps, raised.kube_api_burst, raised.kube_api_concurrency) == (400, 800, 32)


def test_the_real_node_values_put_the_operator_on_the_real_node(helm: str) -> None:
    # README "On one machine, with a real node": on a kwok node the operator "runs" without running.
    done = subprocess.run(
        [helm, "template", "elasticps", str(CHART), "-n", "elasticps-system", "-f", str(CHART / "values-real-node.yaml")],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    [deployment] = by_kind([d for d in yaml.safe_load_all(done.stdout) if d], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"elasticps.io/real-node": "true"}
    assert {"key": "elasticps.io/real-node", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_helm_sets_the_job_pods_pull_policy(helm: str) -> None:
    from elasticps.cli import _parser
    from elasticps.operator.main import config_from_args

    def pull_policy(*sets: str) -> str:
        [deployment] = by_kind(render(helm, *sets), "Deployment")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        return config_from_args(_parser().parse_args(operator_argv(container))).rendering.pull_policy

    assert pull_policy() == "IfNotPresent"  # an image built on the node (make image) starts
    assert pull_policy("jobImagePullPolicy=Always") == "Always"


def test_helm_with_watch_namespaces_renders_roles_per_namespace(helm: str) -> None:
    docs = render(helm, "watchNamespaces={a,b}")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role")}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding")}
    assert set(roles) == set(bindings) == {"a", "b"}
    for namespace, role in roles.items():
        no_wildcards(role["rules"])
        assert expand(role["rules"]) == set(NAMESPACED)
        assert bindings[namespace]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
        assert bindings[namespace]["subjects"] == [
            {"kind": "ServiceAccount", "name": "elasticps-operator", "namespace": "elasticps-system"}
        ]
    [deployment] = by_kind(docs, "Deployment")
    check_operator_deployment(deployment, namespaces=("a", "b"))
    for doc in docs:
        validate(doc)


def test_helm_values_reach_the_deployment(helm: str) -> None:
    docs = render(
        helm,
        "image.repository=registry.example/elasticps", "image.tag=0.1.0", "image.pullPolicy=Always",
        "nodeSelector.pool=system", "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
        "metrics.enabled=true", "metrics.port=9100", "metrics.podMonitor.enabled=true",
        "serviceAccount.name=custom-sa", "extraArgs={--resync_seconds=30}",
    )  # fmt: skip
    [deployment] = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["image"] == "registry.example/elasticps:0.1.0" and container["imagePullPolicy"] == "Always"
    assert pod["spec"]["nodeSelector"] == {"pool": "system"}
    assert pod["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["spec"]["serviceAccountName"] == "custom-sa"
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9100", "prometheus.io/path": "/metrics"
    }  # fmt: skip
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container["ports"]
    assert "--metrics_port=9100" in container["args"]
    assert "--resync_seconds=30" in container["args"]
    [monitor] = by_kind(docs, "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    [binding] = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "custom-sa"
    [account] = by_kind(docs, "ServiceAccount")
    assert account["metadata"]["name"] == "custom-sa"
    for doc in docs:
        if doc["kind"] != "PodMonitor":  # a prometheus-operator CRD: not in Kubernetes' schemas
            validate(doc)


def test_helm_without_rbac_or_service_account(helm: str) -> None:
    docs = render(helm, "rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=mine")
    assert [d["kind"] for d in docs] == ["Deployment"]
    assert docs[0]["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


def test_notes_say_how_to_submit_and_watch_a_job() -> None:
    text = (CHART / "templates" / "NOTES.txt").read_text()
    for line in ("kubectl apply -n", "manifests/examples/mnist-sync.yaml", "kubectl get trainingjobs -w",
                 "kubectl describe trainingjob"):  # fmt: skip
        assert line in text
