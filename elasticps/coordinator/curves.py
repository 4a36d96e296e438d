"""Training curves for TensorBoard: loss, metrics, progress and gradient staleness over model versions.

PS 0's coordinator calls :class:`TrainingCurves` when a training task is reported (loss, records,
staleness so far) and when an evaluation completes (one point per evaluation), and the curves go to
a TensorBoard event file under ``<spec.output>/tensorboard/``, so ``tensorboard --logdir OUTPUT``
shows the run as Keras users see theirs. The x axis (``step``) is the model version; the wall time
of each point is when the coordinator learnt it.

The file is written without TensorFlow or TensorBoard (PS 0 imports neither): each record is an
``Event`` (``proto/tensorboard.proto``, TensorBoard's field numbers) in TFRecord framing
(``data/tfrecord.py``). A remote output (``s3://...``) is written to a local folder and copied
there after every evaluation and when the job stops.

Tags: ``train/loss`` (mean loss of the latest training tasks), ``train/records`` (records trained),
``train/epoch``, ``train/local_steps`` (LocalSGD: the workers' current period K),
``train/learning_rate`` (the rate of the latest push PS 0's shard accepted: a module's schedule by
model version, ``elasticps.callbacks``), ``eval/<metric>`` for every metric of the model (``eval/loss``, ``eval/accuracy``
...), and the histogram ``train/staleness`` (versions between the model a gradient was computed on
and the shard's, counted over the pushes since the previous point).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from elasticps import storage
from elasticps.data.tfrecord import frame
from elasticps.proto import tensorboard_pb2 as tb

log = logging.getLogger(__name__)

FILE_VERSION = "brain.Event:2"

# Cumulative counts by upper bound: (bound, pushes with staleness <= bound), the last bound +inf.
StalenessCounts = Sequence[tuple[float, float]]


class EventFile:
    """One append-only TensorBoard event file in ``folder`` (``events.out.tfevents.<time>.<host>``)."""

    def __init__(self, folder: Path, clock: Callable[[], float] = time.time) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self.path = folder / f"events.out.tfevents.{int(clock())}.{socket.gethostname()}.{os.getpid()}.elasticps"
        self._file: BinaryIO = open(self.path, "ab")
        self._write(tb.Event(wall_time=clock(), file_version=FILE_VERSION))

    def _write(self, event: tb.Event) -> None:
        self._file.write(frame(event.SerializeToString()))
        self._file.flush()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        summary = tb.Summary(value=[tb.SummaryValue(tag=tag, simple_value=v) for tag, v in values.items()])
        self._write(tb.Event(wall_time=self._clock(), step=step, summary=summary))

    def histogram(self, step: int, tag: str, histogram: tb.HistogramProto) -> None:
        summary = tb.Summary(value=[tb.SummaryValue(tag=tag, histo=histogram)])
        self._write(tb.Event(wall_time=self._clock(), step=step, summary=summary))

    def close(self) -> None:
        self._file.close()


def staleness_histogram(before: StalenessCounts, after: StalenessCounts) -> tb.HistogramProto | None:
    """The pushes counted between two readings of cumulative bucket counts, as a TensorBoard
    histogram (None when there were none). Staleness is a whole number, so a bucket's values are
    taken at its upper bound (the last, open, bucket at the bound below it) for the sums."""
    previous = dict(before)
    finite = [bound for bound, _ in after if bound != math.inf]
    top = finite[-1] if finite else 0.0
    limits: list[float] = []
    counts: list[float] = []
    values: list[float] = []
    below = 0.0
    for bound, cumulative in after:
        in_bucket = max(0.0, cumulative - previous.get(bound, 0.0) - below)
        below += in_bucket
        limits.append(bound if bound != math.inf else sys.float_info.max)
        counts.append(in_bucket)
        values.append(bound if bound != math.inf else top)
    used = [i for i, count in enumerate(counts) if count > 0]
    if not used:
        return None
    return tb.HistogramProto(
        min=values[used[0]],
        max=values[used[-1]],
        num=sum(counts),
        sum=sum(c * v for c, v in zip(counts, values)),
        sum_squares=sum(c * v * v for c, v in zip(counts, values)),
        bucket_limit=limits,
        bucket=counts,
    )


class TrainingCurves:
    """Writes the job's curves as the coordinator learns them. Thread-safe; ``close`` when PS 0 stops.

    ``staleness`` reads the cumulative staleness counts of PS 0's own shard (every push reaches
    every shard, so one shard sees every gradient's staleness)."""

    def __init__(
        self,
        output: str,
        staleness: Callable[[], StalenessCounts] | None = None,
        clock: Callable[[], float] = time.time,
        learning_rate: Callable[[], float] | None = None,
    ) -> None:
        self._output = output.rstrip("/")
        self._remote = storage.is_remote(output)
        self._local = Path(tempfile.mkdtemp(prefix="elasticps-curves-")) if self._remote else Path(output) / "tensorboard"
        self._file = EventFile(self._local, clock)
        self._staleness = staleness
        self._learning_rate = learning_rate
        self._seen: StalenessCounts = staleness() if staleness else ()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def folder(self) -> str:
        """Where TensorBoard finds the curves (give ``tensorboard --logdir`` this or the output)."""
        return f"{self._output}/tensorboard"

    def trained(self, version: int, loss: float, records: int, epoch: int, local_steps: int = 0) -> None:
        """A training task was reported; ``local_steps``: LocalSGD's current period (0: none)."""
        with self._lock:
            if self._closed:
                return
            points = {"train/loss": loss, "train/records": float(records), "train/epoch": float(epoch)}
            if local_steps > 0:
                points["train/local_steps"] = float(local_steps)
            rate = self._learning_rate() if self._learning_rate is not None else 0.0
            if rate > 0:
                points["train/learning_rate"] = rate
            self._file.scalars(version, points)
            if self._staleness is not None:
                now = self._staleness()
                histogram = staleness_histogram(self._seen, now)
                self._seen = now
                if histogram is not None:
                    self._file.histogram(version, "train/staleness", histogram)

    def evaluated(self, version: int, metrics: Mapping[str, float]) -> None:
        with self._lock:
            if self._closed:
                return
            self._file.scalars(version, {f"eval/{name}": value for name, value in sorted(metrics.items())})
            self._publish()

    def _publish(self) -> None:
        if not self._remote:
            return
        try:
            storage.upload(str(self._local), self.folder)
        except Exception as err:  # the curves must never stop the job
            log.warning("could not copy the training curves to %s: %s", self.folder, err)

    def close(self) -> None:
        """Ends the file (later points are dropped: PS 0 is stopping) and copies it out once more."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._file.close()
            self._publish()


def open_curves(
    output: str,
    staleness: Callable[[], StalenessCounts] | None = None,
    learning_rate: Callable[[], float] | None = None,
) -> TrainingCurves | None:
    """The job's training curves under ``output``, or None (logged) when the folder cannot be made:
    a job never fails for its curves."""
    try:
        return TrainingCurves(output, staleness, learning_rate=learning_rate)
    except OSError as err:
        log.warning("no training curves: %s", err)
        return None
