"""The work queue between kopf's events and the passes: one pass at a time per job, bursts coalesced.

Callers: ``handlers`` call :meth:`WorkQueue.request` for every TrainingJob change and every event of
one of its pods, and :meth:`WorkQueue.forget` when a job is deleted; the queue runs the pass
(``reconciling.Reconcile``) in a worker thread, on kopf's event loop's default executor.

Why not one pass per event: creating a 34-pod job makes well over a hundred pod events (created,
scheduled, running, ready); each pass lists the pods anyway, so every event that arrives within
``debounce_s`` of another, or while a pass runs, is served by one (next) pass, like a controller-
runtime work queue. Each running job also gets a pass after ``resync_s`` without one (the idle-aware
timer: a missed event, or a coordinator that has news, is noticed); a finished one only on events
(its pods, its spec) and when a ``Recheck`` falls due (the TTL). A failed pass is retried with
exponential backoff up to ``max_backoff_s``.

The timer is ours rather than ``kopf.timer``: kopf puts a finalizer on every object a timer
watches (``requires_finalizer=True`` in kopf 1.45's ``on.timer``), and a finalizer makes
``kubectl delete trainingjob`` hang whenever the operator is down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from elasticps.operator.executing import Outcome
from elasticps.operator.reconciling import JobKey

log = logging.getLogger(__name__)


@dataclass
class _JobState:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    timer_due: float = 0.0
    failures: int = 0
    passes: int = 0
    finished: bool = False


class WorkQueue:
    def __init__(
        self,
        run_pass: Callable[[JobKey], Outcome],
        *,
        debounce_s: float = 0.2,
        resync_s: float = 10.0,
        max_backoff_s: float = 30.0,
        on_pass: Callable[[JobKey, Outcome], None] | None = None,
    ) -> None:
        self._run_pass = run_pass
        self._debounce_s = debounce_s
        self._resync_s = resync_s
        self._max_backoff_s = max_backoff_s
        self._on_pass = on_pass
        self._jobs: dict[JobKey, _JobState] = {}
        self._closed = False

    def request(self, key: JobKey, after_s: float = 0.0) -> None:
        """A pass of ``key`` soon (after the debounce), or not before ``after_s`` seconds."""
        if self._closed:
            return
        state = self._jobs.get(key)
        if state is None:
            state = self._jobs[key] = _JobState()
            state.task = asyncio.get_running_loop().create_task(self._work(key, state), name=f"elasticps pass {key}")
        if after_s <= 0:
            state.wake.set()
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + after_s
        if state.timer is not None and state.timer_due <= due:
            return  # an earlier wake-up is already set
        if state.timer is not None:
            state.timer.cancel()
        state.timer, state.timer_due = loop.call_at(due, self._wake_later, key, state), due

    def forget(self, key: JobKey) -> None:
        state = self._jobs.pop(key, None)
        if state is not None:
            _stop(state)

    @property
    def jobs(self) -> list[JobKey]:
        return list(self._jobs)

    async def close(self) -> None:
        self._closed = True
        states, self._jobs = list(self._jobs.values()), {}
        for state in states:
            _stop(state)
        tasks = [s.task for s in states if s.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _wake_later(self, key: JobKey, state: _JobState) -> None:
        state.timer = None
        if self._jobs.get(key) is state:
            state.wake.set()

    async def _work(self, key: JobKey, state: _JobState) -> None:
        while True:
            try:
                await asyncio.wait_for(state.wake.wait(), timeout=None if state.finished else self._resync_s)
            except TimeoutError:
                pass  # idle: resync
            await asyncio.sleep(self._debounce_s)
            state.wake.clear()
            try:
                outcome = await asyncio.to_thread(self._run_pass, key)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a pass must never kill the queue
                state.failures += 1
                delay = min(self._max_backoff_s, 0.5 * 2**state.failures)
                log.warning("%s: pass failed (%s: %s); again in %.1f s", key, type(err).__name__, err, delay)
                self.request(key, delay)
                continue
            state.passes += 1
            state.finished = outcome.finished
            if self._on_pass is not None:
                self._on_pass(key, outcome)
            if outcome.gone:
                if self._jobs.get(key) is state:
                    del self._jobs[key]
                if state.timer is not None:
                    state.timer.cancel()
                return
            if outcome.retry:
                state.failures += 1
                self.request(key, min(self._max_backoff_s, 0.5 * 2**state.failures))
            else:
                state.failures = 0
            if outcome.recheck_after is not None:
                self.request(key, outcome.recheck_after)


def _stop(state: _JobState) -> None:
    if state.timer is not None:
        state.timer.cancel()
    if state.task is not None:
        state.task.cancel()
