"""Hop's queues at one worker (seed 004, sections 4 and 6): the update queue and the token queues. Pure.

No threads and no waiting here: every operation answers at once (``collect`` returns None when the
updates are not all in yet), so the rules can be tested, and a whole graph of workers simulated under
any interleaving, without TensorFlow or gRPC. The worker's transport wraps them in a lock and a
condition to block.

**Update queue** of worker ``i``: the models its in-neighbours sent, each tagged with the iteration it
was sent in and its sender. As in section 6.1 it is ``max_ig + 1`` rotating slots, slot ``t mod (max_ig
+ 1)`` for tag ``t``: with token queues an in-neighbour is never more than ``max_ig`` iterations ahead,
so the tags still to be used, ``Iter(i) .. Iter(i) + max_ig``, each have a slot of their own. An update
whose tag can no longer be used (older than the current iteration, or than the staleness window) is
dropped when it arrives or when its slot is next touched, which keeps the queue within ``(1 + max_ig)
|N_in|`` updates.

**Excused senders.** A worker that jumps from ``k0`` to ``k`` (skipped iterations) sends nothing for
``k0 + 1 .. k - 1``, and one that has left (its data ran out, or it was removed) sends nothing more; it
tells its out-neighbours so (:meth:`UpdateQueue.excuse`) and they stop waiting for it in those
iterations. Without this a neighbour still in the skipped range would wait for ever.

**Token queues** of worker ``j``: one per in-neighbour ``i``, holding ``max_ig`` tokens at the start. To
enter a new iteration ``i`` takes a token from each of its out-neighbours' queues for it; entering one,
``j`` puts a token in each of its own (section 4.2). So ``tokens(j -> i) = Iter(j) - Iter(i) + max_ig``
at all times, and ``i`` is never more than ``max_ig`` iterations ahead of ``j``. A worker that leaves
:meth:`TokenQueues.close` its queues: nobody waits on it any more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, Iterable, Sequence, TypeVar

from elasticps.decentralized.rules import Rule

T = TypeVar("T")
FOREVER = math.inf  # an excuse that never ends: the sender left


@dataclass(frozen=True)
class Update(Generic[T]):
    tag: int  # the iteration it was sent in
    sender: int
    payload: T


class UpdateQueue(Generic[T]):
    """What worker ``me`` received from its in-neighbours, and what it may reduce in an iteration."""

    def __init__(self, in_neighbours: Sequence[int], max_ig: int, rule: Rule) -> None:
        if max_ig < 1:
            raise ValueError(f"max_ig must be at least 1, got {max_ig}")
        self.in_neighbours = tuple(in_neighbours)
        self.max_ig = max_ig
        self.rule = rule
        self._slots: list[list[Update[T]]] = [[] for _ in range(max_ig + 1)]
        self._iteration = 0  # the receiver's: nothing older than its window is kept
        self._excused: dict[int, float] = {}  # sender -> last iteration it sends nothing for
        self._used: dict[int, int] = {}  # sender -> the newest tag already reduced (staleness)
        self.dropped = 0  # updates that arrived too late to be used, or were superseded

    # -- what arrives ---------------------------------------------------------------------------

    def put(self, update: Update[T]) -> bool:
        """Keep ``update`` if it may still be used; False when it is dropped (late, superseded, or from
        a worker that is not an in-neighbour)."""
        if update.sender not in self.in_neighbours or update.tag > self._iteration + self.max_ig:
            # Tokens keep an in-neighbour within max_ig ahead: anything further is not from this job's
            # protocol, and would overwrite a slot still in use.
            self.dropped += 1
            return False
        if update.tag < self.rule.oldest_usable(self._iteration) or update.tag <= self._used.get(update.sender, -1):
            self.dropped += 1
            return False
        slot = self._slots[update.tag % len(self._slots)]
        self._prune(slot)
        if any(u.sender == update.sender and u.tag == update.tag for u in slot):
            self.dropped += 1  # a resend of the same iteration: the first one stands
            return False
        if self.rule.newest_only:
            self._drop_older(update.sender, update.tag)
            if self._newest_tag(update.sender) > update.tag:
                self.dropped += 1
                return False
        slot.append(update)
        return True

    def excuse(self, sender: int, through: float) -> None:
        """``sender`` sends nothing for the iterations up to ``through`` (``FOREVER``: it left)."""
        if sender in self.in_neighbours:
            self._excused[sender] = max(self._excused.get(sender, -1), through)

    def rejoined(self, sender: int, through: int) -> None:
        """``sender`` was replaced and is back: waited for again from iteration ``through + 1`` (an
        earlier excuse, even one for ever, no longer holds)."""
        if sender in self.in_neighbours:
            self._excused[sender] = through

    # -- what the worker takes ------------------------------------------------------------------

    def collect(self, iteration: int) -> list[Update[T]] | None:
        """The updates to reduce in ``iteration`` under the rule, taken out of the queue; None while
        the rule still waits for some."""
        waited = tuple(s for s in self.in_neighbours if self._excused.get(s, -1) < iteration)
        candidates = self._candidates(iteration)
        chosen = self.rule.choose(iteration, waited, candidates, self._used)
        if chosen is None:
            return None
        for update in chosen:
            self._used[update.sender] = max(self._used.get(update.sender, -1), update.tag)
            self._slots[update.tag % len(self._slots)].remove(update)
        return chosen

    def advance(self, iteration: int) -> None:
        """The worker entered ``iteration``: drop what it can no longer use."""
        self._iteration = max(self._iteration, iteration)
        for slot in self._slots:
            self._prune(slot)

    # -- observation ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(len(slot) for slot in self._slots)

    def tags(self) -> list[tuple[int, int]]:
        """(tag, sender) of everything queued, for tests and logs."""
        return sorted((u.tag, u.sender) for slot in self._slots for u in slot)

    # -- inside -----------------------------------------------------------------------------------

    def _candidates(self, iteration: int) -> list[Update[T]]:
        oldest = self.rule.oldest_usable(iteration)
        return [u for slot in self._slots for u in slot if u.tag >= oldest]

    def _prune(self, slot: list[Update[T]]) -> None:
        oldest = self.rule.oldest_usable(self._iteration)
        kept = [u for u in slot if u.tag >= oldest]
        self.dropped += len(slot) - len(kept)
        slot[:] = kept

    def _drop_older(self, sender: int, tag: int) -> None:
        for slot in self._slots:
            kept = [u for u in slot if u.sender != sender or u.tag >= tag]
            self.dropped += len(slot) - len(kept)
            slot[:] = kept

    def _newest_tag(self, sender: int) -> int:
        return max((u.tag for slot in self._slots for u in slot if u.sender == sender), default=-1)


class TokenQueues:
    """Worker ``me``'s token queues, one per in-neighbour: how far each may run ahead of ``me``."""

    def __init__(self, in_neighbours: Iterable[int], max_ig: int) -> None:
        if max_ig < 1:
            raise ValueError(f"max_ig must be at least 1, got {max_ig}")
        self._tokens = {i: max_ig for i in in_neighbours}
        self.closed = False

    def size(self, neighbour: int) -> float:
        """Tokens waiting for ``neighbour`` (infinite once this worker left)."""
        if self.closed:
            return FOREVER
        return self._tokens[neighbour]

    def take(self, neighbour: int, count: int) -> bool:
        """``neighbour`` enters ``count`` new iterations: True if the tokens were there (and are taken)."""
        if count < 0:
            raise ValueError(f"cannot take {count} tokens")
        if self.closed:
            return True
        if self._tokens[neighbour] < count:
            return False
        self._tokens[neighbour] -= count
        return True

    def reset(self, counts: dict[int, int]) -> None:
        """A replaced worker rejoins at an iteration: each in-neighbour's tokens as the invariant
        says (``Iter(me) - Iter(neighbour) + max_ig``, given by the caller), and open again."""
        for neighbour in self._tokens:
            if neighbour in counts:
                self._tokens[neighbour] = max(0, counts[neighbour])
        self.closed = False

    def give(self, count: int) -> None:
        """This worker entered ``count`` new iterations: every in-neighbour may go ``count`` further."""
        for neighbour in self._tokens:
            self._tokens[neighbour] += count

    def close(self) -> None:
        """This worker left: nobody waits for it any more."""
        self.closed = True
