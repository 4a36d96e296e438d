"""Training tasks: the epochs, their shuffled todo and the ``done`` ledger that counts every record.

Each epoch's tasks are cut, shuffled, when the previous epoch's todo runs dry; the ledger grows one
entry per epoch as each epoch starts, so nothing is allocated for epochs not yet reached and a
large ``num_epochs`` costs nothing up front. A record is trained exactly ``num_epochs`` times: a
task counts once, by its first record, in its epoch's entry.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from elasticps.coordinator.tasks.base import Ids, QueueSettings, Task, TaskKind


class Training:
    def __init__(self, settings: QueueSettings, ids: Ids) -> None:
        self._s = settings
        self._ids = ids
        self._rng = random.Random(settings.seed)
        self.todo: list[Task] = []
        self.epoch = -1  # the newest epoch whose tasks were created
        self._epoch_records: list[int] = []  # per started epoch, like _done_starts
        self._done_starts: list[set[int]] = []
        self._recent_losses: list[float] = []

    @property
    def done(self) -> bool:
        return sum(self._epoch_records) == self._s.num_records * self._s.num_epochs

    @property
    def has_work(self) -> bool:
        """Tasks to hand out now or in an epoch still to start."""
        return bool(self.todo) or (self._s.trains and self.epoch + 1 < self._s.num_epochs)

    def next(self) -> Task | None:
        """The next training task, starting the next epoch when this one's todo ran dry."""
        if not self.todo and self.epoch + 1 < self._s.num_epochs and self._s.trains:
            self.epoch += 1
            self._epoch_records.append(0)
            self._done_starts.append(set())
            tasks = self._ids.cut(self._s.num_records, TaskKind.TRAINING, epoch=self.epoch, version=0)
            self._rng.shuffle(tasks)
            self.todo.extend(tasks)
        return self.todo.pop(0) if self.todo else None

    def record(self, task: Task, loss_sum: float) -> None:
        self._epoch_records[task.epoch] += task.records
        self._done_starts[task.epoch].add(task.start)
        self._recent_losses = (self._recent_losses + [loss_sum / max(1, task.records)])[-8:]

    # ---- what the job shows ------------------------------------------------------------------
    @property
    def records_done(self) -> int:
        return sum(self._epoch_records)

    @property
    def epoch_records(self) -> tuple[int, ...]:
        return tuple(self._epoch_records)

    @property
    def loss(self) -> float:
        """The mean loss per record of the last 8 training tasks reported (NaN before the first)."""
        losses = self._recent_losses
        return sum(losses) / len(losses) if losses else float("nan")

    # ---- the ledger ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "done": [sorted(starts) for starts in self._done_starts]}

    def parse(self, state: Mapping[str, Any]) -> tuple[int, list[set[int]]]:
        """The saved epoch and ledger; ValueError when they do not fit the number of epochs."""
        epoch = int(state["epoch"])
        done = [set(int(start) for start in starts) for starts in state["done"]]
        # A ledger saved before it grew lazily has an (empty) entry for every epoch: kept readable.
        if epoch >= self._s.num_epochs or len(done) < epoch + 1 or any(done[epoch + 1 :]):
            raise ValueError("saved ledger does not match the number of epochs")
        return epoch, done[: epoch + 1]

    def restore(self, epoch: int, done: list[set[int]]) -> None:
        """Takes over the ledger :meth:`parse` read: the tasks not done are cut again (new ids), shuffled."""
        self.epoch = epoch
        self._done_starts = done
        self._epoch_records = [0] * len(done)
        self.todo = []
        for e in range(epoch + 1):
            tasks = self._ids.cut(self._s.num_records, TaskKind.TRAINING, epoch=e, version=0)
            self._epoch_records[e] = sum(t.records for t in tasks if t.start in done[e])
            self.todo.extend(t for t in tasks if t.start not in done[e])
        self._rng.shuffle(self.todo)
