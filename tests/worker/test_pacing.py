"""A worker slowed on purpose: it sleeps factor - 1 times each computation, the same draws every run."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from elasticps.api.modes import UpdateRule
from elasticps.api.slowdown import Slowdown
from elasticps.worker.local_model import Counters, LocalModel
from elasticps.worker.metrics import WorkerMetrics
from elasticps.worker.pacing import Pace, pace_for
from worker_fakes import WORKER, ArrayReader, FakePS, FakeTrainer


def test_a_fixed_straggler_sleeps_factor_minus_one_times_its_compute() -> None:
    slept: list[float] = []
    pace = Pace(Slowdown.parse("0:4"), worker=0, sleep=slept.append)
    assert pace.after(0.5) == pytest.approx(1.5)
    assert pace.after(0.1) == pytest.approx(0.3)
    assert slept == pytest.approx([1.5, 0.3]) and pace.slept_s == pytest.approx(1.8) and pace.slow_steps == 2


def test_the_random_protocol_slows_about_its_share_of_steps_and_the_same_ones_every_run() -> None:
    def slow_steps(worker: int) -> list[int]:
        pace = Pace(Slowdown.parse("random:6:0.25"), worker=worker, sleep=lambda s: None)
        return [i for i in range(4000) if pace.after(0.01) > 0]

    first = slow_steps(1)
    assert 0.22 < len(first) / 4000 < 0.28
    assert slow_steps(1) == first  # seeded by the worker's id
    assert slow_steps(2) != first  # each worker draws its own
    assert all(Pace(Slowdown.parse("random:6:0.25"), 1, sleep=lambda s: None).after(0.0) == 0.0 for _ in range(10))


def test_only_a_worker_that_can_be_slowed_gets_a_pace() -> None:
    assert pace_for("", 0) is None
    assert pace_for("0:4", 1) is None
    assert pace_for("0:4", 0) is not None
    assert pace_for("random:6:0.25", 3) is not None
    assert pace_for("random:6:0", 3) is None


def test_the_local_model_sleeps_after_each_gradient_and_counts_it() -> None:
    slept: list[float] = []
    ps, trainer = FakePS(UpdateRule.ASYNC), FakeTrainer()
    counters = Counters()
    pace = Pace(Slowdown.parse("0:3"), worker=0, sleep=slept.append)
    model = LocalModel(trainer, ps, 0.1, counters, WorkerMetrics(CollectorRegistry(), WORKER), pace)
    features, labels = ArrayReader(8).read(0, 8)
    for x, y in trainer.batches(features, labels, "training"):
        model.gradients(x, y)
    assert len(slept) == 2 and all(s >= 0 for s in slept)
    assert counters.slowed_s == pytest.approx(sum(slept))
    assert np.isfinite(counters.slowed_s)
