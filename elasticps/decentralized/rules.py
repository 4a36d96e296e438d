"""Hop's rules (seed 004): which received models a worker reduces in an iteration, with what weights,
and when a straggler skips iterations. Pure; one class per rule, chosen once from the spec.

* :class:`Standard`: every in-neighbour's model of this iteration (section 4.1/4.2).
* :class:`Backup`: ``N_in - b`` of them, plus any others already in; later ones are dropped by their
  tag (section 4.3).
* :class:`Staleness`: from every in-neighbour its newest model, which must be at most ``s`` iterations
  old; a model already reduced still satisfies the bound but is not reduced again; the reduce weighs
  a model ``d`` iterations old by ``1 / (1 + d)`` of its edge weight (the seed's "iteration-weighted
  average", whose formula its text does not carry: our choice, newer counts more) (section 4.4).

An in-neighbour that is *excused* in an iteration (it skipped it, or left) is not waited for; with
backup workers it counts as one of the missing, so a worker still reduces ``min(N_in - b, waited)``
models.

Skipping (section 5): a worker ``lag`` iterations behind every out-neighbour (``lag = tokens -
max_ig``, read from their token queues) with ``lag >= trigger`` jumps ahead to at most the slowest of
them, skipping at most ``max_jump`` iterations; before it does, it receives and reduces the models of
the iteration before its target (``Recv(k - 1)`` + Reduce). Under the standard rule an out-neighbour
is never more than one iteration ahead (it needs this worker's model), so skipping only acts with
backup workers or staleness, as in the seed's experiments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, TypeVar



class Tagged(Protocol):
    @property
    def tag(self) -> int: ...

    @property
    def sender(self) -> int: ...


U = TypeVar("U", bound=Tagged)


class Rule(Protocol):
    newest_only: bool  # keep only each sender's newest model

    def oldest_usable(self, iteration: int) -> int:
        """The oldest tag that may still be reduced in ``iteration``."""
        ...

    def choose(self, iteration: int, waited: Sequence[int], candidates: Sequence[U], used: Mapping[int, int]) -> list[U] | None:
        """Out of ``candidates`` (usable, unreduced updates), those to reduce now; None to wait.
        ``waited``: the in-neighbours not excused in ``iteration``; ``used``: each sender's newest tag
        already reduced."""
        ...

    def weight(self, iteration: int, tag: int) -> float:
        """How much of its edge weight a model tagged ``tag`` keeps when reduced in ``iteration``."""
        ...


@dataclass(frozen=True)
class Standard:
    newest_only = False

    def oldest_usable(self, iteration: int) -> int:
        return iteration

    def choose(self, iteration: int, waited: Sequence[int], candidates: Sequence[U], used: Mapping[int, int]) -> list[U] | None:
        current = [u for u in candidates if u.tag == iteration]
        senders = {u.sender for u in current}
        return current if all(s in senders for s in waited) else None

    def weight(self, iteration: int, tag: int) -> float:
        return 1.0


@dataclass(frozen=True)
class Backup:
    in_degree: int  # |N_in|
    backups: int  # b: how many in-neighbours' models an iteration may go without

    newest_only = False

    def oldest_usable(self, iteration: int) -> int:
        return iteration

    def choose(self, iteration: int, waited: Sequence[int], candidates: Sequence[U], used: Mapping[int, int]) -> list[U] | None:
        current = [u for u in candidates if u.tag == iteration]
        need = min(max(self.in_degree - self.backups, 0), len(waited))
        return current if len(current) >= need else None

    def weight(self, iteration: int, tag: int) -> float:
        return 1.0


@dataclass(frozen=True)
class Staleness:
    bound: int  # s

    newest_only = True

    def oldest_usable(self, iteration: int) -> int:
        return iteration - self.bound

    def choose(self, iteration: int, waited: Sequence[int], candidates: Sequence[U], used: Mapping[int, int]) -> list[U] | None:
        oldest = self.oldest_usable(iteration)
        fresh = {u.sender for u in candidates if u.tag >= oldest}
        if all(s in fresh or used.get(s, -1) >= oldest for s in waited):
            return [u for u in candidates if u.tag >= oldest]
        return None

    def weight(self, iteration: int, tag: int) -> float:
        return 1.0 / (1 + max(iteration - tag, 0))


def rule_for(in_degree: int, backups: int, staleness: int) -> Rule:
    """The rule of a job's ``backupWorkers`` and ``staleness`` (at most one of them set)."""
    if backups and staleness:
        raise ValueError("backup workers and bounded staleness are two rules: choose one")
    if backups:
        return Backup(in_degree, backups)
    if staleness:
        return Staleness(staleness)
    return Standard()


def reduce_weights(
    rule: Rule, iteration: int, own_weight: float, chosen: Sequence[tuple[int, float]]
) -> tuple[float, list[float]]:
    """Normalised weights of a reduce in ``iteration``: of the worker's own model (edge weight
    ``own_weight``, tag ``iteration``) and of each chosen model, given as ``(tag, edge weight)``; the
    missing in-neighbours' weight is shared out in proportion (the weights always sum to one)."""
    raw = [w * rule.weight(iteration, tag) for tag, w in chosen]
    total = own_weight + sum(raw)
    return own_weight / total, [w / total for w in raw]


def rejoin_point(max_ig: int, out: Mapping[int, tuple[int, int]]) -> tuple[int, dict[int, int]] | None:
    """Where a restarted worker's predecessor stopped, as its out-neighbours' token queues tell:
    ``out`` maps each to (its iteration, the tokens it holds for this worker), and ``tokens = Iter(j)
    - Iter(me) + max_ig`` gives ``Iter(me)``. The furthest any says, with the tokens still to take
    from the others to stand there too (a predecessor killed between two takes); None when every
    queue says 0: a fresh start."""
    said = {j: iteration - tokens + max_ig for j, (iteration, tokens) in out.items()}
    point = max(said.values(), default=0)
    if point <= 0:
        return None
    return point, {j: point - k for j, k in said.items() if k < point}


@dataclass(frozen=True)
class Skipping:
    max_jump: int = 0  # at most this many iterations skipped at once; 0: never skip
    trigger: int = 2  # jump when at least this many iterations behind every out-neighbour

    def target(self, iteration: int, lags: Sequence[float]) -> int:
        """The iteration to enter after ``iteration``: the next one, or further when the worker is
        ``lags`` behind its out-neighbours (each ``Iter(j) - Iter(i)``, from their token queues)."""
        known = [lag for lag in lags if math.isfinite(lag)]  # a neighbour that left has no iteration
        if self.max_jump <= 0 or not known:
            return iteration + 1
        lag = min(known)
        if lag < self.trigger or lag < 2:
            return iteration + 1
        return iteration + int(min(lag, self.max_jump + 1))
