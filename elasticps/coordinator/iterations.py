"""Decentralized jobs: the iteration each worker last reported (its heartbeats). Pure.

The standalone coordinator of a decentralized job (``coordinator/main.py``) has no PS whose version
counts the model's updates; the workers' iterations stand in for it: the newest iteration any worker
reached is the job's "model version" (evaluations every ``evaluationSteps`` of it), and the lowest
and highest of every worker's latest go to the job status (``kubectl get tj`` shows both; a worker
that finished keeps its last, so the figures stay after the job).
"""

from __future__ import annotations

import threading


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

    def span(self) -> tuple[int, int]:
        """(lowest, highest) of the workers' latest iterations; (-1, -1) before any report."""
        with self._lock:
            known = list(self._latest.values())
        return (min(known), max(known)) if known else (-1, -1)
