"""What a person sees while a local job runs: one progress reporter.

On a terminal, a live bar (records trained, then predicted, epoch, loss, accuracy, model version); elsewhere (CI, a
log file), one line every ``interval_s`` seconds. Events (a replica restarted) go above the bar.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

from elasticps.proto import elasticps_pb2 as pb


def describe(status: pb.JobStatus) -> str:
    if status.prediction_records and not status.records_total:  # nothing to train: an exported model predicts
        return f"predicted {status.records_predicted}/{status.prediction_records}"
    parts = [f"epoch {min(status.epoch + 1, status.num_epochs)}/{status.num_epochs}"]
    if not math.isnan(status.loss) and status.records_done:
        parts.append(f"loss {status.loss:.4f}")
    for name, value in sorted(status.metrics.items()):
        if name != "loss":
            parts.append(f"{name} {value:.4f}")
    parts.append(f"version {status.model_version}")
    if status.prediction_records:
        parts.append(f"predicted {status.records_predicted}/{status.prediction_records}")
    return ", ".join(parts)


def _counts(status: pb.JobStatus) -> tuple[int, int]:
    """Records done and to do: trained (every epoch), then predicted."""
    return status.records_done + status.records_predicted, status.records_total + status.prediction_records


class Progress:
    def __init__(self, job: str, stream: TextIO = sys.stderr, interval_s: float = 5.0) -> None:
        self._job = job
        self._stream = stream
        self._interval_s = interval_s
        self._tty = stream.isatty()
        self._bar: tqdm[Any] | None = None
        self._last_line = 0.0
        self._started = time.monotonic()

    def update(self, status: pb.JobStatus) -> None:
        if self._tty:
            bar = self._bar
            if bar is None:
                bar = self._bar = tqdm(
                    total=_counts(status)[1], desc=self._job, unit="rec", file=self._stream, dynamic_ncols=True
                )
            bar.n = _counts(status)[0]
            bar.set_postfix_str(describe(status), refresh=True)
            return
        now = time.monotonic()
        if now - self._last_line >= self._interval_s:
            self._last_line = now
            records, total = _counts(status)
            done = 100.0 * records / max(1, total)
            print(
                f"[{now - self._started:6.1f}s] {self._job}: {records}/{total} records"
                f" ({done:.0f}%), {describe(status)}",
                file=self._stream,
                flush=True,
            )

    def event(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=self._stream)
        else:
            print(message, file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
