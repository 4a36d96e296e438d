"""A worker made slower on purpose (``spec.training.slowdown``): it sleeps after computing.

Built once by ``worker/main.py`` from the job's :class:`~elasticps.api.slowdown.Slowdown` and the
worker's id; :class:`~elasticps.worker.local_model.LocalModel` calls :meth:`Pace.after` with the
seconds each minibatch's gradients took (a decentralized worker's
:meth:`~elasticps.worker.peer_model.PeerModel.slow`: the seconds its whole iteration worked, the
averaging of its neighbours' models included), and this sleeps ``factor - 1`` times as long, as a
processor ``factor`` times slower would have taken. The random protocol draws from a generator
seeded by the worker's id, so a run's slow steps are the same when it runs again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from elasticps.api.slowdown import Slowdown


class Pace:
    def __init__(self, slowdown: Slowdown, worker: int, sleep: Callable[[float], None] = time.sleep) -> None:
        self._slowdown = slowdown
        self._worker = worker
        self._draws = random.Random(worker * 7919 + 17)
        self._sleep = sleep
        self.slept_s = 0.0  # over the worker's life
        self.slow_steps = 0

    def after(self, seconds: float) -> float:
        """The minibatch's gradients took ``seconds``: sleeps what a slower worker would add; the
        seconds slept."""
        factor = self._slowdown.factor(self._worker, self._draws.random())
        extra = max(0.0, factor - 1.0) * max(0.0, seconds)
        if extra > 0:
            self._sleep(extra)
            self.slept_s += extra
            self.slow_steps += 1
        return extra


def pace_for(text: str, worker: int) -> Pace | None:
    """The pace of worker ``worker`` under the job's slowdown text, or None when it is never slowed."""
    slowdown = Slowdown.parse(text)
    if slowdown.factor(worker, 1.0) <= 1.0 and not (slowdown.random_factor > 1.0 and slowdown.random_probability > 0):
        return None
    return Pace(slowdown, worker)
