"""The operator end to end: real kubectl against a real API server, scheduler and garbage collector.

kwok's pods run nothing: where a test needs a container to exit it patches the pod's status (phase
and terminated exit code) through the status subresource, as a kubelet would; where it needs PS 0's
coordinator it answers ``GetJobStatus`` itself (``FakeCoordinator``). Waits poll with timeouts.
"""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticps import identity
from cluster_kit import IDENTITY_GRACE_S, ROOT, Kubectl, Operator, Watch, condition, phases, scrape, training_job, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

EXAMPLES = ROOT / "manifests" / "examples"
LABELS = ("elasticps.io/job-name", "elasticps.io/replica-type", "elasticps.io/replica-index")


def running(kubectl: Kubectl, ns: str, name: str, workers: int, ps: int = 1, timeout: float = 60) -> dict[str, Any]:
    """Waits until the job says Running with every pod ready, and returns it."""

    def check() -> dict[str, Any] | None:
        job = kubectl.job(ns, name)
        status = job.get("status", {})
        done = status.get("phase") == "Running" and status.get("workers") == f"{workers}/{workers}"
        return job if done and status.get("ps") == f"{ps}/{ps}" else None

    return wait_for(check, timeout, f"{ns}/{name} Running with {ps} PS and {workers} workers ready")


