"""Prometheus metrics of the operator: reconcile passes by outcome, their latency, actions taken.

Built once per operator process by ``runtime`` on its own registry, served on ``--metrics_port``
(off when 0). The API request counts stay in ``counting`` (logged and written to ``--stats_file``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reconciles = Counter(
            "elasticps_operator_reconciles", "Reconcile passes of a TrainingJob by outcome (ok, error)",
            ["outcome"], registry=registry,
        )
        self.reconcile_seconds = Histogram(
            "elasticps_operator_reconcile_seconds", "Time of one reconcile pass", registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        self.actions = Counter(
            "elasticps_operator_actions", "Actions carried out, by kind (CreatePod, DeletePod, SetStatus ...)",
            ["kind"], registry=registry,
        )
