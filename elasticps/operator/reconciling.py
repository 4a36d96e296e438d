"""One reconcile pass of one TrainingJob: read the world fresh, ask the planner, carry out its actions.

Callers: the work queue (``queueing``), from a worker thread, never two passes of one job at once.
A pass:
1. reads the job (GET: its ``.status`` must be what the previous pass wrote, not a watch event
   that may lag behind it); gone -> nothing to do; being deleted (in the foreground) -> its pods
   are deleted with one request, garbage collection removes the rest through their ownerReferences;
2. parses its spec once (``SpecError`` -> ``plan_invalid``: Failed, reason InvalidSpec, no retry loop),
   and, once per generation of an unfinished job, has the API server decode each role's pod
   strictly in a dry run (``validating``: a template key Kubernetes does not know is InvalidSpec too);
3. lists the job's pods, Services and NetworkPolicies by the ``elasticps.io/job-name`` label (fresh,
   not from a cache; NetworkPolicies the operator may not list are "not observed", not an error);
4. asks PS 0's coordinator, only while PS 0 runs (None otherwise or when it does not answer); for a
   job labelled with a Kueue LocalQueue, reads its Workload and the flavors it was admitted on
   (``kueue``);
5. ``plan(job, observed, settings, check)`` (the check: ``rendering`` can render each replica it
   asks for), ``rendering`` (replicas -> Pods, Services, the NetworkPolicy, owned by the job's uid)
   and ``executing.execute`` (which patches status once); the outcome says whether the job is now
   finished (the queue then stops its idle resync). Pods are created only once the job's identity
   Secret holds their tokens (``identities``); PS 0 is asked with the operator's own token; the
   job's identity key rotates when due (``rotation``), an Event telling each step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from elasticps.api.parsing import SpecError, parse_job
from elasticps.api.spec import TrainingJob
from elasticps.api.replicas import replica_name
from elasticps.operator.cluster_api import ClusterApi
from elasticps.operator.counting import current_job
from elasticps.operator.executing import DEFAULT_CONCURRENCY, JobRef, Outcome, execute
from elasticps.operator.manifests import LABEL_JOB_UID
from elasticps.operator.metrics import OperatorMetrics
from elasticps.operator.observing import coordinator_running, observe_names, observe_pods, observe_services
from elasticps.operator.probing import CoordinatorProbe
from elasticps.operator.identities import JobIdentities
from elasticps.operator import kueue
from elasticps.operator.rendering import FINISHED, ClusterAction, CreatePod, Queueing, Renderer
from elasticps.operator.rotation import ROTATE_ANNOTATION, Policy
from elasticps.operator.validating import TemplateCheck
from elasticps.planning.actions import Event, SetStatus
from elasticps.planning.observed import JobProgress, Observed
from elasticps.planning.plan import plan, plan_invalid
from elasticps.planning.roles import coordinating
from elasticps.planning.settings import PlannerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class Reconcile:
    """``Reconcile(api, probe, settings)(key) -> Outcome``: the pass, with its collaborators bound;
    ``renderer`` turns replicas into pods (the containers' command, the NetworkPolicy's operator peer);
    ``concurrency``: how many creates or deletes of a pass are in flight at once."""

    def __init__(
        self,
        api: ClusterApi,
        probe: CoordinatorProbe,
        settings: PlannerSettings,
        clock: Callable[[], float] = time.time,
        metrics: OperatorMetrics | None = None,
        renderer: Renderer = Renderer(),
        concurrency: int = DEFAULT_CONCURRENCY,
        rotation: Policy = Policy(),
    ) -> None:
        self.api, self.probe, self.settings, self.clock = api, probe, settings, clock
        self.renderer, self.concurrency = renderer, concurrency
        self.metrics = metrics or OperatorMetrics(CollectorRegistry())
        self.templates = TemplateCheck(api, renderer)
        self.identities = JobIdentities(api, clock, rotation)

    def __call__(self, key: JobKey) -> Outcome:
        token = current_job.set(str(key))
        started = time.perf_counter()
        try:
            outcome = self._pass(key)
        except Exception:
            self.metrics.reconciles.labels(outcome="error").inc()
            raise
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
            current_job.reset(token)
        self.metrics.reconciles.labels(outcome="ok").inc()
        return outcome

    def _pass(self, key: JobKey) -> Outcome:
        body = self.api.get_job(key.namespace, key.name)
        if body is None:
            return Outcome(gone=True)
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            self._delete_pods(key, str(meta.get("uid") or ""))
            return Outcome()
        ref = JobRef(key.namespace, key.name, str(meta.get("uid") or ""))
        status: dict[str, Any] = body["status"] if isinstance(body.get("status"), dict) else {}
        generation = meta.get("generation") if isinstance(meta.get("generation"), int) else None
        try:
            job = parse_job(_document(body, key))
        except SpecError as err:
            return self._invalid(str(err), ref, status, generation)
        if status.get("phase") not in FINISHED:
            refused = self.templates.problem(job, ref.uid, generation)
            if refused:
                return self._invalid(refused, ref, status, generation)

        pod_items = self.api.list_pods(key.namespace, key.name)
        services = observe_services(self.api.list_services(key.namespace, key.name))
        policies = observe_names(self.api.list_network_policies(key.namespace, key.name))
        pods = observe_pods(pod_items, key.name, ref.uid)
        progress: JobProgress | None = None
        role = coordinating(job)
        if coordinator_running(pods, role):
            token = self.identities.observer(job, ref.uid)
            progress = self.probe.progress(key.namespace, key.name, replica_name(job, role, 0), token)
        now = self.clock()
        queueing = self._queueing(meta, job, ref.uid, now)
        observed = Observed(
            pods=pods,
            services=services,
            now=now,
            coordinator=progress,
            status=status,
            generation=generation,
            network_policies=policies,
            admission=None if queueing is None else kueue.admission_of(queueing.workload, queueing.queue),
        )
        planned = plan(job, observed, self.settings, check=self.renderer.problem)
        actions = self.renderer.render(planned, job, ref.uid, queueing)
        members = [a.member for a in actions if isinstance(a, CreatePod) and a.member]
        if members:
            self.identities.ensure(job, ref.uid, members)  # before the pods that read their tokens from it
        if status.get("phase") not in FINISHED and pod_items:
            annotations = meta.get("annotations") or {}
            rotated = self.identities.rotate(job, ref.uid, str(annotations.get(ROTATE_ANNOTATION) or ""), pod_items)
            if rotated:
                actions = [*actions, Event("IdentityRotated", rotated)]
        return self._execute(actions, ref, {p.name: p.uid for p in pods}, observed.now, status)

    def _queueing(self, meta: dict[str, Any], job: TrainingJob, uid: str, now: float) -> Queueing | None:
        """A job labelled with a Kueue LocalQueue: its Workload, the flavors it was admitted on and
        its WorkloadPriorityClass, as read now (None: the job is not queued)."""
        found_labels = meta.get("labels")
        labels: dict[str, Any] = found_labels if isinstance(found_labels, dict) else {}
        queue = kueue.queue_of(labels)
        if not queue:
            return None
        workload = self.api.get(kueue.API_VERSION, kueue.WORKLOADS, kueue.workload_name(job.name, uid), job.namespace)
        flavors = {name: self.api.get(kueue.API_VERSION, kueue.FLAVORS, name) for name in kueue.flavor_names(workload)}
        priority = None
        wanted = labels.get(kueue.PRIORITY_LABEL)
        if workload is None and isinstance(wanted, str) and wanted:
            found = self.api.get(kueue.API_VERSION, kueue.PRIORITY_CLASSES, wanted)
            value = (found or {}).get("value")
            priority = (wanted, int(value)) if isinstance(value, int) else None
        return Queueing(queue, workload, kueue.placements(workload, flavors), priority, now)

    def _invalid(self, message: str, ref: JobRef, status: dict[str, Any], generation: int | None) -> Outcome:
        """A spec the operator cannot run: Failed, reason InvalidSpec, nothing listed or created."""
        observed = Observed(pods=(), services=(), now=self.clock(), status=status, generation=generation)
        return self._execute(plan_invalid(observed, message), ref, {}, observed.now, status)

    def _delete_pods(self, key: JobKey, uid: str) -> None:
        """A job being deleted in the foreground waits for its pods: they go with one request (once:
        a pod already being deleted is not asked again), not one by one by the garbage collector."""
        items = self.api.list_pods(key.namespace, key.name)
        owned = [p for p in observe_pods(items, key.name, uid) if not p.deleted]
        if uid and owned:
            self.api.delete_pods(key.namespace, f"{LABEL_JOB_UID}={uid}")

    def _execute(
        self, actions: Sequence[ClusterAction], ref: JobRef, uids: dict[str, str], now: float, status: dict[str, Any]
    ) -> Outcome:
        if actions:
            log.debug("%s/%s: %s", ref.namespace, ref.name, ", ".join(type(a).__name__ for a in actions))
        for action in actions:
            # Counted as carried out, by Kubernetes kind (CreatePod, DeletePod ...), not as planned.
            self.metrics.actions.labels(kind=type(action).__name__).inc()
        outcome = execute(actions, self.api, ref, uids, now, self.concurrency)
        patched = next((a.status for a in actions if isinstance(a, SetStatus)), {})
        outcome.finished = patched.get("phase", status.get("phase")) in FINISHED
        return outcome


def _document(body: dict[str, Any], key: JobKey) -> dict[str, Any]:
    """The part of the object the spec parser reads (it knows nothing of uid, status, managedFields)."""
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": key.name, "namespace": key.namespace},
        "spec": body.get("spec"),
    }
