"""An elasticps run's figures from the coordinator's answers polled while it ran.

``bench.peer_runs`` asks PS 0's coordinator ``GetJobStatus`` every ``POLL_S`` and keeps each answer
as a :class:`Sample`, timed from the moment ``elasticps run`` was started. From them:

* ``first_step_s``: the first answer whose ``model_version`` is >= 1, i.e. PS 0 has applied the first
  update (a gradient in async mode, a round in sync mode); the model pushed at start is version 0;
* the epoch boundaries: the first answers with ``records_done`` >= k x (records per epoch), k = 1..N;
  the examples/s of epoch k are the records done between the answers at boundaries k-1 and k over
  the time between them (epoch 1 starts at the first step, with 0 records);
* ``wall_s``: the first answer with ``finished`` (every training task and the final evaluation
  done: the test accuracy is known);
* the CPU seconds of an epoch: the difference of the samples' ``cpu_s`` at its two ends, when read;
  its tensor bytes likewise: every shard's bytes received and sent (the PS's own metric, in the
  coordinator's answer), so the bytes of epoch 1 include the first pulls and those of the last
  epoch do not include the final evaluation's and export's pulls.

Each time is late by at most one poll interval plus one call; the examples/s of an epoch subtract
two such times, so their errors mostly cancel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since ``elasticps run`` was started
    records_done: int
    records_total: int
    model_version: int
    finished: bool
    cpu_s: float | None = None  # CPU seconds of the run's processes so far (None: not read)
    tensor_bytes: int | None = None  # tensor bytes every shard received and sent so far (None: a shard did not answer)
    accuracy: float | None = None  # the latest complete evaluation's test accuracy (None: none yet)
    local_steps: int = 0  # LocalSGD: the workers' current period
    min_iteration: int = -1  # decentralized: the slowest live worker's iteration (-1: not known)


class IncompleteRun(ValueError):
    """The samples do not show the run reaching its first step, an epoch boundary or its end."""


def _first(samples: Sequence[Sample], what: str, test: Any) -> Sample:
    for sample in samples:
        if test(sample):
            return sample
    raise IncompleteRun(f"no answer shows {what}")


def figures(samples: Sequence[Sample], num_epochs: int) -> dict[str, Any]:
    """first_step_s, wall_s, per-epoch records, seconds and examples/s, examples/s of epoch 2."""
    if not samples:
        raise IncompleteRun("no answer from the coordinator")
    ordered = sorted(samples, key=lambda s: s.t)
    total = max(s.records_total for s in ordered)
    if total <= 0:
        raise IncompleteRun("records_total is 0")
    per_epoch = total // num_epochs
    first = _first(ordered, "the first update", lambda s: s.model_version >= 1)
    previous = Sample(first.t, 0, total, first.model_version, False, first.cpu_s, first.tensor_bytes)
    epochs: list[dict[str, Any]] = []
    for k in range(1, num_epochs + 1):
        boundary = total if k == num_epochs else k * per_epoch
        crossed = _first(ordered, f"{boundary} records done", lambda s, b=boundary: s.records_done >= b)
        seconds = crossed.t - previous.t
        records = crossed.records_done - previous.records_done
        cpu = None if crossed.cpu_s is None or previous.cpu_s is None else crossed.cpu_s - previous.cpu_s
        moved = None
        if crossed.tensor_bytes is not None and previous.tensor_bytes is not None:
            moved = crossed.tensor_bytes - previous.tensor_bytes
        epochs.append(
            {
                "records": records,
                "seconds": seconds,
                "examples_per_s": records / seconds if seconds > 0 else float("nan"),
                "ended_s": crossed.t,
                "cpu_s": cpu,
                "cpu_s_per_1000_examples": None if cpu is None or not records else cpu / (records / 1000),
                "tensor_bytes": moved,
            }
        )
        previous = crossed
    done = _first(ordered, "the job finished", lambda s: s.finished)
    return {
        "first_step_s": first.t,
        "wall_s": done.t,
        "epochs": epochs,
        "examples_per_s_epoch2": epochs[1]["examples_per_s"] if len(epochs) > 1 else None,
        "cpu_s_per_1000_examples_epoch2": epochs[1]["cpu_s_per_1000_examples"] if len(epochs) > 1 else None,
        "tensor_bytes_epoch2": epochs[1]["tensor_bytes"] if len(epochs) > 1 else None,
        "examples": total,
        "evaluation_s": done.t - epochs[-1]["ended_s"],
        "samples": len(ordered),
    }
