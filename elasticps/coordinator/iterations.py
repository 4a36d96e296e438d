"""Decentralized jobs: the iteration each worker last reported (its heartbeats). Pure.

The standalone coordinator of a decentralized job (``coordinator/main.py``) has no PS whose version
counts the model's updates; the workers' iterations stand in for it: the newest iteration any worker
reached is the job's "model version" (evaluations every ``evaluationSteps`` of it), and the lowest
and highest of the live workers' go to the job status (``kubectl get tj`` shows both).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Iterations:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, int] = {}
        self._newest = 0

    def heard(self, worker: str, iteration: int) -> None:
        with self._lock:
            self._latest[worker] = max(iteration, self._latest.get(worker, 0))
            self._newest = max(self._newest, iteration)

    @property
    def newest(self) -> int:
        """The highest iteration any worker reached (never goes back)."""
        with self._lock:
            return self._newest

    def span(self, live: Iterable[str]) -> tuple[int, int]:
        """(lowest, highest) iteration of the ``live`` workers that reported one; (-1, -1) if none."""
        with self._lock:
            known = [self._latest[w] for w in live if w in self._latest]
        return (min(known), max(known)) if known else (-1, -1)
