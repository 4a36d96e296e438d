"""Update rules: how a shard turns pushed gradients into model versions (the PS half of a mode).

Callers: the store (``store.py``) builds its rule once, through :func:`make_rule`, from the
``TrainingMode`` in its settings, and then only moves data: it checks a push against its tables and
hands it to the rule, and it reads under the rule's :meth:`Rule.guard`. The servicer asks
:attr:`Rule.consistent_reads` (through the store) whether it may encode a version once for every
puller. In the spirit of ps-lite's server request handle, the rule alone decides what a push does.

* :class:`RoundAveraging` (seed 000's synchronous SGD, the default): a push is *staged*, one per
  worker, when ``0 <= version_ps - version <= sync_version_tolerance``; nothing is applied until the
  coordinator commits the round (:meth:`Rule.commit`) naming exactly which workers' gradients it
  counts. Every shard gets the same commit, so every shard averages the same minibatches, each once,
  and all shards move to the same version together (``coordinator/rounds.py`` decides rounds).
  The coordinator's dry run computes the round's update aside and checks it is finite (a sum of
  finite gradients can overflow); a non-finite one is refused there (RoundError), so the round is
  aborted on every shard before any applied it, and its members train again. The commit that
  follows applies it: in place from the averaged sums, kept until then, when bounds proved it
  finite (the common case), else by copying the computed update in; it is the update the dry run
  checked even if a member pushed again in between (once every shard's dry run passed, the commit
  must not fail). A push of the dense variables over the bulk channel is added to the round's sum
  piece by piece as it arrives (``arrivals.py``), never held whole; a round that cannot count
  exactly the pushes so summed is aborted (RoundError) and sum on arrival pauses for a while. A
  push staged whole is added at the commit; the sum is made in the first such member's gradient
  when the PS received it into its own buffers (``Gradient.received``) and nothing was summed. A
  dry run whose round is not committed leaves the gradients summed into spent: a later round of
  the same minibatches reuses the computation, one that names their workers with others is
  refused until they push again. Updates and reads
  hold one lock, so a pull never sees half an update.
* :class:`AsyncApply`: every gradient is applied at once, without a shard-wide lock (with
  ``use_locking``, one writer per variable); pulls read the live arrays, so a pulled model may mix
  versions. A push whose update would leave a variable or slot NaN or infinite is refused whole
  (``tables.py`` computes it aside first). Its learning rate per push comes from a :class:`~elasticps.ps.staleness.LearningRate`,
  wrapped in :class:`~elasticps.ps.staleness.StalenessAware` for ``lrStalenessModulation``, and
  its implicit momentum, taken off the optimizer's, from the job's
  :class:`~elasticps.ps.staleness.Compensation` (``stalenessCompensation``), both from that push's
  own staleness.

* :class:`ModelAveraging` (LocalSGD, seed 003): rounds as :class:`RoundAveraging`'s, but what a
  worker pushes is its model delta over K local steps, as a descent direction: the weights it
  pulled minus the weights it trained to. The round averages the members' deltas and applies them
  with plain SGD at learning rate 1 (:data:`AVERAGING`, whatever optimizer the worker pushed: that
  one runs on the workers, between averagings), so the shard's weights become the members' models
  averaged. The worker's learning rate on the push is not used.

Adding a mode: a member of ``api.modes.UpdateRule``, a :class:`Rule` subclass here, an entry in
:data:`RULES`.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from elasticps.api.modes import UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.arrivals import Arrivals, Pause, PushHead, Stream
from elasticps.ps.errors import GradientError
from elasticps.ps.model import Model, Update
from elasticps.ps.outcomes import PushOutcome
from elasticps.ps.settings import StoreSettings
from elasticps.ps.staleness import (
    COMPENSATIONS,
    Compensation,
    LearningRate,
    StalenessAware,
    as_given,
    staleness,
    uncompensated,
)
from elasticps.ps.tables import DENSE, Accumulator, DenseSum, Staged
from elasticps.ps.versions import ModelVersion


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gradient:
    """One checked push: each table's gradient, the version it was computed on, who sent it."""

    update: Update
    computed_on: int
    base_lr: float
    worker: str = ""
    minibatch: str = ""  # the worker's name for the minibatch (audit log; see CommitOutcome)
    received: bool = False  # its arrays are the PS's own (received into its buffers): a round may sum into them
    summed: bool = False  # its dense gradient went into the round's sum as it arrived (arrivals.py): not in update


@dataclass(frozen=True)
class CommitOutcome:
    version: int  # the store's version after the commit
    applied: tuple[str, ...]  # the minibatches averaged by this commit (empty: already applied)
    summed: int = 0  # how many of them were summed as they arrived (arrivals.py), not staged whole


