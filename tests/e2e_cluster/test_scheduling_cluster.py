"""A scheduling policy's group object against a real API server and garbage collector: the executor
creates it (in its API group, owned by the job), a second create is a quiet 409, the executor
deletes it when the job finishes, and deleting the job deletes it too.

The group object here is a PodDisruptionBudget (``policy/v1``): an API group every cluster serves,
standing in for a PodGroup, whose CRD (Volcano's, the scheduler-plugins') this cluster does not have.
The policy is a test's own; the operator process of the session runs the built-in ``none``, and
the job is suspended so it makes no pods of its own meanwhile.
"""

from __future__ import annotations

from typing import Any

import kubernetes.client
import kubernetes.config
import pytest

from cluster_kit import Kubectl, training_job, wait_for

from elasticps.api.parsing import parse_job
from elasticps.api.replicas import Role
from elasticps.api.spec import SchedulingPolicy, TrainingJob
from elasticps.operator.cluster_api import ClusterApi
from elasticps.operator.counting import RequestCounter
from elasticps.operator.executing import JobRef, Outcome, execute
from elasticps.operator.manifests import LABEL_JOB
from elasticps.operator.rendering import Renderer
from elasticps.operator.scheduling import GroupObject, PodDecoration
from elasticps.planning.actions import CreateReplica, SetStatus

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]
k8s_config: Any = kubernetes.config  # untyped, as in cluster_api


class Budget:
    """A test-only policy: one PodDisruptionBudget per job, over the job's pods."""

    def pod(self, job: TrainingJob, role: Role, index: int) -> PodDecoration:
        return PodDecoration(labels={"budget": job.name})

    def groups(self, job: TrainingJob) -> tuple[GroupObject, ...]:
        manifest = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": job.name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {LABEL_JOB: job.name}}},
        }
        return (GroupObject("poddisruptionbudgets", manifest),)


def cluster_api(kubectl: Kubectl) -> ClusterApi:
    configuration = kubernetes.client.Configuration()
    k8s_config.load_kube_config(config_file=kubectl.env["KUBECONFIG"], client_configuration=configuration)
    return ClusterApi(configuration, RequestCounter())


def budgets(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json("get", "poddisruptionbudgets", "-n", ns)["items"]
    return items


def test_the_group_lives_from_the_first_pod_until_the_job_finishes_or_goes(kubectl: Kubectl, ns: str) -> None:
    document = training_job("gang", workers=1, runPolicy={"suspend": True})
    kubectl.apply(ns, document)
    uid = kubectl.job(ns, "gang")["metadata"]["uid"]
    job = parse_job({**document, "metadata": {"name": "gang", "namespace": ns}})
    renderer = Renderer(policies={SchedulingPolicy.NONE: Budget()})
    api = cluster_api(kubectl)
    ref = JobRef(ns, "gang", uid)
    try:
        # The pass that would create a pod creates the group first (the pod itself is left out: the
        # job is the operator's, and kwok would run it).
        [group, _pod] = renderer.render([CreateReplica("gang-worker-0", Role.WORKER, 0)], job, uid)
        assert execute([group], api, ref, {}, now=0.0) == Outcome()
        [pdb] = budgets(kubectl, ns)
        assert pdb["metadata"]["name"] == "gang" and pdb["metadata"]["labels"] == {LABEL_JOB: "gang"}
        assert pdb["metadata"]["ownerReferences"][0]["uid"] == uid
        assert execute([group], api, ref, {}, now=0.0) == Outcome()  # 409: already there, not an error

        # The pass that ends the job deletes it.
        ending = renderer.render([SetStatus({"phase": "Succeeded"})], job, uid)
        assert execute(ending, api, ref, {}, now=0.0) == Outcome()
        assert budgets(kubectl, ns) == []
        reasons = {e["reason"] for e in kubectl.events(ns, "gang")}
        assert {"SuccessfulCreatePodDisruptionBudget", "SuccessfulDeletePodDisruptionBudget"} <= reasons

        # Deleting the job deletes it too, through its ownerReference (the garbage collector).
        assert execute([group], api, ref, {}, now=0.0) == Outcome()
        assert len(budgets(kubectl, ns)) == 1
        kubectl("delete", "trainingjob", "gang", "-n", ns, "--wait=false")
        wait_for(lambda: budgets(kubectl, ns) == [], 60, "the job's PodDisruptionBudget garbage-collected")
    finally:
        api.close()
