"""Prometheus metrics of one worker: steps, their time, pushes, pulls, rejected gradients.

Created once per process by ``worker/main.py`` (tests pass their own registry) and served over HTTP
on ``--metrics_port``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, worker: str) -> None:
        labels = {"worker": worker}
        self.steps = Counter(
            "elasticps_worker_steps", "Minibatches trained", ["worker"], registry=registry
        ).labels(**labels)
        self.records = Counter(
            "elasticps_worker_records", "Records trained", ["worker"], registry=registry
        ).labels(**labels)
        self.rejected = Counter(
            "elasticps_worker_rejected_gradients", "Pushes the PS rejected (minibatch retrained)", ["worker"],
            registry=registry,
        ).labels(**labels)
        self.step_seconds = Histogram(
            "elasticps_worker_step_seconds", "Time of one gradient computation", ["worker"], registry=registry
        ).labels(**labels)
        self.push_seconds = Histogram(
            "elasticps_worker_push_seconds", "Time of one push to every shard", ["worker"], registry=registry
        ).labels(**labels)
        self.pull_seconds = Histogram(
            "elasticps_worker_pull_seconds", "Time of one pull from every shard (sync: with the wait for the update)", ["worker"], registry=registry
        ).labels(**labels)
        self.model_version = Gauge(
            "elasticps_worker_model_version", "Model version of the local copy (PS shard 0)", ["worker"],
            registry=registry,
        ).labels(**labels)
