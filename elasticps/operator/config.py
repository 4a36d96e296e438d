"""The operator process's configuration: one frozen value, built from ``elasticps operator``'s flags.

Callers: ``main`` (flags -> :class:`OperatorConfig`) hands it to kopf as the operator's memo; the
startup handler in ``handlers`` reads it (or uses the defaults under a bare
``kopf run -m elasticps.operator.handlers``) and passes the parts down explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from elasticps.api.replicas import PS_PORT
from elasticps.operator.executing import DEFAULT_CONCURRENCY
from elasticps.operator.rendering import Renderer
from elasticps.operator.rotation import Policy
from elasticps.operator.throttling import DEFAULT_BURST, DEFAULT_QPS
from elasticps.planning.settings import PlannerSettings

# Where a job's coordinator answers: the headless Service of PS 0, or of a decentralized job's
# coordinator replica (``{coordinator}``: that replica's name; stable across restarts).
DEFAULT_COORDINATOR_ADDRESS = "{coordinator}.{namespace}.svc:" + str(PS_PORT)


@dataclass(frozen=True)
class OperatorConfig:
    """``namespaces``: watch only these (empty: every namespace).

    ``coordinator_address``: a template with ``{job}``, ``{namespace}`` and ``{coordinator}`` (the
    coordinating replica's name: ``{job}-ps-0``, or ``{job}-coordinator-0`` for a decentralized
    job); the default dials that replica's Service's DNS name, which resolves only inside the cluster. An operator run outside the cluster
    (or a test playing PS 0) points it elsewhere, e.g. ``unix:///run/{namespace}.{job}.sock``.
    ``coordinator_timeout_s``: a pass waits at most this long for PS 0; no answer means "unknown".
    ``debounce_s``: a burst of pod events within this window makes one pass.
    ``resync_s``: a job with no pass for this long gets one anyway (the idle-aware timer).
    ``stats_file``: where the API request counts are written as JSON (none: only logged).
    ``kube_api_qps`` / ``kube_api_burst``: the client-side rate limit every request of the operator
    waits for (client-go's QPS and burst; ``throttling`` says why the defaults); QPS 0: no limit.
    ``kube_api_concurrency``: how many creates or deletes of one pass are in flight at once.
    ``planner``: the planner's settings; ``rendering``: how replicas become pods (command, the
    NetworkPolicy's operator peer); ``rotation``: when the jobs' identity keys rotate.
    ``kueue``: the jobs' Kueue Workloads are watched too (an admission or an eviction makes a pass
    at once); without it a queued job still works, noticed at each ``resync_s``.
    """

    namespaces: tuple[str, ...] = ()
    coordinator_address: str = DEFAULT_COORDINATOR_ADDRESS
    coordinator_timeout_s: float = 1.0
    debounce_s: float = 0.2
    resync_s: float = 10.0
    max_backoff_s: float = 30.0
    request_timeout_s: float = 30.0
    stats_file: Path | None = None
    stats_log_interval_s: float = 60.0
    metrics_port: int = 0  # Prometheus metrics (reconcile passes, latency, actions); 0: off
    kube_api_qps: float = DEFAULT_QPS
    kube_api_burst: int = DEFAULT_BURST
    kube_api_concurrency: int = DEFAULT_CONCURRENCY
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    rendering: Renderer = field(default_factory=Renderer)
    rotation: Policy = field(default_factory=Policy)
    kueue: bool = False

    def coordinator_for(self, namespace: str, job: str, coordinator: str = "") -> str:
        return self.coordinator_address.format(job=job, namespace=namespace, coordinator=coordinator or f"{job}-ps-0")
