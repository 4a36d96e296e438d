"""The operator's live parts, assembled once per process: API client, coordinator probe, work queue.

Callers: ``handlers`` builds one :class:`OperatorRuntime` in kopf's startup handler (on kopf's
event loop), hands it every trigger, and closes it in kopf's cleanup handler. It also reports the
API request counts: a log line every ``stats_log_interval_s`` when they changed, and the JSON file
``config.stats_file`` (rewritten at most every second while they change, and at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from elasticps.operator.cluster_api import ClusterApi, load_client_config
from elasticps.operator.config import OperatorConfig
from elasticps.operator.counting import RequestCounter
from elasticps.operator.executing import Outcome
from elasticps.operator.metrics import OperatorMetrics
from elasticps.operator.probing import CoordinatorProbe
from elasticps.operator.queueing import WorkQueue
from elasticps.operator.reconciling import JobKey, Reconcile

log = logging.getLogger(__name__)


class OperatorRuntime:
    def __init__(self, config: OperatorConfig, counter: RequestCounter, client_config: Any | None = None) -> None:
        self.config = config
        self.counter = counter
        self.api = ClusterApi(client_config or load_client_config(), counter, timeout_s=config.request_timeout_s)
        self.probe = CoordinatorProbe(config.coordinator_address, config.coordinator_timeout_s)
        # Its own registry: tests build several runtimes in one process; one HTTP server per runtime.
        registry = CollectorRegistry()
        self.metrics = OperatorMetrics(registry)
        if config.metrics_port:
            start_http_server(config.metrics_port, registry=registry)
        self.queue = WorkQueue(
            Reconcile(self.api, self.probe, config.planner, metrics=self.metrics, renderer=config.rendering),
            debounce_s=config.debounce_s,
            resync_s=config.resync_s,
            max_backoff_s=config.max_backoff_s,
            on_pass=self._after_pass,
        )
        self._reporter: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reporter = asyncio.get_running_loop().create_task(self._report(), name="elasticps request counts")

    def request(self, namespace: str, name: str) -> None:
        self.queue.request(JobKey(namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        self.queue.forget(JobKey(namespace, name))
        self.probe.forget(namespace, name)

    async def close(self) -> None:
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