def uids(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return loaded


# ---- (a) the examples ---------------------------------------------------------------------------------
def test_mnist_async_example_creates_services_and_pods(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "mnist-async.yaml"))
    job = running(kubectl, ns, "mnist-async", workers=2, ps=2)
    uid = job["metadata"]["uid"]
    owner = {"apiVersion": "elasticps.io/v1alpha1", "kind": "TrainingJob", "name": "mnist-async", "uid": uid,
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip

    services = {s["metadata"]["name"]: s for s in kubectl.json("get", "services", "-n", ns)["items"]}
    assert set(services) == {"mnist-async-ps-0", "mnist-async-ps-1"}
    for i in range(2):
        svc = services[f"mnist-async-ps-{i}"]
        assert svc["spec"]["clusterIP"] == "None"  # headless: stable DNS per PS
        assert svc["spec"]["selector"]["elasticps.io/replica-index"] == str(i)
        assert [p["port"] for p in svc["spec"]["ports"]] == [2222]
        assert svc["metadata"]["ownerReferences"] == [owner]

    pods = {p["metadata"]["name"]: p for p in kubectl.pods(ns, "mnist-async")}
    assert set(pods) == {"mnist-async-ps-0", "mnist-async-ps-1", "mnist-async-worker-0", "mnist-async-worker-1"}
    for name, pod in pods.items():
        role, index = name.split("-")[-2:]
        assert {k: pod["metadata"]["labels"][k] for k in LABELS} == dict(zip(LABELS, ["mnist-async", role, index]))
        assert pod["metadata"]["ownerReferences"] == [owner]
        assert pod["spec"]["restartPolicy"] == "Never"  # the operator replaces pods itself
        [container] = pod["spec"]["containers"]
        assert container["name"] == "elasticps" and container["image"] == "elasticps:latest"
        args = container["args"]
        assert {"--use_async", "--num_epochs=3"} <= set(args), args
        assert not any(a.startswith(("--lr_staleness", "--staleness_compensation", "--learning_rate")) for a in args)
        if role == "ps":
            assert args[0] == "ps" and f"--ps_id={index}" in args and "--num_ps=2" in args
        else:
            assert args[0] == "worker" and f"--worker_id={index}" in args
            assert f"--ps_addrs=mnist-async-ps-0.{ns}.svc:2222,mnist-async-ps-1.{ns}.svc:2222" in args

    header = kubectl("get", "trainingjobs", "-n", ns).stdout.splitlines()[0]
    assert header.split() == [
        "NAME", "PHASE", "REASON", "MODE", "WORKERS", "PS", "VERSION", "PROGRESS", "ACCURACY", "AGE", "MESSAGE"
    ]  # ITERATIONS only with -o wide
    row = printed_columns(kubectl, ns)
    assert [row[k] for k in ("NAME", "PHASE", "REASON", "MODE", "WORKERS", "PS")] == [
        "mnist-async", "Running", "", "Async", "2/2", "2/2"
    ]

    events = [(e["reason"], e["message"]) for e in kubectl.events(ns, "mnist-async")]
    assert ("SuccessfulCreatePod", "Created pod: mnist-async-worker-1") in events
    assert ("SuccessfulCreateService", "Created service: mnist-async-ps-0") in events


def test_pods_are_probed_scraped_and_locked_down(kubectl: Kubectl, ns: str) -> None:
    # The API server accepts (and keeps) the gRPC probes, security contexts and the /tmp emptyDir.
    kubectl.apply(ns, training_job("tj", workers=1))
    running(kubectl, ns, "tj", workers=1)
    pods = {p["metadata"]["name"]: p for p in kubectl.pods(ns, "tj")}
    for name, port in (("tj-ps-0", 2222), ("tj-worker-0", 2223)):
        pod = pods[name]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9090"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        [container] = pod["spec"]["containers"]
        assert container["readinessProbe"]["grpc"]["port"] == container["livenessProbe"]["grpc"]["port"] == port
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert "--metrics_port=9090" in container["args"]


def test_a_network_policy_guards_the_ps_of_each_job(kubectl: Kubectl, ns: str) -> None:
    # kwok enforces nothing: what can be checked is that the policy exists, is owned, and has its shape.
    kubectl.apply(ns, training_job("tj", workers=1))
    job = running(kubectl, ns, "tj", workers=1)
    policy = kubectl.json("get", "networkpolicy", "tj-ps", "-n", ns)
    assert policy["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"elasticps.io/job-name": "tj", "elasticps.io/replica-type": "ps"}}
    assert spec["policyTypes"] == ["Ingress"]
    grpc, metrics = spec["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": 2222}, {"protocol": "TCP", "port": 2224}]  # gRPC, bulk
    assert grpc["from"][0] == {"podSelector": {"matchLabels": {"elasticps.io/job-name": "tj"}}}
    assert metrics == {"ports": [{"protocol": "TCP", "port": 9090}]}
    selected = kubectl.json("get", "pods", "-n", ns, "-l", "elasticps.io/job-name=tj,elasticps.io/replica-type=ps")
    assert [p["metadata"]["name"] for p in selected["items"]] == ["tj-ps-0"]
    assert any(e["reason"] == "SuccessfulCreateNetworkPolicy" for e in kubectl.events(ns, "tj"))

    kubectl("delete", "networkpolicy", "tj-ps", "-n", ns)  # deleted by hand: the next pass puts it back
    wait_for(lambda: kubectl("get", "networkpolicy", "tj-ps", "-n", ns, check=False).returncode == 0, 60,
             "tj-ps recreated")  # fmt: skip


def test_gpu_example_lands_on_the_gpu_node(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "gpu.yaml"))
    running(kubectl, ns, "mnist-gpu", workers=2)
    pods = {p["metadata"]["name"]: p for p in kubectl.pods(ns, "mnist-gpu")}
    for i in range(2):
        worker = pods[f"mnist-gpu-worker-{i}"]
        assert worker["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        node = kubectl.json("get", "node", worker["spec"]["nodeName"])
        assert "nvidia.com/gpu" in node["status"]["allocatable"]  # kwok-gpu-0 here
    assert "limits" not in pods["mnist-gpu-ps-0"]["spec"]["containers"][0]["resources"]


# ---- (b) failures ---------------------------------------------------------------------------------------
def test_deleted_worker_is_replaced_under_its_name(kubectl: Kubectl, ns: str) -> None:
    kubectl.apply(ns, training_job("tj", workers=2))
    running(kubectl, ns, "tj", workers=2)
    before = uids(kubectl.pods(ns, "tj"))
    kubectl("delete", "pod", "tj-worker-0", "-n", ns, "--wait=false")

    def replaced() -> bool:
        now = uids(kubectl.pods(ns, "tj"))
        return now.keys() == before.keys() and now["tj-worker-0"] != before["tj-worker-0"]

    wait_for(replaced, 60, "a new tj-worker-0")
    job = running(kubectl, ns, "tj", workers=2)
    assert job["status"]["restarts"] == 0  # a pod deleted by hand is recreated, not a failure
    after = uids(kubectl.pods(ns, "tj"))
    assert {k: v for k, v in after.items() if k != "tj-worker-0"} == {k: v for k, v in before.items() if k != "tj-worker-0"}
    creations = [e for e in kubectl.events(ns, "tj") if e["message"] == "Created pod: tj-worker-0"]
    assert len(creations) == 2, creations


def test_failures_beyond_backoff_limit_fail_the_job(kubectl: Kubectl, ns: str) -> None:
    kubectl.apply(ns, training_job("tj", workers=2, worker={"restartPolicy": "OnFailure"}, runPolicy={"backoffLimit": 1}))
    running(kubectl, ns, "tj", workers=2)
    first = uids(kubectl.pods(ns, "tj"))["tj-worker-1"]
    kubectl.set_pod_exit(ns, "tj-worker-1", 1)

    def replacement_running() -> bool:
        pod = {p["metadata"]["name"]: p for p in kubectl.pods(ns, "tj")}.get("tj-worker-1")
        return pod is not None and pod["metadata"]["uid"] != first and pod["status"].get("phase") == "Running"

    wait_for(replacement_running, 60, "tj-worker-1 replaced and running")
    job = running(kubectl, ns, "tj", workers=2)
    assert job["status"]["restarts"] == 1
    kubectl.set_pod_exit(ns, "tj-worker-1", 1)

    job = wait_for(lambda: (j := kubectl.job(ns, "tj"))["status"].get("phase") == "Failed" and j, 60, "tj Failed")
    failed = condition(job, "Failed")
    assert failed is not None and failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    assert job["status"]["restarts"] == 1 and job["status"].get("completionTime")
    reasons = {e["reason"]: e for e in kubectl.events(ns, "tj")}
    assert reasons["Restarting"]["type"] == "Warning" and "exit code 1" in reasons["Restarting"]["message"]
    assert reasons["BackoffLimitExceeded"]["type"] == "Warning"
    # cleanPodPolicy None: every pod is kept, the failed one with it.
    assert phases(kubectl.pods(ns, "tj")) == {"tj-ps-0": "Running", "tj-worker-0": "Running", "tj-worker-1": "Failed"}


def test_a_user_error_fails_the_job_once_with_the_replicas_line(kubectl: Kubectl, ns: str) -> None:
    """Exit code 2 with a termination message: no replacement, the job Failed with reason UserError
    and the replica's own line as its condition's message and a Warning event."""
    kubectl.apply(ns, training_job("tj", workers=2, worker={"restartPolicy": "OnFailure"}, runPolicy={"backoffLimit": 3}))
    running(kubectl, ns, "tj", workers=2)
    line = "worker-1: error: /data/mnist/trian-images-idx3-ubyte[.gz]: no such file"
    kubectl.set_pod_exit(ns, "tj-worker-1", 2, message=line + "\n")
    job = wait_for(lambda: (j := kubectl.job(ns, "tj"))["status"].get("phase") == "Failed" and j, 60, "tj Failed")
    failed = condition(job, "Failed")
    assert failed is not None and (failed["reason"], failed["message"]) == ("UserError", line)
    assert job["status"]["restarts"] == 0
    events = [e for e in kubectl.events(ns, "tj") if e["reason"] in ("UserError", "Restarting")]
    assert [(e["reason"], e["type"], e["message"]) for e in events] == [("UserError", "Warning", line)]
    row = printed_columns(kubectl, ns)
    assert (row["PHASE"], row["REASON"], row["MESSAGE"]) == ("Failed", "UserError", line)  # kubectl get tj


# ---- (c) scaling --------------------------------------------------------------------------------------
def test_kubectl_scale_adds_workers_without_restarting_others(kubectl: Kubectl, ns: str) -> None:
    kubectl.apply(ns, training_job("tj", workers=2))
    running(kubectl, ns, "tj", workers=2)
    before = uids(kubectl.pods(ns, "tj"))

    kubectl("scale", "trainingjob/tj", "-n", ns, "--replicas=4")
    job = running(kubectl, ns, "tj", workers=4)
    after = uids(kubectl.pods(ns, "tj"))
    assert sorted(after) == ["tj-ps-0", *(f"tj-worker-{i}" for i in range(4))]
    assert {k: after[k] for k in before} == before  # the PS and the first two workers kept running
    assert job["status"]["restarts"] == 0 and job["spec"]["worker"]["replicas"] == 4
    assert kubectl("get", "trainingjob/tj", "-n", ns, "-o", "jsonpath={.status.replicaStatuses.worker.active}").stdout == "4"

    kubectl("scale", "trainingjob/tj", "-n", ns, "--replicas=3")
    wait_for(lambda: "tj-worker-3" not in uids(kubectl.pods(ns, "tj")), 60, "tj-worker-3 deleted")
    running(kubectl, ns, "tj", workers=3)
    assert uids(kubectl.pods(ns, "tj")) == {k: v for k, v in after.items() if k != "tj-worker-3"}


def identity_secret(kubectl: Kubectl, ns: str, job: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The job's identity Secret: its annotations, and its data decoded."""
    found = kubectl.json("get", "secret", "tj-identity", "-n", ns)
    assert found["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]  # goes with the job
    return found["metadata"].get("annotations") or {}, {k: base64.b64decode(v).decode() for k, v in found["data"].items()}


def test_each_job_has_its_identity_and_every_pod_its_own_token(kubectl: Kubectl, ns: str, coordinator: Any) -> None:
    ps0 = coordinator(ns, "tj")
    kubectl.apply(ns, training_job("tj", workers=1))
    job = running(kubectl, ns, "tj", workers=1)

    _, data = identity_secret(kubectl, ns, job)
    key = identity.parse_key(data.pop("key"))
    assert identity.parse_keys(data.pop("accepted")) == (key,)
    verifier = identity.Verifier(key)
    assert {name: verifier.member(token) for name, token in data.items()} == {"ps-0": "ps-0", "worker-0": "worker-0"}
    pods = {p["metadata"]["name"]: p["spec"] for p in kubectl.pods(ns, "tj")}
    files = {name: {i["path"]: i["key"] for v in spec["volumes"] if v["name"] == "elasticps-identity" for i in v["secret"]["items"]}
             for name, spec in pods.items()}  # fmt: skip
    assert files == {"tj-ps-0": {"token": "ps-0", "keys": "accepted"}, "tj-worker-0": {"token": "worker-0"}}  # no key
    env = {name: {e["name"] for e in spec["containers"][0]["env"]} for name, spec in pods.items()}
    assert env == {"tj-ps-0": {"ELASTICPS_TOKEN_FILE", "ELASTICPS_KEY_FILE"}, "tj-worker-0": {"ELASTICPS_TOKEN_FILE"}}

    kubectl("scale", "trainingjob/tj", "-n", ns, "--replicas=2")  # a new worker: its token first
    running(kubectl, ns, "tj", workers=2)
    assert verifier.member(identity_secret(kubectl, ns, job)[1]["worker-1"]) == "worker-1"
    wait_for(lambda: ps0.tokens, 30, "the operator to ask PS 0")
    assert {verifier.member(token) for token in ps0.tokens} == {"observer-operator"}


def test_the_operator_rotates_a_jobs_key_when_asked_in_three_steps(kubectl: Kubectl, ns: str, coordinator: Any) -> None:
    """``kubectl annotate tj J elasticps.io/rotate-identity=...``: the servers accept a new key, the
    tokens move to it, the old one goes; an Event for each step; the pods stay; the operator's own
    calls use the new key."""
    ps0 = coordinator(ns, "tj")
    kubectl.apply(ns, training_job("tj", workers=2))
    job = running(kubectl, ns, "tj", workers=2)
    pods = uids(kubectl.pods(ns, "tj"))
    seen: list[tuple[str, tuple[bytes, ...], bytes, dict[str, str]]] = []

    def step(phase: str) -> bool:
        notes, data = identity_secret(kubectl, ns, job)
        state = (notes["elasticps.io/identity-phase"], identity.parse_keys(data.pop("accepted")), identity.parse_key(data.pop("key")), data)
        if not seen or seen[-1][:3] != state[:3]:
            seen.append(state)
        return state[0] == phase

    assert step("stable")
    old = seen[0][2]
    kubectl("annotate", "trainingjob/tj", "-n", ns, "elasticps.io/rotate-identity=first")
    wait_for(lambda: step("adding"), 60, "the new key accepted")
    wait_for(lambda: step("switched"), 60, "the tokens made under the new key")
    wait_for(lambda: step("stable"), 60, "the old key dropped")
    phases = [s[0] for s in seen]
    assert phases == ["stable", "adding", "switched", "stable"], phases
    new = seen[1][1][1]
    assert new != old
    assert seen[0][1:3] == ((old,), old)
    assert seen[1][1:3] == ((old, new), old)  # adding: tokens still under the old key
    assert seen[2][1:3] == ((old, new), new)  # switched
    assert seen[3][1:3] == ((new,), new)  # stable
    tokens = seen[3][3]
    assert {name: identity.Verifier(new).member(t) for name, t in tokens.items()} == {n: n for n in ("ps-0", "worker-0", "worker-1")}
    assert all(identity.Verifier(old).member(t) is None for t in tokens.values())
    assert uids(kubectl.pods(ns, "tj")) == pods  # nobody restarted
    reasons = [e["message"] for e in kubectl.json("get", "events", "-n", ns)["items"] if e["reason"] == "IdentityRotated"]
    assert sorted(m.split(":")[1].split(";")[0].strip() for m in reasons) == [
        "done, tokens of the old key are refused", "every token is made under the new key", "the servers accept a new key too"]
    ps0.tokens.clear()
    wait_for(lambda: ps0.tokens, 30, "the operator to ask PS 0")
    assert identity.Verifier(new).member(ps0.tokens[-1]) == "observer-operator"
    # The same value again asks for nothing.
    kubectl("annotate", "trainingjob/tj", "-n", ns, "elasticps.io/rotate-identity=first", "--overwrite")
    time.sleep(IDENTITY_GRACE_S + 1)
    assert identity_secret(kubectl, ns, job)[0]["elasticps.io/identity-phase"] == "stable"


def printed_columns(kubectl: Kubectl, ns: str) -> dict[str, str]:
    """The first job's row of ``kubectl get trainingjobs``, by column (empty cells as "")."""
    header, row = kubectl("get", "trainingjobs", "-n", ns).stdout.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    return {name: ("" if cell == "<none>" else cell) for name, cell in zip(names, cells)}


def test_jobs_outlive_the_operator_and_a_later_one_finishes_them(
    kubectl: Kubectl, ns: str, coordinator: Any, operator: Operator
) -> None:
    """`helm uninstall` stops the operator only: a job trains on without it, and the next operator
    takes it over (kopf resumes every job it finds), marks it Succeeded and stops its PS."""
    ps0 = coordinator(ns, "tj")
    ps0.set(finished=False, model_version=10, records_done=100, records_total=1000)
    kubectl.apply(ns, training_job("tj", workers=2))
    running(kubectl, ns, "tj", workers=2)
    operator.stop()
    try:
        ps0.set(finished=True, model_version=80, records_done=1000, records_total=1000, epoch=1)
        for i in range(2):
            kubectl.set_pod_exit(ns, f"tj-worker-{i}", 0)
        time.sleep(2)
        assert kubectl.job(ns, "tj")["status"]["phase"] == "Running"  # nobody reconciles it now
    finally:
        operator.start()
    job = wait_for(lambda: (j := kubectl.job(ns, "tj"))["status"].get("phase") == "Succeeded" and j, 60, "Succeeded")
    assert job["status"]["progress"] == "100%"
    wait_for(lambda: "tj-ps-0" not in phases(kubectl.pods(ns, "tj")), 60, "tj-ps-0 deleted")


# ---- (d) success ----------------------------------------------------------------------------------------
def test_workers_done_and_training_finished_succeed(kubectl: Kubectl, ns: str, coordinator: Any) -> None:
    ps0 = coordinator(ns, "tj")
    ps0.set(finished=False, model_version=42, records_done=500, records_total=1000, epoch=0, loss=0.5)
    kubectl.apply(ns, training_job("tj", workers=2, runPolicy={"cleanPodPolicy": "None"}))
    running(kubectl, ns, "tj", workers=2)
    job = wait_for(lambda: (j := kubectl.job(ns, "tj"))["status"].get("modelVersion") == 42 and j, 30, "progress")
    assert job["status"]["progress"] == "50%" and job["status"]["metrics"] == {"loss": 0.5}
    row = printed_columns(kubectl, ns)
    assert (row["VERSION"], row["PROGRESS"], row["REASON"], row["MESSAGE"]) == ("42", "50%", "", ""), row

    ps0.set(finished=True, model_version=80, records_done=1000, records_total=1000, epoch=1, loss=0.25)
    for i in range(2):
        kubectl.set_pod_exit(ns, f"tj-worker-{i}", 0)
    job = wait_for(lambda: (j := kubectl.job(ns, "tj"))["status"].get("phase") == "Succeeded" and j, 60, "Succeeded")
    assert job["status"].get("completionTime") and job["status"]["progress"] == "100%"
    done = condition(job, "Succeeded")
    assert done is not None and done["status"] == "True"
    running_cond = condition(job, "Running")
    assert running_cond is not None and running_cond["status"] == "False"
    # PS pods never exit on their own: deleted on success; finished workers kept (cleanPodPolicy None).
    wait_for(lambda: "tj-ps-0" not in phases(kubectl.pods(ns, "tj")), 60, "tj-ps-0 deleted")
    assert phases(kubectl.pods(ns, "tj")) == {"tj-worker-0": "Succeeded", "tj-worker-1": "Succeeded"}


def test_a_rollback_after_the_workers_finished_brings_them_back_and_is_never_silent(
    kubectl: Kubectl, ns: str, coordinator: Any
) -> None:
    """PS 0 says work went back to the queue (a shard restored an older checkpoint) after both
    workers exited 0: they are created again (no restart counted), with Retraining and RolledBack
    events and the RolledBack condition."""
    rollback = ("a PS shard restarted from its checkpoint: every shard and the task ledger went back from model "
                "version 646 to 600; 2944 records to train again")
    ps0 = coordinator(ns, "tj")
    ps0.set(finished=False, model_version=600, records_done=9000, records_total=12000, last_rollback=rollback)
    kubectl.apply(ns, training_job("tj", workers=2))
    running(kubectl, ns, "tj", workers=2)
    before = uids(kubectl.pods(ns, "tj"))
    for i in range(2):
        kubectl.set_pod_exit(ns, f"tj-worker-{i}", 0)

    def started_again() -> bool:
        pods = {p["metadata"]["name"]: p for p in kubectl.pods(ns, "tj")}
        return all(
            name in pods and pods[name]["metadata"]["uid"] != before[name] and pods[name]["status"].get("phase") == "Running"
            for name in ("tj-worker-0", "tj-worker-1")
        )

    wait_for(started_again, 60, "both workers started again")
    job = kubectl.job(ns, "tj")
    assert job["status"]["restarts"] == 0
    rolled = condition(job, "RolledBack")
    assert rolled is not None and (rolled["status"], rolled["message"]) == ("True", rollback)
    reasons = {e["reason"]: e for e in kubectl.events(ns, "tj")}
    assert reasons["RolledBack"]["message"] == rollback and reasons["RolledBack"]["type"] == "Warning"
    assert reasons["Retraining"]["message"].endswith("starting tj-worker-0, tj-worker-1 again.")


# ---- (e) validation -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"worker": {"replicas": -1}}, "spec.worker.replicas", "greater than or equal to 0"),
        ({"worker": {"restartPolicy": "Sometimes"}}, "spec.worker.restartPolicy", "Sometimes"),
        ({"training": {"getModelFrequency": 0}}, "spec.training.getModelFrequency", "greater than or equal to 1"),
        ({"ps": {"replicas": 0}}, "spec.ps.replicas", "must be >= 1"),
        ({"training": {"lrStalenessModulation": True}}, "spec.training.lrStalenessModulation", "needs useAsync"),
        ({"training": {"useLocking": True}}, "spec.training.useLocking", "needs useAsync"),
        ({"training": {"overlapPull": True}}, "spec.training.overlapPull", "needs useAsync"),
        ({"training": {"getModelFrequency": 4}}, "spec.training.getModelFrequency", "needs useAsync"),
        ({"training": {"localSGDSteps": 4, "useAsync": True}}, "spec.training.localSGDSteps", "cannot be combined"),
        ({"training": {"adaptiveLocalSGD": True}}, "spec.training.adaptiveLocalSGD", "needs localSGDSteps"),
        ({"training": {"numEpochs": 10**12}}, "spec.training.numEpochs", "less than or equal to 1000000"),
    ],
    ids=[
        "negative-replicas",
        "unknown-restart-policy",
        "zero-get-model-frequency",
        "no-ps",
        "staleness-lr-in-sync",
        "locking-in-sync",
        "overlap-pull-in-sync",
        "ssp-in-sync",
        "localsgd-with-async",
        "adaptive-without-localsgd",
        "absurd-epochs",
    ],
)
def test_the_api_server_refuses_bad_fields(kubectl: Kubectl, ns: str, spec: dict[str, Any], field: str, words: str) -> None:
    refused = kubectl.apply(ns, training_job("bad", **spec), check=False)
    assert refused.returncode != 0
    assert field in refused.stderr and words in refused.stderr, refused.stderr
    assert kubectl("get", "trainingjobs", "-n", ns, "-o", "name").stdout == ""


def test_a_job_the_operator_cannot_run_fails_with_invalid_spec(kubectl: Kubectl, ns: str) -> None:
    # The schema keeps pod templates opaque, so this reaches the operator: Failed, once, no crash loop.
    kubectl.apply(ns, training_job("tj", worker={"template": {"spec": {"containers": "not-a-list"}}}))
    job = wait_for(lambda: (j := kubectl.job(ns, "tj")).get("status", {}).get("phase") == "Failed" and j, 30, "Failed")
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "InvalidSpec"
    assert "spec.worker.template.spec.containers" in failed["message"]
    assert kubectl.pods(ns, "tj") == []


def test_a_template_key_kubernetes_does_not_know_fails_the_job_naming_it(kubectl: Kubectl, ns: str) -> None:
    """The API server decodes each role's pod strictly in a dry run: a typo is InvalidSpec, not dropped."""
    kubectl.apply(ns, training_job("tj", worker={"template": {"spec": {"nodeSelectr": {"disk": "ssd"}}}}))
    job = wait_for(lambda: (j := kubectl.job(ns, "tj")).get("status", {}).get("phase") == "Failed" and j, 30, "Failed")
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("spec.worker.template: the API server refuses the pod:")
    assert 'unknown field "spec.nodeSelectr"' in failed["message"], failed["message"]
    assert (job["status"]["reason"], job["status"]["message"]) == ("InvalidSpec", failed["message"])  # kubectl get tj
    assert kubectl.pods(ns, "tj") == []  # nothing created, not even the PS


# ---- (f) scheduling -------------------------------------------------------------------------------------
def test_a_worker_no_node_can_hold_stays_pending_with_the_schedulers_reason(kubectl: Kubectl, ns: str) -> None:
    kubectl.apply(ns, training_job("tj", workers=1, worker={"resources": {"limits": {"nvidia.com/gpu": 8}}}))

    def unschedulable() -> dict[str, Any] | None:
        job = kubectl.job(ns, "tj")
        found = condition(job, "Unschedulable")
        return job if found is not None and found["status"] == "True" else None

    job = wait_for(unschedulable, 60, "condition Unschedulable")
    message = condition(job, "Unschedulable")["message"]  # type: ignore[index]
    assert message.startswith("tj-worker-0 cannot be scheduled: 0/") and "nodes are available" in message
    assert "Insufficient nvidia.com/gpu" in message
    assert phases(kubectl.pods(ns, "tj"))["tj-worker-0"] == "Pending"
    # Pending (issue 34: PHASE said Created while a condition said why), not Failed before the
    # pending timeout (10 min).
    assert job["status"]["phase"] == "Pending"
    assert any(e["reason"] == "Unschedulable" and e["type"] == "Warning" for e in kubectl.events(ns, "tj"))


# ---- (g) the operator killed ----------------------------------------------------------------------------
def test_operator_killed_mid_job_leaves_no_duplicates_and_the_job_goes_on(
    kubectl: Kubectl, ns: str, operator: Operator
) -> None:
    kubectl.apply(ns, training_job("tj", workers=4))
    wait_for(lambda: kubectl.pods(ns, "tj"), 30, "the first pod")
    operator.kill()  # SIGKILL while it is creating the pods
    operator.start()
    running(kubectl, ns, "tj", workers=4)
    pods = kubectl.pods(ns, "tj")
    assert len(pods) == 5 and len(set(uids(pods))) == 5

    before = uids(pods)
    operator.kill()  # and again while it runs: meanwhile a worker goes and the job is scaled
    kubectl("delete", "pod", "tj-worker-1", "-n", ns, "--wait=false")
    kubectl("scale", "trainingjob/tj", "-n", ns, "--replicas=5")
    wait_for(lambda: "tj-worker-1" not in uids(kubectl.pods(ns, "tj")), 60, "tj-worker-1 gone")
    operator.start()
    job = running(kubectl, ns, "tj", workers=5)
    after = uids(kubectl.pods(ns, "tj"))
    assert sorted(after) == ["tj-ps-0", *(f"tj-worker-{i}" for i in range(5))]
    assert after["tj-worker-1"] != before["tj-worker-1"]
    assert {k: after[k] for k in before if k != "tj-worker-1"} == {k: v for k, v in before.items() if k != "tj-worker-1"}
    assert job["status"]["restarts"] == 0


# ---- (h) a 32-worker job: time to Running and API requests ------------------------------------------------
def test_32_worker_job_time_to_running_and_api_requests(
    kubectl: Kubectl, ns: str, operator: Operator, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    manifest = tmp_path / "big.yaml"
    manifest.write_text(yaml.safe_dump(training_job("big", workers=32, n_ps=2)))
    key = f"{ns}/big"

    t0 = time.monotonic()
    kubectl("apply", "-n", ns, "-f", str(manifest))

    def all_running() -> bool:
        found = phases(kubectl.pods(ns, "big"))
        return len(found) == 34 and set(found.values()) == {"Running"}

    wait_for(all_running, 120, "34 pods Running", interval=0.1)
    seconds = time.monotonic() - t0
    running(kubectl, ns, "big", workers=32, ps=2, timeout=60)

    def settled() -> dict[str, Any] | None:  # the count stops moving once the operator is idle
        first = operator.stats().get("jobs", {}).get(key)
        time.sleep(1.5)
        second = operator.stats().get("jobs", {}).get(key)
        return second if first and first == second else None

    counts = wait_for(settled, 30, "the operator's request count to settle", interval=0)
    line = (
        f"32-worker job (2 PS + 32 workers): all 34 pods Running {seconds:.1f} s after `kubectl apply`; "
        f"operator API requests for the job until Running/32 ready: {counts['total']} "
        f"({', '.join(f'{k}: {v}' for k, v in sorted(counts['requests'].items()))})"
    )
    print("\n" + line)
    request.config._elasticps_measurements = [*getattr(request.config, "_elasticps_measurements", []), line]  # type: ignore[attr-defined]
    assert counts["requests"]["elasticps create pods"] == 34
    assert counts["requests"]["elasticps dry-run create pods"] == 2  # one strict check per role (validating)
    assert counts["requests"]["elasticps create services"] == 2


def test_the_operator_serves_its_reconcile_metrics(kubectl: Kubectl, ns: str, operator: Operator) -> None:
    kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "mnist-sync.yaml"))
    running(kubectl, ns, "mnist-sync", workers=3, ps=1)
    text = scrape(operator.metrics_port)
    passes = [line for line in text.splitlines() if line.startswith('elasticps_operator_reconciles_total{outcome="ok"}')]
    assert passes and float(passes[0].split()[-1]) >= 1
    assert 'elasticps_operator_actions_total{kind="CreatePod"}' in text
    assert "elasticps_operator_reconcile_seconds_bucket" in text
    # Its start-up line names where it reads a job's progress, filled in (issue 34: "{coordinator}").
    [started] = {line.split("elasticps operator: ", 1)[1] for line in operator.log_path.read_text().splitlines()
                 if "elasticps operator: watching" in line}  # fmt: skip
    assert "coordinators at unix://" in started and "/NAMESPACE.JOB.sock" in started, started
    assert "{" not in started, started