@dataclass(frozen=True)
class _Prepared:
    """A sync round's update computed by a dry run, kept for the commit that follows it."""

    round: int
    members: list[Gradient]
    staged: list[Staged]
    spent: list[Gradient]  # members whose memory holds the sum: their pushed values are gone

    def applies(self, round_: int, workers: Sequence[str], staged: Mapping[str, Gradient], dry_run: bool) -> bool:
        """Whether this computation is the one for round ``round_`` of ``workers``: the same round
        and members, each member's staged gradient the one summed or a push of the same minibatch
        again (a retried push; the minibatch trained again after the round was aborted). The
        commit that follows a dry run takes it in any case: once every shard's dry run passed, it
        must not fail, and one gradient per member is counted either way."""
        if self.round != round_ or [g.worker for g in self.members] != list(workers):
            return False
        return not dry_run or all(_same_minibatch(staged.get(g.worker), g) for g in self.members)


def _same_minibatch(now: Gradient | None, then: Gradient) -> bool:
    return now is then or (now is not None and bool(then.minibatch) and now.minibatch == then.minibatch)


class RoundError(Exception):
    """A commit this shard cannot apply: ahead of its version, or naming a gradient it does not hold."""


class Rule(abc.ABC):
    """One shard's update rule; a push reaches it already checked against the model's tables."""

    # True: a version's parameters never change while pulls read them, so its encoding can be shared.
    consistent_reads: ClassVar[bool]

    def reset(self, model: Model) -> None:
        """A model was installed (first push or restore): forget what was pending for the old one.

        Called under :meth:`guard`."""

    @abc.abstractmethod
    def push(self, model: Model, version: ModelVersion, gradient: Gradient) -> PushOutcome:
        """Applies or stages ``gradient``."""

    def open_stream(self, version: ModelVersion, head: PushHead) -> Stream | None:
        """A stream that takes a push of dense gradients piece by piece as it arrives
        (``arrivals.py``), or None: receive it whole and :meth:`push` it (the default)."""
        return None

    def commit(
        self, model: Model, version: ModelVersion, round_: int, workers: Sequence[str], dry_run: bool = False
    ) -> CommitOutcome:
        """Applies round ``round_`` with the staged gradients of ``workers`` (sync rules only); with
        ``dry_run`` only checks that it could (RoundError if not)."""
        raise RoundError(f"{type(self).__name__} has no rounds: every push is applied as it comes")

    @abc.abstractmethod
    def guard(self) -> AbstractContextManager[object]:
        """Held by pulls while they read and by the store while it installs a model."""

    def optimizer(self, pushed: OptimizerConfig) -> OptimizerConfig:
        """The optimizer the shard updates with, given the one the first worker pushed."""
        return pushed


