"""One decentralized worker's side of Hop, shared by its training loop and its gRPC service.

The pure queues (``queues.py``) under one lock: the service puts what neighbours send and excuse
(any thread), answers their token takes (waiting on the server's event loop, holding no thread),
and the training loop waits here for the models of its iteration (``collect``: Recv blocks until
the update is in) and enters the next iteration (``enter``: the update queue moves on before any
token is given, so a neighbour freed by them can send at once and be kept).
"""

from __future__ import annotations

import threading
import time
from typing import Generic, TypeVar

from elasticps.api.graph import Graph
from elasticps.decentralized.queues import FOREVER, TokenQueues, Update, UpdateQueue
from elasticps.decentralized.rules import Rule
from elasticps.rpc.waking import Changes

T = TypeVar("T")


class PeerState(Generic[T]):
    def __init__(self, me: int, graph: Graph, rule: Rule, max_ig: int) -> None:
        self.me = me
        self.graph = graph
        self.rule = rule
        self.max_ig = max_ig
        self._lock = threading.Condition()
        self.changes = Changes()  # token waiters on the server's loop look again after every change
        self._queue: UpdateQueue[T] = UpdateQueue(graph.in_neighbours(me), max_ig, rule)
        self._tokens = TokenQueues(graph.in_neighbours(me), max_ig)
        self._iteration = 0
        self._left = False
        self._gone: set[int] = set()  # neighbours that said they left: nobody to wait for or ask
        self._model: tuple[int, T] | None = None  # the newest model this worker sent, for PullModel

    # -- the network's side (the service) ---------------------------------------------------------

    def receive(self, update: Update[T]) -> tuple[bool, int, bool]:
        """A neighbour's model arrived: (kept, this worker's iteration, left)."""
        with self._lock:
            kept = False if self._left else self._queue.put(update)
            if kept:
                self._lock.notify_all()
            return kept, self._iteration, self._left

    def excuse(self, sender: int, through: float) -> None:
        with self._lock:
            self._queue.excuse(sender, through)
            self._lock.notify_all()

    def neighbour_left(self, neighbour: int) -> None:
        """``neighbour`` left the job: its models are not waited for, its tokens not asked."""
        with self._lock:
            self._gone.add(neighbour)
            self._queue.excuse(neighbour, FOREVER)
            self._lock.notify_all()

    def neighbour_rejoined(self, neighbour: int, through: int) -> None:
        """``neighbour`` was replaced and is back from iteration ``through + 1`` on."""
        with self._lock:
            self._gone.discard(neighbour)
            self._queue.rejoined(neighbour, through)
            self._lock.notify_all()

    def rejoin(self, iteration: int, in_iterations: dict[int, int]) -> None:
        """This worker replaces one that died at ``iteration``: it goes on from there, its
        in-neighbours' tokens as the invariant says for their iterations (``in_iterations``). The
        models they had already delivered to the one that died (up to ``max_ig`` iterations ahead
        of it) are gone with it and are not sent again: those iterations reduce what comes instead
        of waiting for it."""
        with self._lock:
            self._iteration = iteration
            self._queue.advance(iteration)
            for neighbour in self.graph.in_neighbours(self.me):
                self._queue.excuse(neighbour, iteration + self.max_ig)
            self._tokens.reset({j: iteration - it + self.max_ig for j, it in in_iterations.items()})
        self.changes.notify()

    def has_left(self, neighbour: int) -> bool:
        with self._lock:
            return neighbour in self._gone

    def try_take(self, neighbour: int, count: int) -> bool:
        """In-neighbour ``neighbour`` enters ``count`` more iterations, if the tokens are there."""
        with self._lock:
            return self._tokens.take(neighbour, count)

    def tokens(self, neighbour: int) -> float:
        with self._lock:
            return self._tokens.size(neighbour)

    @property
    def iteration(self) -> int:
        return self._iteration

    @property
    def left(self) -> bool:
        return self._left

    def newest_model(self) -> tuple[int, T] | None:
        """(iteration, model) of the newest model this worker sent out, or None before its first."""
        with self._lock:
            return self._model

    # -- the training loop's side ---------------------------------------------------------------

    def sent(self, iteration: int, model: T) -> None:
        """The loop sent ``model`` in ``iteration`` (what a rejoining neighbour pulls)."""
        with self._lock:
            self._model = (iteration, model)

    def collect(self, iteration: int, timeout_s: float) -> list[Update[T]] | None:
        """The models to reduce in ``iteration`` (per the rule), waiting up to ``timeout_s`` for them;
        None when they are not all in by then."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                got = self._queue.collect(iteration)
                if got is not None:
                    return got
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(remaining)

    def enter(self, iteration: int) -> None:
        """The loop enters ``iteration`` (one more, or several after a jump): drop what it can no
        longer use, then let every in-neighbour go as many iterations further."""
        with self._lock:
            if iteration <= self._iteration:
                raise ValueError(f"iteration {iteration} is not after {self._iteration}")
            given = iteration - self._iteration
            self._queue.advance(iteration)
            self._iteration = iteration
            self._tokens.give(given)
        self.changes.notify()

    def leave(self) -> None:
        """This worker's data ran out: nobody waits for its tokens any more."""
        with self._lock:
            self._left = True
            self._tokens.close()
            self._lock.notify_all()
        self.changes.notify()

    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def dropped(self) -> int:
        with self._lock:
            return self._queue.dropped


__all__ = ["FOREVER", "PeerState"]
