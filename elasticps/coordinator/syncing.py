"""Sync rounds as the coordinator drives them: joins admitted, rounds committed on every shard.

``rounds.py`` decides (pure); this module acts on its decisions. A join looks at the rounds
(:meth:`SyncRounds.join_step`): it first commits a round that is due, then asks to join with the
worker's gradient, or, once joined, whether its round counted it. A round that reaches its quorum
is committed on every shard (``shards.py``) by the thread that closed it, under the rounds' lock,
so rounds are applied one at a time and in order; every commit, abort and reset notifies
:attr:`SyncRounds.changes`, which wakes the waiting joins (``rpc/waking.py``). At every
``checkpoint_steps``-th version the ledger is saved beside the shards' checkpoints
(``journal.py``): what a rollback (``watching.py``) goes back to.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import grpc

from elasticps.coordinator.journal import Journals
from elasticps.coordinator.ledger import Ledger
from elasticps.coordinator.rounds import Admission, Period, Rounds
from elasticps.coordinator.shards import RoundAborted, ShardRefused, Shards, TaskAdvance
from elasticps.rpc.waking import Changes

log = logging.getLogger(__name__)


class Outcome(Enum):
    COMMITTED = "committed"  # the worker's gradient is in a committed round
    REFUSED = "refused"  # not taken: the worker pulls and trains that minibatch again
    PENDING = "pending"  # its round is still open: the worker asks again
    VOID = "void"  # not taken: its task is no longer the worker's; the worker leaves the task


@dataclass(frozen=True)
class Join:
    """A worker asks to count the gradient it staged on every shard, computed on ``version``."""

    worker: str
    version: int
    period: Period | None = None  # LocalSGD: the period the gradient ends
    task_id: int = 0  # the training task it belongs to (0: not said)
    task_records: int = 0  # the task's records (from its start) it brings into the model, its own included


@dataclass(frozen=True)
class JoinAnswer:
    outcome: Outcome
    version: int  # the rounds' version
    local_steps: int = 0  # committed, LocalSGD: the workers' next period


@dataclass(frozen=True)
class _Joined:
    version: int  # the gradient was computed on
    round: int  # the round it joined
    task_id: int
    task_records: int


class CommitFailed(Exception):
    """A shard did not commit a closed round (it refused, or could not be reached)."""


class SyncRounds:
    def __init__(
        self, rounds: Rounds, shards: Shards, ledger: Ledger, journals: Journals | None, checkpoint_steps: int
    ) -> None:
        self.rounds = rounds
        self.shards = shards
        self._ledger = ledger
        self._journals = journals
        self._checkpoint_steps = checkpoint_steps
        self.lock = threading.Condition()  # guards rounds and joined (a lock: joins wait on changes)
        self.changes = Changes()  # notified per commit, abort, recovery and tick: waiting joins look again
        self.joined: dict[str, _Joined] = {}  # worker -> its gradient in the open or a past round
        self.shard_problem = ""  # what the status says about shards that lost their model
        self.incarnation = 0  # bumped by every rollback; saved with the ledger
        # The newest version every shard and the ledger can restore (0: none; ``watching.py`` finds
        # it): every commit tells the shards to keep it, and the journal keeps its ledger.
        self.restorable = 0

    def join_step(self, join: Join) -> tuple[JoinAnswer | None, int]:
        """One look at the rounds for a join: commits a round that is due, admits the worker's
        gradient; its answer, or None while its round is open, and the rounds' version.
        :class:`CommitFailed` when a due round could not be committed."""
        rounds, worker, version = self.rounds, join.worker, join.version
        with self.lock:
            while True:
                try:
                    self.advance_locked()
                except (ShardRefused, grpc.RpcError) as err:
                    log.warning("round %d could not be committed: %s", rounds.version, err)
                    raise CommitFailed(str(err)) from err
                joined = self.joined.get(worker)
                if joined is None or joined.version != version:  # a new gradient: ask to join
                    with self._ledger.lock:
                        self._ledger.queue.heartbeat(worker)
                        live = len(self._ledger.queue.live_workers())
                        void = join.task_id > 0 and not self._ledger.queue.holds(worker, join.task_id)
                    if void:
                        return JoinAnswer(Outcome.VOID, rounds.version), rounds.version
                    admission = rounds.join(worker, version, live, join.period)
                    if admission is Admission.REFUSED:
                        return JoinAnswer(Outcome.REFUSED, rounds.version), rounds.version
                    if admission is Admission.ADMITTED:
                        self.joined[worker] = _Joined(version, rounds.version, join.task_id, join.task_records)
                        continue  # the join may complete the quorum
                else:
                    counted = rounds.counted(worker, joined.round)
                    if counted is True:
                        committed = JoinAnswer(Outcome.COMMITTED, rounds.version, rounds.period_after(joined.round))
                        return committed, rounds.version
                    if counted is False or not rounds.is_member(worker):  # taken out: its task went back
                        del self.joined[worker]  # its next gradient, even of this version, may join
                        with self._ledger.lock:
                            void = joined.task_id > 0 and not self._ledger.queue.holds(worker, joined.task_id)
                        return JoinAnswer(Outcome.VOID if void else Outcome.REFUSED, rounds.version), rounds.version
                return None, rounds.version

    def advance(self) -> None:
        """Closes and commits the open round if it is due (from any thread, logging failures)."""
        with self.lock:
            try:
                self.advance_locked()
            except (ShardRefused, grpc.RpcError) as err:
                log.warning("round %d could not be committed: %s", self.rounds.version, err)

    def advance_locked(self) -> None:
        rounds = self.rounds
        with self._ledger.lock:
            for worker in self._ledger.queue.take_requeued_workers():
                rounds.drop(worker)
            can_train = self._ledger.queue.can_train()
        closed = rounds.closing or rounds.due(can_train)
        if closed is None:
            return
        try:
            advances = self._advances(closed.round, closed.members)
            versions = self.shards.commit(closed.round, closed.members, advances, self.restorable)
        except RoundAborted as err:
            # Checked before anything was applied: the round is dropped, its members train again.
            log.warning("round %d aborted: %s", closed.round, err)
            rounds.abort(closed)
            with self._ledger.lock:
                self._ledger.queue.round_settled(committed=False)
            self.changes.notify()
            return
        rounds.committed(closed)
        with self._ledger.lock:  # before the ledger is saved at this version: what its model holds
            self._ledger.queue.round_settled(committed=True)
        if any(v != rounds.version for v in versions):
            self.shard_problem = f"after round {closed.round} the shards are at versions {versions}"
            log.error("%s", self.shard_problem)
        self._save_ledger(rounds.version)
        self.changes.notify()

    def _advances(self, round_: int, members: Sequence[str]) -> list[TaskAdvance]:
        """How far the round brings each of its members' training tasks: what every shard's copy
        of the ledger keeps (``ps/applied.py``)."""
        advances = []
        with self._ledger.lock:
            for worker in members:
                joined = self.joined.get(worker)
                if joined is None or joined.round != round_ or joined.task_id <= 0:
                    continue
                at = self._ledger.queue.advance(worker, joined.task_id, joined.task_records)
                if at is not None:
                    advances.append(TaskAdvance(*at, task_id=joined.task_id))
        return advances

    def reset(self, version: int) -> None:
        """The rounds go on from ``version`` (after a recovery or a repair); joins start over.
        Under :attr:`lock`."""
        closing = self.rounds.closing
        if closing is not None:  # a round left half committed: the shards' version says whether it made it
            with self._ledger.lock:
                self._ledger.queue.round_settled(committed=version > closing.round)
        self.rounds.reset(version)
        self.joined.clear()

    @property
    def local_steps(self) -> int:
        """LocalSGD: the workers' current period (0 in other modes). Read without the rounds'
        lock, which a commit holds through its calls to every shard: one int, for display."""
        periods = self.rounds.periods
        return 0 if periods is None else periods.current

    def save_final(self) -> None:
        """PS 0 stops: the ledger at the rounds' version too, due or not, beside the shards' last
        checkpoints (``Checkpointing.final``), so that a job stopped as a whole resumes there. Not
        while a round is half committed: the shards may then disagree, and a recovery decides."""
        with self.lock:
            version = self.rounds.version
            if self.rounds.closing is not None or version <= 0 or not self._checkpoint_steps or not version % self._checkpoint_steps:
                return
            if self._journals is None:
                return
            state = {**self._ledger.state(), "incarnation": self.incarnation}
            try:
                self._journals.write(version, state, protect=self.restorable)
                log.info("ledger saved at version %d as PS 0 stops", version)
            except OSError as err:
                log.error("cannot save the ledger at version %d: %s", version, err)

    def _save_ledger(self, version: int) -> None:
        """At a version the shards checkpoint, the ledger too: what a rollback to it goes back to."""
        steps = self._checkpoint_steps
        if self._journals is None or steps <= 0 or version % steps:
            return
        state = {**self._ledger.state(), "incarnation": self.incarnation}
        try:
            self._journals.write(version, state, protect=self.restorable)
        except OSError as err:
            log.error("cannot save the ledger at version %d: %s", version, err)
