"""Shard watching and recovery (sync): every shard and the ledger at one version, again and again.

At start-up (PS 0 may have restarted) and whenever a shard restarts (its boot number changes),
``recovery.py`` (pure) picks the version to go on from; here it is carried out: every shard rolls
back to it under a new incarnation and the ledger is restored from the journal saved at it, or,
without a checkpoint, the rounds go on from the shards' version and the status says what was lost.
A shard that a worker repaired at its own version after it lost its model is followed too.
"""

from __future__ import annotations

import logging
import threading

import grpc

from elasticps.coordinator.journal import Journals
from elasticps.coordinator.ledger import Ledger
from elasticps.coordinator.recovery import Rollback, Stuck, decide, needs_recovery, restorable, rollback_message
from elasticps.coordinator.shards import ShardRefused, ShardView
from elasticps.coordinator.syncing import SyncRounds

log = logging.getLogger(__name__)

_RECOVERY_ERRORS = (ShardRefused, grpc.RpcError, OSError, ValueError, KeyError)
# Recoveries in a row that a shard answered and refused (a checkpoint it listed but cannot load)
# before the job is given up: each one looked at the shards afresh.
MAX_REFUSED_RECOVERIES = 3


class ShardWatch:
    def __init__(self, sync: SyncRounds, ledger: Ledger, journals: Journals | None) -> None:
        self._sync = sync
        self._ledger = ledger
        self._journals = journals
        self._boots: list[int | None] = [None] * len(sync.shards)
        self.rollbacks = 0
        self.last_rollback = ""  # what the latest rollback undid, in words ("": none yet)
        self.unrecoverable = ""  # why the shards cannot be brought to one version ("": they can)
        self._refused = 0  # recoveries refused by a shard, in a row

    def first_recovery(self, deadline_s: float, stopped: threading.Event) -> None:
        """Brings the shards and the ledger to one version, trying again every second until it
        could (or ``stopped``); the shards have ``deadline_s`` to answer each time."""
        while not stopped.is_set() and not self.unrecoverable:
            try:
                views = self._sync.shards.describe_all(deadline_s)
                with self._sync.lock:
                    self._recover_locked(views)
                return
            except _RECOVERY_ERRORS as err:
                log.error("cannot bring the shards to one version yet: %s", err)
                self._refusal(err)
                stopped.wait(1.0)

    def watch(self) -> None:
        """Rolls every shard back when one restarted (its boot number changed), and follows shards
        that a worker repaired at its version after they lost their model."""
        sync = self._sync
        if self.unrecoverable:
            return  # the job is failing
        with sync.lock:
            views = sync.shards.describe()
            if any(v is None for v in views):
                return  # a shard is down: it is looked at again once it answers
            known = [v for v in views if v is not None]
            if needs_recovery(self._boots, known):
                restarted = [i for i, (b, v) in enumerate(zip(self._boots, known)) if b is not None and b != v.boot]
                log.warning("PS shards %s restarted", restarted)
                try:
                    self._recover_locked(known)
                except _RECOVERY_ERRORS as err:
                    log.error("recovery after the restart of PS shards %s failed: %s", restarted, err)
                    self._refusal(err)
                return
            journals = self._journals.versions() if self._journals is not None else []
            sync.restorable = restorable(known, journals)  # kept by every shard and the journal
            held = {v.version for v in known if v.initialized}
            if len(held) == 1 and all(v.initialized for v in known) and sync.rounds.closing is None:
                (version,) = held
                if version != sync.rounds.version:  # outside a commit only a repair moves a shard
                    sync.shard_problem = (
                        f"the PS shards lost their model (restarted without a checkpoint); a worker's copy "
                        f"of version {version} replaced it, without the optimizer's state"
                    )
                    log.warning("%s", sync.shard_problem)
                    sync.reset(version)
                    sync.changes.notify()

    def _recover_locked(self, views: list[ShardView]) -> None:
        """Brings every shard and the ledger to one version (see ``recovery.py``). Under the
        rounds' lock."""
        sync = self._sync
        journals = self._journals.versions() if self._journals is not None else []
        if self.unrecoverable:
            return  # the job is failing: nothing more to try
        decision = decide(views, journals)
        if isinstance(decision, Stuck):
            self._give_up(decision.reason)
            return
        newest = max((v.version for v in views if v.initialized), default=0)
        records_before = self._records_done()
        if isinstance(decision, Rollback):
            assert self._journals is not None
            state = self._journals.read(decision.version)
            incarnation = max([int(state.get("incarnation", 0)), sync.incarnation, *(v.incarnation for v in views)]) + 1
            views = sync.shards.roll_back(decision.version, incarnation)
            self._journals.discard_after(decision.version)
            self._ledger.roll_back(state)
            sync.incarnation = incarnation
            sync.reset(decision.version)
            sync.shard_problem = ""  # one version everywhere again
            log.warning(
                "every shard and the task ledger rolled back to version %d (incarnation %d)",
                decision.version, incarnation,
            )  # fmt: skip
            self.rollbacks += 1
            self._rolled_back(rollback_message(newest, decision.version, records_before - self._records_done()))
        else:
            sync.reset(decision.version)
            if decision.lost:
                sync.shard_problem = (
                    f"PS shards {list(decision.lost)} restarted without a checkpoint and lost their model "
                    f"(optimizer state included); the workers' copy of version {decision.version} replaces it"
                )
                log.warning("%s", sync.shard_problem)
            said = []
            if decision.lost:
                said.append(f"PS shards {list(decision.lost)} restarted without a checkpoint: their part of the "
                            f"model is the workers' copy of version {decision.version}, without the optimizer's state")
            if records_before == 0 and decision.version > 0 and not journals:
                # PS 0 came back without a ledger while the model lived on (other shards, the workers).
                said.append(self._rebuild_ledger(decision.version))
            if said:
                self._rolled_back("; ".join(said) + " (spec.training.checkpointSteps keeps both)")
        self._boots = [v.boot for v in views]
        self._refused = 0
        sync.changes.notify()

    def _rebuild_ledger(self, version: int) -> str:
        """The ledger, lost with PS 0, rebuilt from a shard's copy (``ps/applied.py``) at the
        model's ``version``; what the status says of it."""
        found = self._sync.shards.ledger_copy(version)
        if found is not None:
            shard, copy = found
            try:
                records = self._ledger.rebuild((t.epoch, t.first, t.reached, t.task_id) for t in copy.tasks)
            except ValueError as err:
                log.error("PS %d's copy of the task ledger does not fit this job: %s", shard, err)
            else:
                return (f"the coordinator (PS 0) restarted without a checkpoint of its task ledger: rebuilt from "
                        f"PS {shard}'s copy at model version {version}, {records} records applied")  # fmt: skip
        return (f"the coordinator (PS 0) restarted without a checkpoint of its task ledger: every record "
                f"is trained again from model version {version}")  # fmt: skip

    def _refusal(self, err: Exception) -> None:
        """A recovery failed; one a shard refused (it could not load what it listed) counts towards
        :data:`MAX_REFUSED_RECOVERIES`, a shard that does not answer yet does not."""
        if not isinstance(err, ShardRefused):
            return
        self._refused += 1
        if self._refused >= MAX_REFUSED_RECOVERIES:
            self._give_up(f"recovery failed {self._refused} times in a row: {err}")

    def _give_up(self, reason: str) -> None:
        """The shards cannot go on together: no round is committed from now on, and the status
        says why (the planner fails the job with it)."""
        if not self.unrecoverable:
            log.error("the shards cannot be brought to one version; the job fails: %s", reason)
        self.unrecoverable = reason
        self._sync.shard_problem = reason
        self._sync.changes.notify()

    def _records_done(self) -> int:
        with self._ledger.lock:
            return self._ledger.queue.progress().records_done

    def _rolled_back(self, message: str) -> None:
        """What was undone, for the status (the planner makes it an event and a condition)."""
        self.last_rollback = message
        log.warning("%s", message)
