"""Training tasks: the epochs, their shuffled todo and the ``done`` ledger that counts every record.

Each epoch's tasks are cut, shuffled, when the previous epoch's todo runs dry; the ledger grows one
entry per epoch as each epoch starts, so nothing is allocated for epochs not yet reached and a
large ``num_epochs`` costs nothing up front. A record is trained exactly ``num_epochs`` times: a
task counts once, by its first record, in its epoch's entry.

Sync rounds tell the ledger which of a task's records they applied (``syncing.py``, as each round
commits): those count at once, and the task's position is kept (``partial``) until it is reported.
A task that goes back to the queue is cut again from that position (:meth:`Training.resume`), so
no applied minibatch is trained twice, even after a rollback to a saved ledger.
"""

from __future__ import annotations

import random
from dataclasses import replace
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
        self._partial: list[dict[int, int]] = []  # per started epoch: task key -> first record not applied
        self._recent_losses: list[float] = []
        self.reports = 0  # training tasks reported done (by this coordinator): a curve point each

    @property
    def done(self) -> bool:
        """Every task of every epoch is done (counted by tasks, not records: a miscount of records
        could never end the job)."""
        if not self._s.trains:
            return True
        tasks = -(-self._s.num_records // self._s.records_per_task)
        return len(self._done_starts) == self._s.num_epochs and all(len(keys) == tasks for keys in self._done_starts)

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
            self._partial.append({})
            tasks = self._ids.cut(self._s.num_records, TaskKind.TRAINING, epoch=self.epoch, version=0)
            self._rng.shuffle(tasks)
            self.todo.extend(tasks)
        return self.todo.pop(0) if self.todo else None

    def record(self, task: Task, loss_sum: float, applied: int = 0) -> None:
        """``task`` is done; ``applied`` of its records were counted already (:meth:`apply`)."""
        self._epoch_records[task.epoch] += task.records - applied
        self._done_starts[task.epoch].add(task.key)
        self._partial[task.epoch].pop(task.key, None)
        self._recent_losses = (self._recent_losses + [loss_sum / max(1, task.records)])[-8:]
        self.reports += 1

    def apply(self, task: Task, before: int, now: int) -> None:
        """A round applied ``task``'s records up to ``now`` (from its start; ``before`` were already)."""
        self._epoch_records[task.epoch] += now - before
        self._partial[task.epoch][task.key] = task.start + now

    def resume(self, task: Task, applied: int, task_id: int) -> Task | None:
        """``task`` went back to the queue with ``applied`` of its records in the model: the rest of
        it as task ``task_id``, or None when nothing is left (the task is done)."""
        if applied <= 0:
            return task
        if applied >= task.records:
            self._done_starts[task.epoch].add(task.key)
            self._partial[task.epoch].pop(task.key, None)
            return None
        return replace(task, id=task_id, start=task.start + applied, first=task.key)

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
        return {
            "epoch": self.epoch,
            "done": [sorted(starts) for starts in self._done_starts],
            "partial": [sorted(partial.items()) for partial in self._partial],
        }

    def parse(self, state: Mapping[str, Any]) -> tuple[int, list[set[int]], list[dict[int, int]]]:
        """The saved epoch, ledger and partly applied tasks; ValueError when they do not fit the
        number of epochs."""
        epoch = int(state["epoch"])
        done = [set(int(start) for start in starts) for starts in state["done"]]
        partial = [{int(key): int(at) for key, at in pairs} for pairs in state.get("partial", [])]
        # A ledger saved before it grew lazily has an (empty) entry for every epoch: kept readable.
        if epoch >= self._s.num_epochs or len(done) < epoch + 1 or any(done[epoch + 1 :]) or any(partial[epoch + 1 :]):
            raise ValueError("saved ledger does not match the number of epochs")
        partial = (partial + [{} for _ in range(epoch + 1)])[: epoch + 1]
        return epoch, done[: epoch + 1], partial

    def restore(self, epoch: int, done: list[set[int]], partial: list[dict[int, int]]) -> None:
        """Takes over the ledger :meth:`parse` read: the tasks not done are cut again (new ids),
        a partly applied one from its first record not applied, shuffled."""
        self.epoch = epoch
        self._done_starts = done
        self._partial = partial
        self._epoch_records = [0] * len(done)
        self.todo = []
        for e in range(epoch + 1):
            for task in self._ids.cut(self._s.num_records, TaskKind.TRAINING, epoch=e, version=0):
                if task.start in done[e]:
                    self._epoch_records[e] += task.records
                    continue
                at = partial[e].get(task.start, task.start)
                if not task.start <= at <= task.end:
                    raise ValueError(f"saved ledger: task at {task.start} applied up to {at}, outside it")
                if at == task.end:  # every record applied, the report lost: done
                    done[e].add(task.start)
                    partial[e].pop(task.start)
                    self._epoch_records[e] += task.records
                    continue
                self._epoch_records[e] += at - task.start
                self.todo.append(task if at == task.start else replace(task, start=at, first=task.start))
        self._rng.shuffle(self.todo)
