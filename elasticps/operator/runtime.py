"""The operator's live parts, assembled once per process: API client, coordinator probe, work queue,
the watch of the jobs' pods.

Callers: ``handlers`` builds one :class:`OperatorRuntime` in kopf's startup handler (on kopf's
event loop), hands it every trigger, and closes it in kopf's cleanup handler. The pods' changes come
from ``podwatch`` (threads of its own), handed to the queue on kopf's loop. It also reports the
API request counts: a log line every ``stats_log_interval_s`` when they changed, and the JSON file
``config.stats_file`` (rewritten at most every second while they change, and at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from elasticps.operator.cluster_api import ApiError, ClusterApi, load_client_config
from elasticps.operator.config import OperatorConfig
from elasticps.operator.counting import RequestCounter, current_job
from elasticps.operator.manifests import LABEL_JOB_UID
from elasticps.operator.executing import Outcome
from elasticps.operator.metrics import OperatorMetrics
from elasticps.operator import kueue
from elasticps.operator.podwatch import PodWatch
from elasticps.operator.probing import CoordinatorProbe
from elasticps.operator.queueing import WorkQueue
from elasticps.operator.reconciling import JobKey, Reconcile
from elasticps.operator.throttling import RateLimiter

log = logging.getLogger(__name__)

DELETED_KEPT = 4096  # deleted jobs remembered (their pods' events are ignored)


class OperatorRuntime:
    def __init__(self, config: OperatorConfig, counter: RequestCounter, client_config: Any | None = None) -> None:
        self.config = config
        self.counter = counter
        # One bucket for every request of the process: the passes' (here) and kopf's (``handlers``).
        self.limiter = RateLimiter(config.kube_api_qps, config.kube_api_burst)
        self.api = ClusterApi(
            client_config or load_client_config(),
            counter,
            timeout_s=config.request_timeout_s,
            limiter=self.limiter,
            connections=config.kube_api_concurrency,
        )
        self.probe = CoordinatorProbe(config.coordinator_address, config.coordinator_timeout_s)
        # Its own registry: tests build several runtimes in one process; one HTTP server per runtime.
        registry = CollectorRegistry()
        self.metrics = OperatorMetrics(registry)
        if config.metrics_port:
            start_http_server(config.metrics_port, registry=registry)
        self.queue = WorkQueue(
            Reconcile(
                self.api,
                self.probe,
                config.planner,
                metrics=self.metrics,
                renderer=config.rendering,
                concurrency=config.kube_api_concurrency,
                rotation=config.rotation,
            ),
            debounce_s=config.debounce_s,
            resync_s=config.resync_s,
            max_backoff_s=config.max_backoff_s,
            on_pass=self._after_pass,
        )
        self._reporter: asyncio.Task[None] | None = None
        self._deleted: OrderedDict[str, None] = OrderedDict()  # uids of deleted jobs, the newest last
        self._pod_watches: list[PodWatch] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._reporter = loop.create_task(self._report(), name="elasticps request counts")

        def on_pod(namespace: str, name: str, uid: str) -> None:  # from a watch thread
            loop.call_soon_threadsafe(self.request, namespace, name, uid)

        resources = [("v1", "pods")]
        if self.config.kueue:
            resources.append((kueue.API_VERSION, kueue.WORKLOADS))
        for namespace in self.config.namespaces or (None,):
            for resource in resources:
                watch = PodWatch(self.api, namespace, on_pod, resource=resource)
                watch.start()
                self._pod_watches.append(watch)

    def request(self, namespace: str, name: str, uid: str = "") -> None:
        """A pass of the job soon; ``uid``: the job a pod event came from, when known. The pods of a
        deleted job make no passes as they go (each would only find the job gone)."""
        if uid and uid in self._deleted:
            return
        self.queue.request(JobKey(namespace, name))

    def forget(self, namespace: str, name: str, uid: str = "") -> None:
        self.queue.forget(JobKey(namespace, name))
        self.probe.forget(namespace, name)
        if uid:
            self._deleted[uid] = None
            while len(self._deleted) > DELETED_KEPT:
                self._deleted.popitem(last=False)

    async def delete_pods(self, namespace: str, name: str, uid: str) -> None:
        """A deleted job's pods, all at once (one deletecollection), rather than one by one by the
        garbage collector at the controller-manager's own QPS; it still removes the Services and
        the NetworkPolicy, and any pod created before pods carried the job's uid."""
        token = current_job.set(f"{namespace}/{name}")
        try:
            await asyncio.to_thread(self.api.delete_pods, namespace, f"{LABEL_JOB_UID}={uid}")
        except (ApiError, OSError) as err:
            log.warning("%s/%s: deleting its pods: %s (garbage collection will)", namespace, name, err)
        finally:
            current_job.reset(token)

    async def close(self) -> None:
        for watch in self._pod_watches:
            watch.stop()
        await self.queue.close()
        if self._reporter is not None:
            self._reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reporter
        self._write_stats()
        log.info("%s", self.counter.summary())
        self.probe.close()
        self.api.close()

    def _after_pass(self, key: JobKey, outcome: Outcome) -> None:
        if outcome.gone:
            self.probe.forget(key.namespace, key.name)

    async def _report(self) -> None:
        loop = asyncio.get_running_loop()
        written = logged = -1
        last_log = loop.time()
        while True:
            await asyncio.sleep(1.0)
            changes = self.counter.changes
            if changes != written:
                written = changes
                await asyncio.to_thread(self._write_stats)
            if changes != logged and loop.time() - last_log >= self.config.stats_log_interval_s:
                logged, last_log = changes, loop.time()
                log.info("%s", self.counter.summary())

    def _write_stats(self) -> None:
        if self.config.stats_file is None:
            return
        try:
            self.counter.write(self.config.stats_file)
        except OSError as err:
            log.warning("cannot write %s: %s", self.config.stats_file, err)
