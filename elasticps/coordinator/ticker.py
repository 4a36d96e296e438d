"""The coordinator's ticker (sync jobs): one thread that keeps the rounds moving when no call does.

It first runs the start-up recovery (``first``), then calls ``tick`` every :data:`TICK_S`: a round
whose missing members died or ran out of work still closes, a silent worker's task goes back, and
a restarted shard is noticed. Waiting joins look again at least this often too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

TICK_S = 0.5


def start_ticker(first: Callable[[], None], tick: Callable[[], None], stopped: threading.Event) -> threading.Thread:
    """Starts the daemon thread; it ends once ``stopped`` is set."""

    def run() -> None:
        first()
        while not stopped.wait(TICK_S):
            tick()

    thread = threading.Thread(target=run, name="rounds", daemon=True)
    thread.start()
    return thread
