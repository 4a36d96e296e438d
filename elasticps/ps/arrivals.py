"""A sync round's dense sum made as the pushes arrive, piece by piece, never holding a push whole.

Called by the sync rule (``rules.RoundAveraging``), which the bulk server (``ps/bulk.py``) asks,
through the store, for a :class:`Stream` when a push's head arrives; the stream's pieces
(``rpc/frames.Chunked``) are checked (finite) and added into the round's sum
(``tables.DenseSum.receive``) as they come. A shard then holds its variables, the round's sum and
one piece of each push in flight: no staged copy per worker (the staging path holds one whole
gradient per member until the round commits).

The price: a gradient in the sum cannot be taken out of it. So the sum must hold exactly
gradients the round counts, and when it cannot, the round is aborted on every shard (the
coordinator's dry run hears RoundError before any shard applied it) and its members train again:

* a push refused after some of its pieces were summed (a later piece not finite), or cut off
  (the worker died, a deadline passed), spoils the sum; a push refused at its first piece does not;
* a worker that pushes a second gradient into one round (another minibatch) spoils it; the same
  minibatch again (a retried push) is received and dropped, accepted;
* a round that does not name every worker summed, or commits while a push is still arriving
  (a worker lost mid-round, a worker started after the round opened, gradsToWait below the
  workers), is a *mismatch*: aborted, and sum on arrival then pauses (:class:`Pause`), those pushes
  staged whole, for 4 rounds, 8 after the next mismatch, doubling up to 256, so a job whose rounds
  never count every pusher (backup workers) pays a handful of aborted rounds, not one per round.

A round may mix summed pushes and whole staged ones (a push over gRPC frames, one that came while a
dry run held the round): the whole ones are added at the commit, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from elasticps.ps.errors import GradientError
from elasticps.ps.layout import Described
from elasticps.ps.optimizers import finite
from elasticps.ps.outcomes import PushOutcome
from elasticps.ps.tables import DenseSum

FIRST_PAUSE = 4  # rounds without sum on arrival after a first mismatch
LONGEST_PAUSE = 256


@dataclass
class Pause:
    """When sum on arrival may be used: not for a while after a mismatch, longer each time."""

    resumes_at: int = 0  # the first model version it is used again
    length: int = 0  # rounds of the last pause

    def allows(self, version: int) -> bool:
        return version >= self.resumes_at

    def mismatched(self, version: int) -> None:
        self.length = min(LONGEST_PAUSE, max(FIRST_PAUSE, 2 * self.length))
        self.resumes_at = version + 1 + self.length


@dataclass(frozen=True)
class PushHead:
    """What a push's head says, as the rule needs it to open a stream."""

    computed_on: int
    base_lr: float
    worker: str
    minibatch: str


@dataclass
class Arrivals:
    """The sum of one model version's arriving pushes and who is in it; guarded by ``lock``
    (taken after the rule's lock, never before it)."""

    sums: DenseSum
    pause: Pause = field(default_factory=Pause)
    lock: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0  # bumped whenever the sum is reset: older streams add nothing
    members: dict[str, str] = field(default_factory=dict)  # worker -> minibatch, summed whole
    arriving: dict[str, Stream] = field(default_factory=dict)  # worker -> its push being summed
    spoiled: str = ""  # why the sum holds what no round can count ("" while it is sound)

    def busy(self) -> bool:
        return bool(self.members or self.arriving or self.spoiled)

    def spoil(self, reason: str) -> None:
        if not self.spoiled:
            self.spoiled = reason

    def reset(self) -> None:
        """Forgets every push summed or arriving (the caller clears the sums)."""
        self.generation += 1
        self.members.clear()
        self.arriving.clear()
        self.spoiled = ""

    def mismatch(self, workers: set[str]) -> str:
        """Why the sum cannot serve a round of ``workers`` ("" when it can)."""
        if self.spoiled:
            return self.spoiled
        extra = sorted(set(self.members) - workers)
        if extra:
            return f"the gradients of {extra} were summed as they arrived, and the round does not count them"
        if self.arriving:
            return f"pushes of {sorted(self.arriving)} were arriving into the sum when the round closed"
        return ""


class Stream:
    """One push being summed as it arrives: :meth:`take` each piece, then :meth:`finish`, or
    :meth:`cut` when it ends early. ``adding`` False: a retried push of a minibatch already
    summed, received and dropped."""

    def __init__(
        self,
        arrivals: Arrivals,
        head: PushHead,
        adding: bool,
        done: Callable[[Stream], PushOutcome],
    ) -> None:
        self.arrivals = arrivals
        self.head = head
        self.adding = adding
        self.generation = arrivals.generation
        self.added = False  # some piece is in the sum
        self.late = False  # the sum was reset while it arrived: it was not counted
        self._done = done

    def take(self, spec: Described, start: int, values: np.ndarray) -> None:
        """Checks one piece and adds it; GradientError when it is not finite (the sum is spoiled
        if an earlier piece of this push is in it)."""
        if self.adding and not finite(values):
            with self.arrivals.lock:
                if self.added and self.generation == self.arrivals.generation:
                    self.arrivals.spoil(
                        f"a push of worker {self.head.worker!r} was refused after part of it was summed "
                        f"(gradient {spec.name!r} holds NaN or infinity)"
                    )
                self._leave()
            raise GradientError(f"gradient {spec.name!r} holds NaN or infinity")
        with self.arrivals.lock:
            if self.generation != self.arrivals.generation:
                self.late = True
            elif self.adding:
                self.arrivals.sums.receive(spec.name, start, values)
                self.added = True

    def cut(self) -> None:
        """The push ended before its last piece (refused, cut off, past its deadline)."""
        with self.arrivals.lock:
            if self.added and self.generation == self.arrivals.generation:
                self.arrivals.spoil(f"a push of worker {self.head.worker!r} was cut off after part of it was summed")
            self._leave()

    def _leave(self) -> None:
        if self.arrivals.arriving.get(self.head.worker) is self:
            del self.arrivals.arriving[self.head.worker]

    def finish(self) -> PushOutcome:
        """Every piece arrived: the rule stages the push as summed (its outcome)."""
        return self._done(self)

    def settle(self) -> bool:
        """Called by the rule, under both locks, once every piece arrived: True when the push is
        counted in the sum (or was already, for a retried one)."""
        self._leave()
        if self.late or self.generation != self.arrivals.generation:
            return False
        if self.adding:
            self.arrivals.members[self.head.worker] = self.head.minibatch
        return True
