"""The operator's client-side rate limit: one token bucket shared by every request it sends.

Callers: ``cluster_api`` (the passes' requests, from worker threads) waits with :meth:`RateLimiter.wait`;
``handlers`` puts kopf's requests (watches, its annotations) under the same bucket with
:meth:`RateLimiter.wait_async`. client-go's conventions: ``qps`` tokens are added per second, at most
``burst`` are kept, each request takes one; a request that finds none waits for its turn (requests
are served in the order they asked). ``qps <= 0`` turns the limit off.

Why a client-side limit at all: the API server is shared. A 1,024-worker job is over a thousand
creates; sent as fast as the operator can, they crowd out the scheduler, the kubelets and other
controllers (API Priority and Fairness shares the server out by flow, but only on servers that have
it configured for the operator's user). The defaults (``DEFAULT_QPS``, ``DEFAULT_BURST``) are the
kube-scheduler's own (50 and 100): a rate every cluster already takes from one of its components,
ten times client-go's 5/10, which would take over three minutes to create a 1,024-worker job.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

DEFAULT_QPS = 50.0
DEFAULT_BURST = 100


class RateLimiter:
    def __init__(self, qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST, clock: Callable[[], float] = time.monotonic) -> None:
        if qps > 0 and burst < 1:
            raise ValueError(f"burst must be >= 1 with a QPS limit, got {burst}")
        self.qps, self.burst = qps, burst
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._at = clock()

    @property
    def limited(self) -> bool:
        return self.qps > 0

    def reserve(self) -> float:
        """Takes a token (maybe one not yet there) and says how many seconds to wait before using it."""
        if not self.limited:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def wait(self) -> None:
        delay = self.reserve()
        if delay > 0:
            time.sleep(delay)

    async def wait_async(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)
