"""The job's task queue behind one lock: what every part of the coordinator reads and changes.

A rollback (``watching.py``) replaces the queue with one restored from a saved ledger, so the
queue is reached through this holder, never kept: ``with ledger.lock: ledger.queue...``. Lock
order: the rounds' lock (``syncing.py``) before this one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from elasticps.coordinator.tasks.base import QueueSettings
from elasticps.coordinator.tasks.queue import TaskQueue


class Ledger:
    def __init__(self, settings: QueueSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self.lock = threading.Lock()
        self.queue = TaskQueue(settings, clock)

    def state(self) -> dict[str, Any]:
        with self.lock:
            return self.queue.state()

    def roll_back(self, state: Mapping[str, Any]) -> None:
        """Replaces the queue with one restored from ``state`` (ValueError: another job's); the
        workers stay live and task ids go on past every one handed out."""
        with self.lock:
            queue = TaskQueue(self.settings, self._clock)
            queue.restore(state)
            queue.take_over_workers(self.queue)
            self.queue = queue

    def rebuild(self, advances: Iterable[tuple[int, int, int, int]]) -> int:
        """Replaces the queue with one rebuilt from a shard's copy of the ledger (a coordinator
        that restarted without a saved one; ValueError: the copy does not fit); the records it
        counts as applied. The workers stay live and task ids go on past every one handed out."""
        with self.lock:
            queue = TaskQueue(self.settings, self._clock)
            records = queue.rebuild(advances)
            queue.take_over_workers(self.queue)
            self.queue = queue
            return records
