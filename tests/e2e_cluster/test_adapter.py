"""The kopf adapter's own parts, without a cluster: reading pods, counting requests, the work queue and
the order actions are carried out in. (The cluster tests beside it run the whole thing for real.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from elasticps.api.replicas import Role
from elasticps.operator.cluster_api import ApiError
from elasticps.operator.counting import RequestCounter, describe
from elasticps.operator.executing import JobRef, Outcome, execute
from elasticps.operator.observing import observe_pod, coordinator_running
from elasticps.api.spec import SchedulingPolicy, TrainingJob
from elasticps.operator.rendering import (
    CreateGroup, CreateNetworkPolicy, CreatePod, CreateService, DeleteGroup, DeletePod, Renderer,
)  # fmt: skip
from elasticps.operator.scheduling import GroupObject, PodDecoration
from elasticps.planning.actions import Event, Recheck, SetStatus
from elasticps.planning.observed import PodPhase
from elasticps.planning.progress import job_progress
from elasticps.planning.settings import PlannerSettings
from elasticps.operator.queueing import WorkQueue
from elasticps.operator.metrics import OperatorMetrics
from elasticps.operator.reconciling import JobKey, Reconcile
from elasticps.operator.throttling import RateLimiter
from elasticps.proto import elasticps_pb2 as pb

UID = "job-uid"


def pod_json(name: str, phase: str = "Running", **extra: Any) -> dict[str, Any]:
    role, index = name.split("-")[-2:]
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"elasticps.io/job-name": "tj", "elasticps.io/replica-type": role, "elasticps.io/replica-index": index},
            "ownerReferences": [{"kind": "TrainingJob", "name": "tj", "uid": UID, "controller": True}],
        },
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]},
    }
    for key, value in extra.items():
        body[key] = {**body[key], **value}
    return body


# ---- observing ----------------------------------------------------------------------------------------
def test_a_running_pod() -> None:
    pod = observe_pod(pod_json("tj-worker-3"), "tj", UID)
    assert pod is not None
    assert (pod.name, pod.role, pod.index, pod.phase, pod.ready, pod.uid) == (
        "tj-worker-3", Role.WORKER, 3, PodPhase.RUNNING, True, "uid-tj-worker-3"
    )
    assert pod.exit_code is None and not pod.deleted


def test_a_failed_pod_has_its_containers_exit_code() -> None:
    status = {"phase": "Failed", "containerStatuses": [
        {"name": "sidecar", "state": {"terminated": {"exitCode": 2}}},
        {"name": "elasticps", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
    ]}  # fmt: skip
    pod = observe_pod(pod_json("tj-worker-0", status=status), "tj", UID)
    assert pod is not None and pod.phase is PodPhase.FAILED and pod.exit_code == 137 and pod.reason == "OOMKilled"


def test_an_unschedulable_pod_says_why_and_since_when() -> None:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "lastTransitionTime": "2024-05-01T12:00:00Z", "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}  # fmt: skip
    pod = observe_pod(pod_json("tj-worker-0", status={"phase": "Pending", "conditions": [condition]}), "tj", UID)
    assert pod is not None and pod.phase is PodPhase.PENDING
    assert pod.unschedulable_since == 1714564800.0 and pod.reason == "Unschedulable"
    assert pod.message.startswith("0/4 nodes are available")


def test_a_pod_whose_image_cannot_be_pulled_says_why_and_since_when() -> None:
    status = {"phase": "Pending",
              "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-05-01T12:00:00Z"}],
              "containerStatuses": [{"name": "elasticps", "state": {"waiting": {
                  "reason": "ImagePullBackOff", "message": 'Back-off pulling image "elasticps:nope"'}}}]}  # fmt: skip
    pod = observe_pod(pod_json("tj-worker-0", status=status), "tj", UID)
    assert pod is not None and pod.cannot_start_since == 1714564800.0
    assert (pod.reason, pod.message) == ("ImagePullBackOff", 'Back-off pulling image "elasticps:nope"')
    assert pod.unschedulable_since is None


def test_a_container_creating_normally_is_not_stuck() -> None:
    status = {"phase": "Pending", "containerStatuses": [
        {"name": "elasticps", "state": {"waiting": {"reason": "ContainerCreating"}}}]}  # fmt: skip
    pod = observe_pod(pod_json("tj-worker-0", status=status), "tj", UID)
    assert pod is not None and pod.cannot_start_since is None


def test_a_pod_of_an_earlier_job_of_the_same_name_counts_as_going() -> None:
    old = pod_json("tj-worker-0", metadata={"ownerReferences": [{"kind": "TrainingJob", "uid": "old", "controller": True}]})
    pod = observe_pod(old, "tj", UID)
    assert pod is not None and pod.deleted


def test_deleting_pods_and_stray_labels() -> None:
    going = observe_pod(pod_json("tj-ps-0", metadata={"deletionTimestamp": "2024-05-01T12:00:00Z"}), "tj", UID)
    assert going is not None and going.deleted and not coordinator_running([going])
    relabelled = pod_json("tj-worker-2", metadata={"labels": {"elasticps.io/job-name": "tj"}})
    found = observe_pod(relabelled, "tj", UID)
    assert found is not None and (found.role, found.index) == (Role.WORKER, 2)
    assert observe_pod(pod_json("other-worker-0"), "tj", UID) is None


def test_coordinator_reply() -> None:
    reply = pb.JobStatus(finished=True, epoch=2, records_done=250, records_total=1000, model_version=9, loss=0.5)
    reply.metrics["accuracy"] = 0.75
    progress = job_progress(reply)
    assert (progress.finished, progress.epoch, progress.model_version, progress.progress) == (True, 2, 9, 0.25)
    assert progress.metrics == {"accuracy": 0.75, "loss": 0.5}
    assert job_progress(pb.JobStatus(loss=float("nan"))).metrics == {}


# ---- counting -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", "https://h/api/v1/namespaces/ns/pods?labelSelector=a%3Db", ("list", "pods", None)),
        ("GET", "https://h/api/v1/pods?watch=true&timeoutSeconds=300", ("watch", "pods", None)),
        ("POST", "https://h/api/v1/namespaces/ns/events", ("create", "events", None)),
        ("POST", "https://h/api/v1/namespaces/ns/pods?dryRun=All&fieldValidation=Strict", ("dry-run create", "pods", None)),
        ("DELETE", "https://h/api/v1/namespaces/ns/pods/p", ("delete", "pods", None)),
        ("GET", "https://h/apis/elasticps.io/v1alpha1/namespaces/ns/trainingjobs/j", ("get", "trainingjobs", "ns/j")),
        ("PATCH", "https://h/apis/elasticps.io/v1alpha1/namespaces/ns/trainingjobs/j/status",
         ("patch", "trainingjobs/status", "ns/j")),
        ("GET", "https://h/apis/elasticps.io/v1alpha1", ("get", "/apis/elasticps.io/v1alpha1", None)),
    ],
)
def test_requests_are_described_like_audit_log_verbs(method: str, url: str, expected: tuple[str, str, str | None]) -> None:
    assert describe(method, url) == expected


def test_counts_by_source_kind_and_job() -> None:
    counter = RequestCounter()
    counter.record("elasticps", "GET", "https://h/api/v1/namespaces/ns/pods", job="ns/j")
    counter.record("kopf", "PATCH", "https://h/apis/elasticps.io/v1alpha1/namespaces/ns/trainingjobs/j")
    counter.record("kopf", "GET", "https://h/api/v1/pods?watch=true")
    snap = counter.snapshot()
    assert snap["total"] == 3 and snap["by_source"] == {"elasticps": 1, "kopf": 2}
    assert snap["jobs"]["ns/j"]["requests"] == {"elasticps list pods": 1, "kopf patch trainingjobs": 1}


# ---- executing ----------------------------------------------------------------------------------------
class FakeApi:
    def __init__(self, existing: tuple[str, ...] = (), refuse: dict[str, ApiError] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.existing = set(existing)
        self.refuse = refuse or {}

    def create(self, namespace: str, plural: str, manifest: dict[str, Any]) -> bool:
        name = manifest["metadata"].get("name") or manifest.get("reason", "")
        self.calls.append((f"create {plural}", name))
        if plural == "events":
            self.events.append((name, manifest["reason"], manifest["message"]))
        if name in self.refuse:
            raise self.refuse[name]
        return name not in self.existing

    def delete_pod(self, namespace: str, name: str, uid: str = "") -> bool:
        self.calls.append(("delete pods", f"{name}@{uid}"))
        return True

    def patch_job_status(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        self.calls.append(("patch status", str(sorted(patch))))
        return True

    def delete_job(self, namespace: str, name: str) -> bool:
        self.calls.append(("delete job", name))
        return True


def pod_action(name: str, role: str) -> CreatePod:
    return CreatePod({"metadata": {"name": name, "labels": {"elasticps.io/replica-type": role}}})


def test_actions_run_deletes_status_policy_services_ps_workers_events_in_that_order() -> None:
    api = FakeApi(existing=("tj-worker-1",))
    actions = [
        pod_action("tj-worker-1", "worker"), pod_action("tj-ps-0", "ps"), CreateService({"metadata": {"name": "tj-ps-0"}}),
        CreateNetworkPolicy({"metadata": {"name": "tj-ps"}}), DeletePod("tj-worker-0", "replacing it"), Event("Restarting", "..."), SetStatus({"phase": "Restarting"}),
        Recheck(5.0),
    ]  # fmt: skip
    outcome = execute(actions, api, JobRef("ns", "tj", UID), {"tj-worker-0": "u0"}, now=0.0)  # type: ignore[arg-type]
    assert [c for c in api.calls if c[0] != "create events"] == [
        ("delete pods", "tj-worker-0@u0"),  # only the pod that was observed
        ("patch status", "['phase']"),  # before the creates: a large job shows its status at once
        ("create networkpolicies", "tj-ps"),  # before any PS pod can be reached
        ("create services", "tj-ps-0"),
        ("create pods", "tj-ps-0"),
        ("create pods", "tj-worker-1"),  # 409: already there, no event for it
    ]
    events = [c[1] for c in api.calls if c[0] == "create events"]
    assert events == ["SuccessfulDeletePod", "SuccessfulCreateNetworkPolicy", "SuccessfulCreateService",
                      "SuccessfulCreatePod", "Restarting"]
    assert outcome == Outcome(recheck_after=5.0)


def test_a_large_pass_is_sent_concurrently_in_stages_with_one_event_per_batch() -> None:
    api = FakeApi(refuse={f"tj-worker-{i}": ApiError(422, "Invalid", "no") for i in (3, 7)})
    workers = [pod_action(f"tj-worker-{i}", "worker") for i in range(200)]
    services = [CreateService({"metadata": {"name": f"tj-ps-{i}"}}) for i in range(12)]
    deletes = [DeletePod(f"tj-old-{i}", "scaled down") for i in range(30)]
    actions = [*workers, *services, pod_action("tj-ps-0", "ps"), *deletes, SetStatus({"phase": "Created"})]
    outcome = execute(actions, api, JobRef("ns", "tj", UID), {}, now=0.0, concurrency=8)  # type: ignore[arg-type]
    assert outcome.retry and len(outcome.errors) == 2
    kinds = [c[0] for c in api.calls if c[0] != "create events"]
    # Each stage finishes before the next starts, whatever order its requests went out in.
    assert kinds == ["delete pods"] * 30 + ["patch status"] + ["create services"] * 12 + ["create pods"] * 201
    assert api.calls.index(("create pods", "tj-ps-0")) < min(api.calls.index(("create pods", w.manifest["metadata"]["name"])) for w in workers)
    events = {c[1]: c[2] for c in api.events}
    # One each for the deleted, the services and the pods, not one per object; two failures: one each.
    assert len(api.events) == 5
    assert events["SuccessfulDeletePod"] == "Deleted 30 pods (scaled down): tj-old-0, tj-old-1, tj-old-2, tj-old-3 and 26 more."
    assert events["SuccessfulCreateService"] == "Created 12 services: tj-ps-0, tj-ps-1, tj-ps-2, tj-ps-3 and 8 more"
    assert events["SuccessfulCreatePod"] == "Created 199 pods: tj-ps-0, tj-worker-0, tj-worker-1, tj-worker-2 and 195 more"
    assert ("FailedCreatePod", "Error creating pod tj-worker-3: no") in [c[1:] for c in api.events]


def test_the_rate_limit_lets_a_burst_through_then_paces_at_qps() -> None:
    now = [0.0]
    limiter = RateLimiter(qps=100, burst=10, clock=lambda: now[0])
    assert [limiter.reserve() for _ in range(10)] == [0.0] * 10  # the burst
    waits = [limiter.reserve() for _ in range(5)]  # then one every 10 ms, in the order asked
    assert waits == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    now[0] = 1.0  # a second later the bucket is full again, never fuller than the burst
    assert [limiter.reserve() for _ in range(10)] == [0.0] * 10 and limiter.reserve() == pytest.approx(0.01)
    assert RateLimiter(qps=0, burst=0).reserve() == 0.0  # no limit


def test_every_request_waits_at_the_shared_limit() -> None:
    async def kopf_side(limiter: RateLimiter) -> None:
        await limiter.wait_async()

    counter = RequestCounter(clock=lambda: 1000.5)
    counter.record("elasticps", "POST", "https://h/api/v1/namespaces/ns/pods", job="ns/j")
    counter.record("elasticps", "DELETE", "https://h/api/v1/namespaces/ns/pods?labelSelector=x", job="ns/j")
    snap = counter.snapshot()
    assert snap["peak_qps"] == 2 and snap["per_second"] == {"1000": 2}
    assert snap["jobs"]["ns/j"]["last_at"] == {"elasticps create pods": 1000.5, "elasticps deletecollection pods": 1000.5}
    limiter = RateLimiter(qps=1000, burst=1)
    asyncio.run(kopf_side(limiter))
    assert limiter.reserve() > 0  # kopf's request took the one token


def test_a_refused_create_is_reported_and_retried_but_the_status_is_written() -> None:
    api = FakeApi(refuse={"tj-ps-0": ApiError(422, "Invalid", "spec.containers[0].image: Required value")})
    outcome = execute([pod_action("tj-ps-0", "ps"), SetStatus({"phase": "Created"})], api, JobRef("ns", "tj", UID), {}, 0.0)  # type: ignore[arg-type]
    assert outcome.retry and "422" in outcome.errors[0]
    assert ("create events", "FailedCreatePod") in api.calls and ("patch status", "['phase']") in api.calls


def test_nothing_more_in_a_terminating_namespace() -> None:
    terminating = ApiError(403, "Forbidden", "namespace is being terminated", ("NamespaceTerminating",))
    api = FakeApi(refuse={"tj-ps-0": terminating})
    outcome = execute([pod_action("tj-ps-0", "ps"), SetStatus({"phase": "Created"})], api, JobRef("ns", "tj", UID), {}, 0.0)  # type: ignore[arg-type]
    assert outcome == Outcome() and api.calls == [("patch status", "['phase']"), ("create pods", "tj-ps-0")]


# ---- one pass ------------------------------------------------------------------------------------------
class JobApi(FakeApi):
    def __init__(self, spec: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        super().__init__()
        self.spec, self.pods = spec, pods
        self.policies: list[dict[str, Any]] | None = [{"metadata": {"name": "tj-ps"}}]

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(("get job", name))
        meta = {"name": name, "namespace": namespace, "uid": UID, "generation": 3}
        return {"apiVersion": "elasticps.io/v1alpha1", "kind": "TrainingJob", "metadata": meta, "spec": self.spec}

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        self.calls.append(("list pods", job))
        return self.pods

    def list_services(self, namespace: str, job: str) -> list[dict[str, Any]]:
        self.calls.append(("list services", job))
        return [{"metadata": {"name": "tj-ps-0"}}]

    def list_network_policies(self, namespace: str, job: str) -> list[dict[str, Any]] | None:
        self.calls.append(("list networkpolicies", job))
        return self.policies

    def dry_run_pod(self, namespace: str, manifest: dict[str, Any]) -> str | None:
        self.calls.append(("dry-run pods", manifest["metadata"]["name"]))
        return None

    # The job's identity Secret, kept here; not recorded in ``calls`` (the passes' API calls are
    # asserted elsewhere; the Secret's own tests are in tests/e2e_cluster/test_operator.py).
    secrets: dict[str, dict[str, Any]]

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return getattr(self, "secrets", {}).get(name)

    def patch_secret(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        self.secrets[name]["data"].update(patch.get("data", {}))
        return True

    def create(self, namespace: str, plural: str, manifest: dict[str, Any]) -> bool:
        if plural != "secrets":
            return super().create(namespace, plural, manifest)
        if not hasattr(self, "secrets"):
            self.secrets = {}
        self.secrets[manifest["metadata"]["name"]] = manifest
        return True


def test_a_pass_creates_the_network_policy_only_when_it_can_list_them() -> None:
    spec = {"model": {"modelDef": "m"}, "data": {"training": "/d"}}
    for listed, created in (([], True), ([{"metadata": {"name": "tj-ps"}}], False), (None, False)):
        api = JobApi(spec, [])
        api.policies = listed
        Reconcile(api, NoCoordinator(), PlannerSettings(), clock=lambda: 1e9)(JobKey("ns", "tj"))  # type: ignore[arg-type]
        assert (("create networkpolicies", "tj-ps") in api.calls) is created, listed


class NoCoordinator:
    def __init__(self) -> None:
        self.asked = 0

    def progress(self, namespace: str, job: str, replica: str = "", token: str = "") -> None:
        self.asked += 1
        return None


def test_a_spec_the_parser_refuses_fails_the_job_once_without_listing_anything() -> None:
    api = JobApi({"model": {"modelDef": "m"}, "data": {"training": "/d"}, "training": {"getModelFrequency": 0}}, [])
    outcome = Reconcile(api, NoCoordinator(), PlannerSettings(), clock=lambda: 1e9)(JobKey("ns", "tj"))  # type: ignore[arg-type]
    assert outcome == Outcome(finished=True)  # Failed: no idle resync from now on
    assert [c[0] for c in api.calls] == ["get job", "patch status", "create events"]
    assert ("create events", "InvalidSpec") in api.calls


def test_templates_are_dry_run_once_per_generation_and_a_refusal_fails_the_job_before_any_pod() -> None:
    spec = {"model": {"modelDef": "m"}, "data": {"training": "/d"}}
    api = JobApi(spec, [])
    reconcile = Reconcile(api, NoCoordinator(), PlannerSettings(), clock=lambda: 1e9)  # type: ignore[arg-type]
    reconcile(JobKey("ns", "tj"))
    reconcile(JobKey("ns", "tj"))  # the same generation: not asked again
    assert [c for c in api.calls if c[0] == "dry-run pods"] == [("dry-run pods", "tj-ps-0"), ("dry-run pods", "tj-worker-0")]

    class Strict(JobApi):
        def dry_run_pod(self, namespace: str, manifest: dict[str, Any]) -> str | None:
            self.calls.append(("dry-run pods", manifest["metadata"]["name"]))
            if manifest["metadata"]["name"] == "tj-worker-0":
                return 'Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.nodeSelectr"'
            return None

    refusing = Strict(spec, [])
    outcome = Reconcile(refusing, NoCoordinator(), PlannerSettings(), clock=lambda: 1e9)(JobKey("ns", "tj"))  # type: ignore[arg-type]
    assert outcome == Outcome(finished=True)
    assert [c[0] for c in refusing.calls] == ["get job", "dry-run pods", "dry-run pods", "patch status", "create events"]
    assert ("create events", "InvalidSpec") in refusing.calls


def test_a_pass_lists_pods_asks_ps0_only_when_it_runs_and_creates_what_is_missing() -> None:
    spec = {"model": {"modelDef": "m"}, "data": {"training": "/d"}, "worker": {"replicas": 2}}
    probe = NoCoordinator()
    api = JobApi(spec, [pod_json("tj-ps-0", "Pending"), pod_json("tj-worker-0")])
    Reconcile(api, probe, PlannerSettings(), clock=lambda: 1e9)(JobKey("ns", "tj"))  # type: ignore[arg-type]
    assert probe.asked == 0
    assert ("create pods", "tj-worker-1") in api.calls and ("create pods", "tj-worker-0") not in api.calls
    api.pods = [pod_json("tj-ps-0"), pod_json("tj-worker-0"), pod_json("tj-worker-1")]
    Reconcile(api, probe, PlannerSettings(), clock=lambda: 1e9)(JobKey("ns", "tj"))  # type: ignore[arg-type]
    assert probe.asked == 1


def test_passes_their_time_and_actions_are_counted() -> None:
    spec = {"model": {"modelDef": "m"}, "data": {"training": "/d"}, "worker": {"replicas": 2}}
    registry = CollectorRegistry()
    reconcile = Reconcile(
        JobApi(spec, [pod_json("tj-ps-0", "Pending"), pod_json("tj-worker-0")]),  # type: ignore[arg-type]
        NoCoordinator(), PlannerSettings(), clock=lambda: 1e9, metrics=OperatorMetrics(registry),  # type: ignore[arg-type]
    )
    reconcile(JobKey("ns", "tj"))
    assert registry.get_sample_value("elasticps_operator_reconciles_total", {"outcome": "ok"}) == 1
    assert registry.get_sample_value("elasticps_operator_reconcile_seconds_count") == 1
    assert registry.get_sample_value("elasticps_operator_actions_total", {"kind": "CreatePod"}) == 1  # worker-1
    reconcile.api = None  # type: ignore[assignment]  # the next pass fails: counted as an error
    with pytest.raises(AttributeError):
        reconcile(JobKey("ns", "tj"))
    assert registry.get_sample_value("elasticps_operator_reconciles_total", {"outcome": "error"}) == 1


# ---- the work queue -------------------------------------------------------------------------------------
class Passes:
    """A pass function recording its calls; ``outcomes`` are returned in turn, then Outcome()."""

    def __init__(self, *outcomes: Outcome | Exception) -> None:
        self.calls: list[JobKey] = []
        self.outcomes = list(outcomes)
        self.lock = threading.Lock()

    def __call__(self, key: JobKey) -> Outcome:
        with self.lock:
            self.calls.append(key)
            item = self.outcomes.pop(0) if self.outcomes else Outcome()
        if isinstance(item, Exception):
            raise item
        return item


async def settle(seconds: float) -> None:
    await asyncio.sleep(seconds)


def test_a_burst_of_requests_makes_one_pass() -> None:
    async def scenario() -> Passes:
        passes = Passes()
        queue = WorkQueue(passes, debounce_s=0.05, resync_s=60)
        for _ in range(50):
            queue.request(JobKey("ns", "a"))
        queue.request(JobKey("ns", "b"))
        await settle(0.3)
        await queue.close()
        return passes

    passes = asyncio.run(scenario())
    assert sorted(passes.calls, key=str) == [JobKey("ns", "a"), JobKey("ns", "b")]


def test_recheck_failures_gone_and_idle_resync() -> None:
    async def scenario() -> tuple[Passes, WorkQueue]:
        key = JobKey("ns", "a")
        passes = Passes(Outcome(recheck_after=0.2), RuntimeError("apiserver down"), Outcome(), Outcome(gone=True))
        queue = WorkQueue(passes, debounce_s=0.01, resync_s=0.5, max_backoff_s=0.1)
        queue.request(key)
        # pass 1 asks for a recheck in 0.2 s; pass 2 fails and is retried after the (capped) backoff;
        # pass 3 is a plain pass; pass 4, after an idle resync of 0.5 s, finds the job gone.
        await settle(1.5)
        return passes, queue

    passes, queue = asyncio.run(scenario())
    assert len(passes.calls) == 4 and queue.jobs == []


def test_a_finished_job_is_not_resynced_but_still_served_on_request() -> None:
    async def scenario() -> Passes:
        key = JobKey("ns", "done")
        passes = Passes(Outcome(finished=True), Outcome(finished=True))
        queue = WorkQueue(passes, debounce_s=0.01, resync_s=0.1)
        queue.request(key)
        await settle(0.6)  # a running job would have had ~5 resyncs by now
        queue.request(key)  # e.g. one of its pods changed
        await settle(0.1)
        await queue.close()
        return passes

    assert len(asyncio.run(scenario()).calls) == 2


# ---- scheduling policies: the executor creates and deletes their group objects --------------------------
class GroupApi(FakeApi):
    def delete(self, namespace: str, plural: str, api_version: str, name: str) -> bool:
        self.calls.append((f"delete {plural}", f"{api_version} {name}"))
        if name in self.refuse:
            raise self.refuse[name]
        return name in self.existing


GROUP = CreateGroup("podgroups", {"apiVersion": "scheduling.example.io/v1", "kind": "PodGroup", "metadata": {"name": "tj"}})


def test_the_group_is_created_before_anything_else_of_the_pass() -> None:
    api = GroupApi()
    actions = [CreateNetworkPolicy({"metadata": {"name": "tj-ps"}}), GROUP, pod_action("tj-ps-0", "ps"), SetStatus({"phase": "Created"})]
    outcome = execute(actions, api, JobRef("ns", "tj", UID), {}, now=0.0)  # type: ignore[arg-type]
    assert [c for c in api.calls if c[0] != "create events"] == [
        ("patch status", "['phase']"), ("create podgroups", "tj"), ("create networkpolicies", "tj-ps"), ("create pods", "tj-ps-0"),
    ]  # fmt: skip
    assert [e[1:] for e in api.events][:2] == [("SuccessfulCreatePodGroup", "Created PodGroup: tj"),
                                               ("SuccessfulCreateNetworkPolicy", "Created network policy: tj-ps")]  # fmt: skip
    assert outcome == Outcome()
    again = GroupApi(existing=("tj",))  # a later pass: 409, no Event, no retry
    assert execute([GROUP], again, JobRef("ns", "tj", UID), {}, now=0.0) == Outcome()  # type: ignore[arg-type]
    assert again.events == []


def test_a_group_the_api_refuses_is_retried_and_reported() -> None:
    api = GroupApi(refuse={"tj": ApiError(404, "NotFound", "the server could not find the requested resource")})
    outcome = execute([GROUP, pod_action("tj-ps-0", "ps")], api, JobRef("ns", "tj", UID), {}, now=0.0)  # type: ignore[arg-type]
    assert outcome.retry and "creating PodGroup tj" in outcome.errors[0]
    assert ("FailedCreatePodGroup", "Error creating PodGroup tj: the server could not find the requested resource") in [e[1:] for e in api.events]


def test_the_group_of_a_finished_job_is_deleted() -> None:
    api = GroupApi(existing=("tj",))
    delete = DeleteGroup("scheduling.example.io/v1", "podgroups", "PodGroup", "tj")
    actions = [SetStatus({"phase": "Succeeded"}), delete, DeletePod("tj-worker-0", "cleanPodPolicy All")]
    assert execute(actions, api, JobRef("ns", "tj", UID), {}, now=0.0) == Outcome()  # type: ignore[arg-type]
    assert [c for c in api.calls if c[0] != "create events"] == [
        ("delete pods", "tj-worker-0@"), ("delete podgroups", "scheduling.example.io/v1 tj"), ("patch status", "['phase']"),
    ]  # fmt: skip
    assert ("SuccessfulDeletePodGroup", "Deleted PodGroup tj: the job finished.") in [e[1:] for e in api.events]
    gone = GroupApi()  # already deleted: no Event
    assert execute([delete], gone, JobRef("ns", "tj", UID), {}, now=0.0) == Outcome() and gone.events == []  # type: ignore[arg-type]
    failing = GroupApi(refuse={"tj": ApiError(500, "InternalError", "etcd")})
    assert execute([delete], failing, JobRef("ns", "tj", UID), {}, now=0.0).retry  # type: ignore[arg-type]
    assert [e[1] for e in failing.events] == ["FailedDeletePodGroup"]


class OneGroup:
    """A test-only policy: every pod goes to ``gang`` and waits at a gate; one PodGroup per job."""

    def pod(self, job: TrainingJob, role: Role, index: int) -> PodDecoration:
        return PodDecoration(scheduler_name="gang", labels={"group": job.name}, scheduling_gates=("example.io/admit",))

    def groups(self, job: TrainingJob) -> tuple[GroupObject, ...]:
        return (GroupObject("podgroups", {"apiVersion": "scheduling.example.io/v1", "kind": "PodGroup", "metadata": {"name": job.name}}),)


class CreatedApi(JobApi):
    def __init__(self, spec: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        super().__init__(spec, pods)
        self.manifests: dict[str, dict[str, Any]] = {}

    def create(self, namespace: str, plural: str, manifest: dict[str, Any]) -> bool:
        self.manifests[manifest["metadata"].get("name", "")] = manifest
        return super().create(namespace, plural, manifest)


def test_a_pass_under_a_policy_creates_its_group_then_its_decorated_pods() -> None:
    spec = {"model": {"modelDef": "m"}, "data": {"training": "/d"}, "worker": {"replicas": 1}}
    api = CreatedApi(spec, [])
    renderer = Renderer(policies={SchedulingPolicy.NONE: OneGroup()})
    Reconcile(api, NoCoordinator(), PlannerSettings(), clock=lambda: 1e9, renderer=renderer)(JobKey("ns", "tj"))  # type: ignore[arg-type]
    creates = [c for c in api.calls if c[0].startswith("create") and c[0] != "create events"]
    assert creates[0] == ("create podgroups", "tj") and ("create pods", "tj-worker-0") in creates
    assert api.manifests["tj"]["metadata"]["ownerReferences"][0]["uid"] == UID
    pod = api.manifests["tj-worker-0"]
    assert pod["spec"]["schedulerName"] == "gang" and pod["spec"]["schedulingGates"] == [{"name": "example.io/admit"}]
    assert pod["metadata"]["labels"]["group"] == "tj"
