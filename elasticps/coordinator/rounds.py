"""Sync rounds: which workers' gradients make each model version. Pure; the coordinator's to hold.

One round per model version. A worker whose gradient is staged on every shard asks to join the
round; this module decides, and the coordinator's engine (``syncing.py``) carries the decisions out
by committing each closed round on every shard (``shards.py``). Because one place decides, every
shard averages the same gradients in every round, each once.

* **Admission.** A gradient computed on version ``v`` joins the open round ``r`` when
  ``0 <= r - v <= tolerance`` (``syncVersionTolerance``); otherwise it is refused and the worker
  trains that minibatch again on a newer model. A worker is in a round at most once.
* **Quorum.** When a round opens (its first join) its target is fixed: ``gradsToWait``, or, when
  that is 0, the number of live workers. The round closes as soon as its members reach
  ``min(target, members + others that can still join)``: a worker that is dead (silent past the task
  timeout), gone (left or restarted) or without training work (the data ran out) cannot join, so
  scaling down never stalls a round, and the last partial round of a job is applied.
* **Members that leave.** A member whose task goes back to the queue (it left, died, restarted or
  failed) is taken out of the open round: its minibatch will be trained again with its task.
* A closed round is committed before the next one opens; :meth:`Rounds.committed` records it.
* **LocalSGD.** Each join reports the member's period (local steps, mean training loss, learning
  rate); a committed round hands them to the job's :class:`~elasticps.coordinator.local_steps.LocalSteps`,
  which decides the next period, the same for every worker (:meth:`Rounds.period_after`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import Enum

from elasticps.api.spec import effective_grads_to_wait
from elasticps.coordinator.local_steps import LocalSteps


class Admission(Enum):
    ADMITTED = "admitted"  # in the open round (again, for a repeated join)
    REFUSED = "refused"  # too old for the open round
    BUSY = "busy"  # a closed round is being committed: ask again once it is


@dataclass(frozen=True)
class Period:
    """A LocalSGD member's report with its join: what its model delta was trained with."""

    steps: int
    loss: float
    learning_rate: float


@dataclass(frozen=True)
class Closed:
    round: int
    members: tuple[str, ...]
    target: int  # the gradients the round wanted (fewer members: a short round)
    periods: tuple[Period, ...] = ()  # LocalSGD: the members' reports


@dataclass
class Rounds:
    grads_to_wait: int = 0  # 0: one gradient per live worker
    tolerance: int = 0
    version: int = 0  # rounds committed so far: the model version
    _members: dict[str, int] = field(default_factory=dict)  # open round: worker -> version computed on
    _target: int = 0  # fixed when the round opens
    closing: Closed | None = None  # closed, not yet committed on every shard
    _recent: deque[tuple[int, frozenset[str]]] = field(default_factory=lambda: deque(maxlen=64))
    short_rounds: int = 0  # rounds closed with fewer members than their target
    aborted_rounds: int = 0  # rounds a shard refused before any applied them
    periods: LocalSteps | None = None  # LocalSGD: the schedule of local steps
    _reports: dict[str, Period] = field(default_factory=dict)  # open round: worker -> its period

    # ---- decisions ---------------------------------------------------------------------------
    def join(self, worker: str, computed_on: int, live: int, period: Period | None = None) -> Admission:
        """``worker``'s staged gradient of version ``computed_on`` asks to join the open round
        (LocalSGD: ``period``, what its model delta was trained with)."""
        if self.closing is not None:
            return Admission.BUSY
        if worker in self._members:
            return Admission.ADMITTED
        if not 0 <= self.version - computed_on <= self.tolerance:
            return Admission.REFUSED
        if not self._members:
            self._target = self.target(live)
        self._members[worker] = computed_on
        if period is not None:
            self._reports[worker] = period
        return Admission.ADMITTED

    def target(self, live: int) -> int:
        """The gradients a round opened now would average: gradsToWait, or the live workers."""
        return effective_grads_to_wait(self.grads_to_wait, live)

    def due(self, can_join: Collection[str]) -> Closed | None:
        """Closes the open round when it has its quorum; ``can_join``: the workers that could still
        join (live, with training work to do). The closed round must then be committed."""
        if self.closing is not None or not self._members:
            return None
        others = sum(1 for w in can_join if w not in self._members)
        if len(self._members) < min(self._target, len(self._members) + others):
            return None
        members = tuple(sorted(self._members))
        reports = tuple(self._reports[w] for w in members if w in self._reports)
        closed = Closed(self.version, members, self._target, reports)
        self.closing = closed
        self._members, self._reports = {}, {}
        return closed

    def drop(self, worker: str) -> None:
        """``worker`` left the job or lost its task: it no longer counts in the open round."""
        self._members.pop(worker, None)
        self._reports.pop(worker, None)

    def committed(self, closed: Closed) -> None:
        """Every shard applied ``closed``: the next round opens."""
        if self.closing != closed:
            raise ValueError(f"round {closed.round} is not the one being committed")
        self.closing = None
        self.version += 1
        if len(closed.members) < closed.target:
            self.short_rounds += 1
        self._recent.append((closed.round, frozenset(closed.members)))
        if self.periods is not None and closed.periods:
            reports = closed.periods
            self.periods.committed(
                closed.round,
                max(p.steps for p in reports),
                sum(p.loss for p in reports) / len(reports),
                sum(p.learning_rate for p in reports) / len(reports),
            )

    def abort(self, closed: Closed) -> None:
        """A shard could not take ``closed`` (checked before any applied it): it is dropped, and its
        members, refused, train their minibatches again."""
        if self.closing != closed:
            raise ValueError(f"round {closed.round} is not the one being committed")
        self.closing = None
        self.aborted_rounds += 1

    # ---- questions ---------------------------------------------------------------------------
    def is_member(self, worker: str) -> bool:
        """Whether ``worker`` is in the open round, or in the closed one being committed."""
        return worker in self._members or (self.closing is not None and worker in self.closing.members)

    def counted(self, worker: str, round_: int) -> bool | None:
        """Whether round ``round_`` counted ``worker``'s gradient; None while it is not committed."""
        if round_ >= self.version:
            return None
        return any(r == round_ and worker in members for r, members in self._recent)

    def round_of(self, worker: str) -> int | None:
        """The round ``worker`` is a member of (open or closing), if any."""
        if self.closing is not None and worker in self.closing.members:
            return self.closing.round
        return self.version if worker in self._members else None

    def period_after(self, round_: int) -> int:
        """LocalSGD: the local steps of the period after round ``round_`` (0 for other modes)."""
        return 0 if self.periods is None else self.periods.after(round_)

    def effective_grads_to_wait(self, live: int) -> int:
        """What the status shows: the open round's target (or the next one's), clamped to the live workers."""
        target = self._target if self._members else self.target(live)
        return max(1, min(target, live)) if live > 0 else target

    def reset(self, version: int) -> None:
        """Every shard is at ``version`` (a restore): rounds go on from there, the open one forgotten."""
        self.version = version
        self._members, self._reports = {}, {}
        self.closing = None
        self._recent.clear()