class RoundAveraging(Rule):
    consistent_reads = True

    def __init__(self, sync_version_tolerance: int = 0) -> None:
        self.sync_version_tolerance = sync_version_tolerance
        self._lock = threading.Lock()  # updates and reads
        self._staged: dict[str, Gradient] = {}  # at most one per worker: its newest
        self._sums: dict[str, Accumulator[Any]] = {}
        self._prepared: _Prepared | None = None  # the round the last dry run computed
        self._arrivals: Arrivals | None = None  # sum on arrival (None: no model, or a version tolerance)

    def reset(self, model: Model) -> None:
        self._drop_prepared()
        self._staged = {}
        self._sums = model.accumulators()
        dense = self._sums[DENSE]
        old = self._arrivals
        if old is not None:
            with old.lock:
                old.reset()  # streams still arriving into the old model's sum count nowhere
        # With a version tolerance a push may be counted in a later round than its shard version's:
        # only whole staged gradients can wait for it.
        if isinstance(dense, DenseSum) and self.sync_version_tolerance == 0:
            self._arrivals = Arrivals(dense, pause=old.pause if old is not None else Pause())
        else:
            self._arrivals = None

    def _drop_prepared(self) -> None:
        prepared, self._prepared = self._prepared, None
        if prepared is not None:
            self._finish(prepared, commit=False)

    def _finish(self, prepared: _Prepared, *, commit: bool) -> None:
        """Commits or discards a prepared update, then clears the sums: an update proven finite
        by bounds is applied in place at the commit, from the averaged sums, which must be kept
        until then. Discarded, the gradients it summed into are dropped: they hold the sum now,
        and a round that names their workers again is refused (RoundError: the round is aborted
        on every shard and its members train again)."""
        try:
            if commit:
                Model.commit(prepared.staged)
            else:
                Model.discard(prepared.staged)
                self._drop_spent(prepared.spent)
        finally:
            self._clear_sums()

    def _clear_sums(self) -> None:
        """Empties the round's sums, forgetting the pushes summed as they arrived (under the lock)."""
        arrivals = self._arrivals
        if arrivals is not None:
            with arrivals.lock:
                arrivals.reset()
        for summed in self._sums.values():
            summed.clear()

    def _drop_spent(self, spent: list[Gradient]) -> None:
        for gradient in spent:
            if self._staged.get(gradient.worker) is gradient:
                del self._staged[gradient.worker]

    def guard(self) -> AbstractContextManager[object]:
        return self._lock

    @property
    def staged(self) -> int:
        return len(self._staged)

    def push(self, model: Model, version: ModelVersion, gradient: Gradient) -> PushOutcome:
        with self._lock:
            behind = version.value - gradient.computed_on
            if not 0 <= behind <= self.sync_version_tolerance:
                return PushOutcome(False, version.value, max(0, behind), 0.0)
            arrivals = self._arrivals
            if arrivals is not None:
                with arrivals.lock:
                    if gradient.worker in arrivals.members or gradient.worker in arrivals.arriving:
                        arrivals.spoil(f"worker {gradient.worker!r} pushed again after its gradient was summed")
            self._staged[gradient.worker] = gradient  # a worker's newer gradient replaces its older one
            return PushOutcome(True, version.value, behind, gradient.base_lr)

    def open_stream(self, version: ModelVersion, head: PushHead) -> Stream | None:
        with self._lock:
            arrivals = self._arrivals
            if (
                arrivals is None
                or self._prepared is not None  # a dry run holds the round: it must not change
                or head.computed_on != version.value
                or not arrivals.pause.allows(version.value)
            ):
                return None
            with arrivals.lock:
                summed = arrivals.members.get(head.worker)
                if summed is not None and head.minibatch and summed == head.minibatch:
                    return Stream(arrivals, head, False, lambda stream: self._arrived(version, stream))
                if summed is not None or head.worker in arrivals.arriving:
                    arrivals.spoil(f"worker {head.worker!r} pushed again after its gradient was summed")
                    return None
                stream = Stream(arrivals, head, True, lambda stream: self._arrived(version, stream))
                arrivals.arriving[head.worker] = stream
                return stream

    def _arrived(self, version: ModelVersion, stream: Stream) -> PushOutcome:
        """Every piece of ``stream`` arrived: the push is staged as summed, or refused as stale
        when the sum was reset meanwhile (a round committed or aborted without it)."""
        head = stream.head
        with self._lock:
            with stream.arrivals.lock:
                counted = stream.settle()
            if not counted:
                return PushOutcome(False, version.value, max(0, version.value - head.computed_on), 0.0)
            if stream.adding:
                self._staged[head.worker] = Gradient({}, head.computed_on, head.base_lr, head.worker, head.minibatch,
                                                     summed=True)  # fmt: skip
            return PushOutcome(True, version.value, 0, head.base_lr)

    def commit(
        self, model: Model, version: ModelVersion, round_: int, workers: Sequence[str], dry_run: bool = False
    ) -> CommitOutcome:
        with self._lock:
            if round_ < version.value:
                return CommitOutcome(version.value, ())  # applied before: a retried commit changes nothing
            if round_ > version.value:
                raise RoundError(f"round {round_} is ahead of this shard's version {version.value}")
            if not workers:
                raise RoundError(f"round {round_} names no gradient")
            prepared, self._prepared = self._prepared, None
            # Computed again otherwise, from the newest gradients: one the old computation summed
            # into is gone, and a round that names it is refused (RoundError: aborted on every
            # shard before any applied it, and its members train again).
            if prepared is not None and not prepared.applies(round_, workers, self._staged, dry_run):
                self._finish(prepared, commit=False)
                prepared = None
            if prepared is None:
                self._check_arrivals(round_, workers)
                prepared = self._prepare(model, round_, self._members(round_, workers))
            if dry_run:
                self._prepared = prepared  # the commit that follows copies it in
                return CommitOutcome(version.value, ())
            self._finish(prepared, commit=True)
            for worker in workers:
                self._staged.pop(worker, None)  # with a newer gradient pushed since the dry run
            self._forget_older_than(round_ + 1)
            version.advance()  # under the lock: a checkpoint it starts copies this version
            summed = sum(g.summed for g in prepared.members)
            return CommitOutcome(version.value, tuple(g.minibatch for g in prepared.members), summed)

    def _check_arrivals(self, round_: int, workers: Sequence[str]) -> None:
        """RoundError, the sum emptied and the summed pushes dropped (their workers push again),
        when the pushes summed as they arrived are not a part of round ``round_`` of ``workers``."""
        arrivals = self._arrivals
        if arrivals is None:
            return
        with arrivals.lock:
            reason = arrivals.mismatch(set(workers))
            if not reason:
                return
            if not arrivals.spoiled:
                arrivals.pause.mismatched(round_)
            self._drop_spent([g for g in self._staged.values() if g.summed])
        self._clear_sums()
        raise RoundError(f"round {round_}: {reason}; aborted on every shard, its members train again")

    def _prepare(self, model: Model, round_: int, members: list[Gradient]) -> _Prepared:
        """The round's update: the members' gradients averaged per table, computed aside and
        checked (RoundError when any new value would be NaN or infinite). The sums stay as they
        are until the prepared update is finished (:meth:`_finish`), cleared at once on error.
        The first member's gradient, when it is the PS's own, holds the sum (``DenseSum``)."""
        spent: list[Gradient] = []
        try:
            for k, gradient in enumerate(members):
                took = [self._sums[name].add(part, take=k == 0 and gradient.received)
                        for name, part in gradient.update.items()]  # fmt: skip
                if any(took) or gradient.summed:
                    spent.append(gradient)
            averaged = {name: summed.averaged(len(members)) for name, summed in self._sums.items()}
            return _Prepared(round_, members, model.stage(averaged, self._learning_rate(members)), spent)
        except BaseException as err:
            self._drop_spent(spent + [g for g in members if g.summed])
            self._clear_sums()
            if isinstance(err, GradientError):
                raise RoundError(f"round {round_}: {err}") from err
            raise

    def _learning_rate(self, members: list[Gradient]) -> float:
        return members[0].base_lr

    def _members(self, round_: int, workers: Sequence[str]) -> list[Gradient]:
        if len(set(workers)) != len(workers):
            raise RoundError(f"round {round_} names a worker twice: {sorted(workers)}")
        missing = [w for w in workers if w not in self._staged]
        if missing:
            raise RoundError(f"round {round_}: no staged gradient of {missing} on this shard")
        members = [self._staged[w] for w in workers]
        too_old = [g.worker for g in members if not 0 <= round_ - g.computed_on <= self.sync_version_tolerance]
        if too_old:
            raise RoundError(f"round {round_}: the staged gradients of {too_old} are of other versions")
        return members

    def _forget_older_than(self, version: int) -> None:
        """Drops staged gradients no later round can count (a dead or refused worker's)."""
        for worker, gradient in list(self._staged.items()):
            if version - gradient.computed_on > self.sync_version_tolerance:
                del self._staged[worker]


