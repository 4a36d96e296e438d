"""Prometheus metrics of one PS shard: pushes, pulls, rejected gradients, staleness, version, the
learning rate pushes carry, bytes, on PS 0 the sync joins answered over its bulk channel, and each
embedding table's rows (held, their bytes, made, evicted, turned away by the admission filter:
read from the store at each scrape, :meth:`PSMetrics.watch_rows`).

Created once per process by ``ps/main.py`` on a registry (tests pass their own) and handed to the
servicer, which records every call. Served over HTTP on ``--metrics_port`` for Prometheus to scrape;
the tensor bytes also go to the coordinator with the shard's state (``DescribeShard``), which shows
them per shard in the job's status.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.outcomes import PushOutcome
from elasticps.ps.tables import RowStats

# Staleness is a count of model versions: 0 for a current gradient, ~number of workers in async.
_STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)


class PSMetrics:
    def __init__(self, registry: CollectorRegistry, shard: int) -> None:
        labels = {"shard": str(shard)}
        self.pushes = Counter(
            "elasticps_ps_pushes", "Gradient pushes by outcome", ["shard", "outcome"], registry=registry
        )
        self.pulls = Counter("elasticps_ps_pulls", "Model pulls by kind", ["shard", "kind"], registry=registry)
        self.joins = Counter(
            "elasticps_ps_bulk_joins", "Sync joins answered over PS 0's bulk channel, by outcome", ["shard", "outcome"],
            registry=registry,
        )  # fmt: skip
        self._staleness_family = Histogram(
            "elasticps_ps_gradient_staleness",
            "PS version minus the gradient's version, per accepted or rejected push",
            ["shard"],
            buckets=_STALENESS_BUCKETS,
            registry=registry,
        )
        self.staleness = self._staleness_family.labels(**labels)
        self.model_version = Gauge(
            "elasticps_ps_model_version", "Updates applied to this shard", ["shard"], registry=registry
        ).labels(**labels)
        self.learning_rate = Gauge(
            "elasticps_ps_learning_rate",
            "The learning rate of the latest accepted push (async: it was applied with; sync: its round will be)",
            ["shard"],
            registry=registry,
        ).labels(**labels)
        self.last_learning_rate = 0.0  # the gauge's value, for the training curves
        self._received_family = Counter(
            "elasticps_ps_tensor_bytes_received", "Tensor bytes received (pushes)", ["shard"], registry=registry
        )
        self._sent_family = Counter(
            "elasticps_ps_tensor_bytes_sent", "Tensor bytes sent (pulls)", ["shard"], registry=registry
        )
        self.bytes_received = self._received_family.labels(**labels)
        self.bytes_sent = self._sent_family.labels(**labels)
        self.push_seconds = Histogram(
            "elasticps_ps_push_seconds", "Time to check and apply one push", ["shard"], registry=registry
        ).labels(**labels)
        self._shard = str(shard)
        self._registry = registry

    def watch_rows(self, stats: Callable[[], Mapping[str, RowStats]]) -> None:
        """Each embedding table's rows, as ``stats`` (the store's ``row_stats``) says at each scrape."""
        self._registry.register(_RowsCollector(self._shard, stats))

    def answered(self, outcome: PushOutcome) -> None:
        """A push was answered (over gRPC or the bulk channel): its outcome counted, its staleness,
        the shard's version and, when accepted, the learning rate it carried."""
        self.pushed("accepted" if outcome.accepted else "rejected")
        self.staleness.observe(outcome.staleness)
        self.model_version.set(outcome.version)
        if outcome.accepted and outcome.learning_rate > 0:
            self.learning_rate.set(outcome.learning_rate)
            self.last_learning_rate = outcome.learning_rate

    def pushed(self, outcome: str) -> None:
        """outcome: accepted | rejected (stale, sync) | invalid (INVALID_ARGUMENT) | uninitialized."""
        self.pushes.labels(shard=self._shard, outcome=outcome).inc()

    def pulled(self, kind: str) -> None:
        """kind: full | current (nothing newer) | uninitialized | torn (sync, over the bulk
        channel: a commit ran while it was sent; also counted as full)."""
        self.pulls.labels(shard=self._shard, kind=kind).inc()

    def joined(self, reply: pb.JoinReply) -> None:
        """A join behind a push, answered: committed | refused | pending."""
        outcome = pb.JoinOutcome.Name(reply.outcome).removeprefix("JOIN_OUTCOME_").lower()
        self.joins.labels(shard=self._shard, outcome=outcome).inc()

    def traffic(self) -> tuple[int, int]:
        """This shard's tensor bytes so far: (received, sent), what the coordinator shows per shard."""
        return self._total(self._received_family), self._total(self._sent_family)

    def _total(self, counter: Counter) -> int:
        for family in counter.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("shard") == self._shard:
                    return int(sample.value)
        return 0

    def staleness_counts(self) -> list[tuple[float, float]]:
        """This shard's staleness so far: ``(upper bound, pushes at or below it)`` per bucket, the
        last bound +inf (what the training curves turn into histograms)."""
        counts: list[tuple[float, float]] = []
        for family in self._staleness_family.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket") and sample.labels.get("shard") == self._shard:
                    counts.append((float(sample.labels["le"]), sample.value))
        return sorted(counts)


_ROW_GAUGES = {"rows": "Rows of the embedding table this shard holds", "bytes": "Their memory: arrays and id index"}
_ROW_COUNTERS = {
    "made": "Rows made (ids admitted) since the process started",
    "evicted": "Rows evicted (past their TTL, over the cap) since the process started",
    "rowless_reads": "Ids pulled that got no row (not admitted yet, or past the cap): their first values read",
    "dropped_gradients": "Gradient rows of ids with no row, dropped",
}


class _RowsCollector(Collector):
    def __init__(self, shard: str, stats: Callable[[], Mapping[str, RowStats]]) -> None:
        self._shard, self._stats = shard, stats

    def collect(self) -> Iterator[Metric]:
        tables = self._stats()
        for field, text in _ROW_GAUGES.items():
            gauge = GaugeMetricFamily(f"elasticps_ps_embedding_{field}", text, labels=["shard", "table"])
            for table, stats in tables.items():
                gauge.add_metric([self._shard, table], getattr(stats, field))
            yield gauge
        for field, text in _ROW_COUNTERS.items():
            counter = CounterMetricFamily(f"elasticps_ps_embedding_{field}", text, labels=["shard", "table"])
            for table, stats in tables.items():
                counter.add_metric([self._shard, table], getattr(stats, field))
            yield counter