# ---- (i) a 64-worker job: bounded requests, early status, one event per batch, one delete -------------
def test_64_worker_job_bounded_requests_early_status_batched_events_and_one_delete(
    kubectl: Kubectl, ns: str, operator: Operator
) -> None:
    pods = 66
    key = f"{ns}/big"
    jobs = Watch(kubectl.env, f"/apis/elasticps.io/v1alpha1/namespaces/{ns}/trainingjobs").start()
    pod_events = Watch(kubectl.env, f"/api/v1/namespaces/{ns}/pods").start()
    time.sleep(0.5)  # both watches are open
    try:
        kubectl.apply(ns, training_job("big", workers=64, n_ps=2))

        def all_running() -> bool:
            found = phases(kubectl.pods(ns, "big"))
            return len(found) == pods and set(found.values()) == {"Running"}

        wait_for(all_running, 120, f"{pods} pods Running")
        running(kubectl, ns, "big", workers=64, ps=2, timeout=60)

        # The status was written before the first pod existed: the API server's order (resourceVersions).
        first_status = next(rv for kind, _, rv, obj in jobs.events if obj.get("status", {}).get("phase"))
        def added() -> list[int]:
            return [rv for kind, _, rv, _ in pod_events.events if kind == "ADDED"]

        # The watch's reader may lag behind kubectl on a loaded machine, and the API server closes a
        # watch that falls too far behind: what it delivered is then the stream's first part.
        wait_for(lambda: len(added()) == pods or pod_events.ended.is_set(), 60, "every pod's ADDED event")
        created = added()
        assert created and (len(created) == pods or pod_events.ended.is_set()), created
        assert sum(rv < first_status for rv in created) == 0
        first = next(obj for _, _, _, obj in jobs.events if obj.get("status", {}).get("phase"))
        assert first["status"]["phase"] == "Created" and first["status"]["workers"] == "0/64"

        # One Event for the batch, not one per pod.
        events = kubectl.events(ns, "big")
        created_events = [e["message"] for e in events if e["reason"] == "SuccessfulCreatePod"]
        assert created_events == [f"Created {pods} pods: big-ps-0, big-ps-1, big-worker-0, big-worker-1 and 62 more"]
        assert len(events) <= 8, [(e["reason"], e["message"]) for e in events]

        def settled() -> dict[str, Any] | None:
            before = operator.stats().get("jobs", {}).get(key)
            time.sleep(1.5)
            after = operator.stats().get("jobs", {}).get(key)
            return after if before and before == after else None

        counts = wait_for(settled, 30, "the operator's request count to settle", interval=0)["requests"]
        print(f"\n64-worker job: {sum(counts.values())} requests: {counts}")
        assert counts["elasticps create pods"] == pods and counts["elasticps create events"] <= 8
        # Beside one create per pod, only what each pass makes (a get, three lists, a status patch):
        # nothing else per pod (the old 2 per pod + 18 would be 150).
        passes = counts["elasticps get trainingjobs"]
        assert sum(counts.values()) <= pods + 3 + 8 + 5 * passes + 4, counts

        # Deleting the job deletes its pods with one request, not one per pod.
        kubectl("delete", "trainingjob", "big", "-n", ns, "--wait=false")
        wait_for(lambda: not kubectl.pods(ns, "big"), 120, "every pod of the job gone")
        after = wait_for(settled, 30, "the operator's request count to settle", interval=0)["requests"]
        assert after.get("elasticps deletecollection pods") == 1 and "elasticps delete pods" not in after, after
        assert sum(after.values()) - sum(counts.values()) <= 3, after
    finally:
        jobs.stop()
        pod_events.stop()
