"""A sync shard's copy of the task ledger: how far the rounds it applied brought each training task.

Each commit names the tasks whose records its round brings in (``CommitRequest.applied``, made by
the coordinator, ``coordinator/syncing.py``); the shard keeps the furthest record of each, so its
copy says which records its model holds. PS 0 hosts the coordinator and its ledger: when PS 0
restarts without a saved ledger (a job without checkpoints), the new coordinator reads the copy of
a shard that lived on (``ReadLedger``) and goes on from it instead of training every record again.

A copy is *whole* only while the shard has applied every round since version 0: a model installed
at a later version (restored from a checkpoint, or a worker's copy after a restart) comes without
the rounds before it. Memory: one entry per task started, as the coordinator's own ledger.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskProgress:
    """How far committed rounds brought one training task (``TaskProgress`` on the wire)."""

    epoch: int
    first: int  # the task's first record as it was cut: the ledger's key for it
    reached: int  # the first of its records not applied
    task_id: int  # the id it was handed out with


@dataclass(frozen=True)
class LedgerCopy:
    version: int  # the shard's version: the copy holds the rounds up to it
    whole: bool  # every round since version 0 applied here
    tasks: tuple[TaskProgress, ...]


class AppliedTasks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reached: dict[tuple[int, int], tuple[int, int]] = {}  # (epoch, first) -> (reached, task id)
        self._version = 0
        self._whole = True

    def installed(self, version: int) -> None:
        """A model was installed at ``version``: the copy starts afresh, whole only at version 0."""
        with self._lock:
            self._reached.clear()
            self._version = version
            self._whole = version == 0

    def committed(self, version: int, tasks: Iterable[TaskProgress]) -> None:
        """A round was applied, bringing the shard to ``version`` and ``tasks`` forward."""
        with self._lock:
            for task in tasks:
                key = (task.epoch, task.first)
                if task.reached > self._reached.get(key, (-1, 0))[0]:
                    self._reached[key] = (task.reached, task.task_id)
            self._version = version

    def copy(self) -> LedgerCopy:
        with self._lock:
            tasks = tuple(
                TaskProgress(epoch, first, reached, task_id)
                for (epoch, first), (reached, task_id) in sorted(self._reached.items())
            )
            return LedgerCopy(self._version, self._whole, tasks)