# LocalSGD's update on the PS: the averaged delta applied as it is (w - 1 * mean(w_pulled - w_trained)).
AVERAGING = OptimizerConfig("sgd", {"learning_rate": 1.0, "momentum": 0.0, "nesterov": 0.0})


class ModelAveraging(RoundAveraging):
    def optimizer(self, pushed: OptimizerConfig) -> OptimizerConfig:
        return AVERAGING

    def _learning_rate(self, members: list[Gradient]) -> float:
        return AVERAGING.params["learning_rate"]


class AsyncApply(Rule):
    consistent_reads = False

    def __init__(
        self, use_locking: bool = False, learning_rate: LearningRate = as_given, compensation: Compensation = uncompensated
    ) -> None:
        self.use_locking = use_locking
        self.learning_rate = learning_rate
        self.compensation = compensation

    def guard(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def reset(self, model: Model) -> None:
        if self.compensation is not uncompensated and not model.optimizer.CORRECTS_MOMENTUM:
            log.info(
                "staleness compensation: %s has no heavy-ball momentum to correct; every push is applied as configured",
                model.optimizer.config.name,
            )

    def push(self, model: Model, version: ModelVersion, gradient: Gradient) -> PushOutcome:
        stale = staleness(version.value, gradient.computed_on)
        lr = self.learning_rate(gradient.base_lr, stale)
        model.apply(gradient.update, lr, locking=self.use_locking, implicit_momentum=self.compensation(stale))
        return PushOutcome(True, version.advance(), stale, lr)


def _sync(settings: StoreSettings) -> Rule:
    return RoundAveraging(settings.sync_version_tolerance)


def _local_sgd(settings: StoreSettings) -> Rule:
    return ModelAveraging(settings.sync_version_tolerance)


def _async(settings: StoreSettings) -> Rule:
    learning_rate: LearningRate = StalenessAware(as_given) if settings.mode.staleness_lr else as_given
    return AsyncApply(settings.mode.use_locking, learning_rate, COMPENSATIONS[settings.mode.compensation]())


# The one place a mode becomes a rule on the PS.
RULES: Mapping[UpdateRule, Callable[[StoreSettings], Rule]] = MappingProxyType(
    {UpdateRule.SYNC: _sync, UpdateRule.ASYNC: _async, UpdateRule.LOCAL_SGD: _local_sgd}
)


def make_rule(settings: StoreSettings) -> Rule:
    factory = RULES.get(settings.mode.rule)
    if factory is None:
        raise ValueError(f"the PS has no update rule for mode {settings.mode.rule.value!r}")
    return factory(settings)
