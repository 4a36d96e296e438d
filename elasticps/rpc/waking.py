"""Wakes calls waiting on an event loop when another thread says something changed.

Callers: the PS servicer (long-polling pulls wait for the model's version to move; the store's
update threads announce it) and the coordinator's engine (joins wait for a round to close; the
ticker and the committing threads announce it). A waiting call is a future on the loop, not a
thread: hundreds of them cost next to nothing.

:meth:`Changes.notify` may be called from any thread; waits happen on one event loop, the first
that waits (a server's), or in threads (:meth:`Changes.block`: joins over PS 0's bulk channel).
Every notify counts a new :attr:`Changes.generation`, so a waiter that read the generation before
it looked at the state misses nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class Changes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads = threading.Condition(self._lock)  # threads waiting in block()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Future[None]] = set()
        self._generation = 0
        self._scheduled = False  # a wake-up is on its way to the loop: notifies in between join it

    @property
    def generation(self) -> int:
        """How many notifies so far."""
        return self._generation

    def notify(self) -> None:
        """Something changed: every waiter looks again (thread-safe; wake-ups are coalesced)."""
        with self._lock:
            self._generation += 1
            self._threads.notify_all()
            loop = self._loop
            if loop is None or self._scheduled:
                return
            self._scheduled = True
        try:
            loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody waits any more
            with self._lock:
                self._scheduled = False

    def _wake(self) -> None:
        with self._lock:
            self._scheduled = False
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def block(self, seen: int, timeout_s: float) -> None:
        """Waits in this thread until a notify after generation ``seen``, or ``timeout_s`` passes."""
        with self._threads:
            self._threads.wait_for(lambda: self._generation != seen, timeout_s)

    async def wait_for(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Waits until ``ready()`` (checked now and after every notify) or ``timeout_s`` passes;
        ``ready()``'s last answer."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._loop is None:
                self._loop = loop
        if self._loop is not loop:
            raise RuntimeError("Changes are awaited on one event loop only")
        give_up_at = loop.time() + timeout_s
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)  # before looking: a change from now on wakes it
            try:
                if ready():
                    return True
                remaining = give_up_at - loop.time()
                if remaining <= 0:
                    return False
                await asyncio.wait((waiter,), timeout=remaining)
            finally:
                self._waiters.discard(waiter)
                waiter.cancel()
