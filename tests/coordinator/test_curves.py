"""The training curves' event files, read back by TensorFlow's own event reader."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from elasticps.coordinator.curves import TrainingCurves, staleness_histogram

INF = math.inf


def _events(folder: Path) -> list[object]:
    tf = pytest.importorskip("tensorflow")
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    return list(tf.compat.v1.train.summary_iterator(str(files[0])))


def test_scalars_and_histograms_read_back_by_tensorflow(tmp_path: Path) -> None:
    counts = [[(0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (INF, 0.0)]]
    curves = TrainingCurves(str(tmp_path), staleness=lambda: counts[0], clock=iter(range(1000, 2000)).__next__)
    counts[0] = [(0.0, 3.0), (1.0, 5.0), (2.0, 5.0), (INF, 6.0)]  # 3 at 0, 2 at 1, 1 above 2
    curves.trained(10, loss=0.5, records=640, epoch=0)
    curves.trained(20, loss=0.25, records=1280, epoch=0)  # no push since: no histogram
    curves.evaluated(20, {"accuracy": 0.75, "loss": 0.3})
    curves.close()

    events = _events(tmp_path / "tensorboard")
    assert events[0].file_version == "brain.Event:2"
    points = [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value if not v.HasField("histo")]
    assert ("train/loss" in {tag for _, tag, _ in points})
    assert [(s, x) for s, t, x in points if t == "train/loss"] == [(10, 0.5), (20, 0.25)]
    assert [(s, x) for s, t, x in points if t == "train/records"] == [(10, 640.0), (20, 1280.0)]
    assert [(s, t, round(x, 6)) for s, t, x in points if t.startswith("eval/")] == [
        (20, "eval/accuracy", 0.75),
        (20, "eval/loss", 0.3),
    ]
    histograms = [(e.step, v.histo) for e in events for v in e.summary.value if v.HasField("histo")]
    assert len(histograms) == 1
    step, histo = histograms[0]
    assert step == 10
    assert list(histo.bucket) == [3.0, 2.0, 0.0, 1.0]
    assert histo.num == 6 and histo.min == 0.0 and histo.max == 2.0
    assert histo.sum == 2 * 1.0 + 1 * 2.0
    assert [e.wall_time for e in events] == sorted(e.wall_time for e in events)


def test_localsgd_period_is_a_curve_and_only_for_localsgd(tmp_path: Path) -> None:
    curves = TrainingCurves(str(tmp_path), clock=iter(range(1000, 2000)).__next__)
    curves.trained(10, loss=0.5, records=640, epoch=0, local_steps=8)
    curves.trained(20, loss=0.25, records=1280, epoch=0, local_steps=5)
    curves.trained(30, loss=0.2, records=1920, epoch=0)  # another mode: no point
    curves.close()
    points = [(e.step, v.tag, v.simple_value) for e in _events(tmp_path / "tensorboard")[1:] for v in e.summary.value]
    assert [(s, x) for s, t, x in points if t == "train/local_steps"] == [(10, 8.0), (20, 5.0)]


def test_staleness_histogram_counts_only_the_pushes_between_readings() -> None:
    before = [(0.0, 10.0), (4.0, 12.0), (INF, 12.0)]
    after = [(0.0, 10.0), (4.0, 15.0), (INF, 17.0)]
    histo = staleness_histogram(before, after)
    assert histo is not None
    assert list(histo.bucket) == [0.0, 3.0, 2.0]
    assert histo.num == 5
    assert staleness_histogram(after, after) is None


def test_a_reading_from_a_restarted_shard_never_gives_negative_counts() -> None:
    before = [(0.0, 50.0), (INF, 60.0)]
    after = [(0.0, 1.0), (INF, 1.0)]  # the shard's process restarted: its counts began again
    histo = staleness_histogram(before, after)
    assert histo is None or all(count >= 0 for count in histo.bucket)


def test_the_learning_rate_the_ps_applied_is_a_curve_when_known(tmp_path: Path) -> None:
    rates = iter([0.1, 0.1, 0.01, 0.0])  # 0: no push accepted yet (no point)
    curves = TrainingCurves(str(tmp_path), clock=iter(range(1000, 2000)).__next__, learning_rate=rates.__next__)
    for version in (10, 20, 30, 40):
        curves.trained(version, loss=0.5, records=640, epoch=0)
    curves.close()
    points = [(e.step, v.tag, v.simple_value) for e in _events(tmp_path / "tensorboard")[1:] for v in e.summary.value]
    assert [(s, round(x, 6)) for s, t, x in points if t == "train/learning_rate"] == [(10, 0.1), (20, 0.1), (30, 0.01)]
