"""The coordinator's engine (hosted by PS 0, or alone for a decentralized job): every decision and
every piece of state, behind plain methods that the gRPC face (``servicer.py``) and PS 0's bulk
channel (``bulk.py``) translate to and from the wire.

Many calls run at once (the gRPC server's work pool, the bulk channel's connection threads); the
task queue sits behind one lock (``ledger.py``). The model version comes from PS 0's store through
``version_fn``, so evaluations follow the model's progress. With a ``journal`` path (async jobs)
the ledger is written there (atomically) after every report and read back at start-up, so a
restarted PS 0 goes on where it was instead of training every record again.

Sync jobs (``rounds`` given): joins are admitted into rounds and rounds committed on every shard
(``syncing.py``); a ticker thread (``ticker.py``) first brings the shards and the ledger to one
version (``watching.py``), then re-checks the open round twice a second and watches for restarted
shards. Nothing is handed out until that first recovery is done (:attr:`Coordinator.ready`).
Lock order: the rounds' lock, then the queue's.

Export (``output`` given, ``spec.output``): once training and the final evaluation are done, the
queue waits for every shard to hold one version (asked here, of the shards, only then) and hands
one worker the final export of exactly that version; the status says where the newest export went
(``api/output.py`` lays the folder out), or, once the output refused an export every attempt
(``QueueSettings.export_attempts``), why the job cannot succeed (``export_error``, which the planner
turns into Failed, reason ExportFailed) and where the PS checkpoints to export it from later are.
Prediction (``spec.prediction``): after the final export the shards are asked once more for their
one version, which every prediction task carries; the status counts the records predicted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elasticps.api.output import export_failure, export_path, predictions_path
from elasticps.coordinator.curves import StalenessCounts, TrainingCurves
from elasticps.coordinator.health import FirstLoss
from elasticps.coordinator.iterations import Iterations
from elasticps.coordinator.journal import Journals
from elasticps.coordinator.ledger import Ledger
from elasticps.coordinator.rounds import Rounds
from elasticps.coordinator.shards import Shards, ShardView
from elasticps.coordinator.syncing import Join, JoinAnswer, Outcome, SyncRounds
from elasticps.coordinator.tasks.base import Finished, Progress, QueueSettings, Task, Wait
from elasticps.coordinator.ticker import TICK_S, start_ticker
from elasticps.coordinator.watching import ShardWatch
from elasticps.files import write_atomically
from elasticps.rpc.waking import Changes

log = logging.getLogger(__name__)

ASYNC_SETTLE_S = 3.0  # async: shard versions unmoved this long after training make the final model
MAX_JOIN_WAIT_MS = 10_000  # the longest a join waits before it answers PENDING


@dataclass(frozen=True)
class Report:
    """A worker's result for one task (see :meth:`TaskQueue.report` for each field)."""

    worker: str
    task_id: int
    success: bool
    loss_sum: float = 0.0
    metric_sums: Mapping[str, float] = field(default_factory=dict)
    rejected: int = 0
    model_version: int = 0
    export_failed: bool = False
    error: str = ""
    records: int = 0
    nonfinite_steps: int = 0
    first_loss: FirstLoss | None = None


@dataclass(frozen=True)
class JobView:
    """What the job's status shows, at one moment."""

    progress: Progress
    num_epochs: int
    model_version: int
    shard_versions: list[int]  # -1: the shard did not answer
    shard_bytes_received: list[int]
    shard_bytes_sent: list[int]
    shard_rows: list[tuple[int, int, int]]  # per shard: embedding rows held, made, evicted ((-1,)*3: no answer)
    local_steps: int
    staleness: StalenessCounts
    live_workers: int
    grads_to_wait: int
    shard_problem: str
    export_path: str
    predictions_path: str
    export_error: str
    min_iteration: int
    max_iteration: int
    rollbacks: int = 0
    last_rollback: str = ""
    checkpoint_failure: str = ""  # the shards' failing checkpoint writes, "PS i: why; ..." ("": none)
    unrecoverable: str = ""  # why the shards cannot be brought to one version ("": they can)


class Coordinator:
    def __init__(
        self,
        settings: QueueSettings,
        version_fn: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        journal: Path | None = None,
        rounds: Rounds | None = None,
        shards: Shards | None = None,
        journals: Journals | None = None,
        checkpoint_steps: int = 0,
        checkpoint_dir: str = "",
        recovery_deadline_s: float = 300.0,
        output: str = "",
        curves: TrainingCurves | None = None,
        staleness: Callable[[], StalenessCounts] | None = None,
        iterations: Iterations | None = None,
    ) -> None:
        if rounds is not None and shards is None:
            raise ValueError("sync rounds need the shards to commit them on")
        self._clock = clock
        self._unsettled: tuple[tuple[int, ...], float] | None = None  # async: shard versions apart, since
        self._curves = curves
        self._staleness = staleness  # PS 0's cumulative staleness counts, for the job status
        self._iterations = iterations  # decentralized: the workers' iterations, from their heartbeats
        self._ledger = Ledger(settings, clock)
        self._version_fn = version_fn
        self._settings = settings
        self._output = output
        self._journal = journal
        self._shards = shards
        self._checkpoint_steps = checkpoint_steps
        self._checkpoint_dir = checkpoint_dir
        self._recovery_deadline_s = recovery_deadline_s
        self._stopped = threading.Event()
        # Sync: the ledger is saved at checkpointed versions and rolled back with the shards.
        self.sync: SyncRounds | None = None
        self._watch: ShardWatch | None = None
        if rounds is not None:
            assert shards is not None
            self.sync = SyncRounds(rounds, shards, self._ledger, journals, checkpoint_steps)
            self._watch = ShardWatch(self.sync, self._ledger, journals)
        self._changes = self.sync.changes if self.sync is not None else Changes()
        # Sync: nothing is handed out until the shards were asked what they hold (PS 0 may have restarted).
        self._ready = threading.Event()
        if rounds is None:
            self._ready.set()
        if journal is not None and rounds is None and journal.exists():
            try:
                self._ledger.queue.restore(json.loads(journal.read_text()))
                log.info("coordinator resumes from %s", journal)
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("ignoring coordinator journal %s: %s", journal, err)

    # ---- what the faces ask first --------------------------------------------------------------
    @property
    def synchronous(self) -> bool:
        """Whether the job trains in sync rounds (only then does it take joins)."""
        return self.sync is not None

    @property
    def ready(self) -> bool:
        """Whether tasks, reports and joins are taken (sync: after the first recovery)."""
        return self._ready.is_set()

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    @property
    def rollbacks(self) -> int:
        """How many times every shard and the ledger were rolled back (sync)."""
        return self._watch.rollbacks if self._watch is not None else 0

    @property
    def last_rollback(self) -> str:
        """What the latest rollback undid, in words ("": none since this coordinator started)."""
        return self._watch.last_rollback if self._watch is not None else ""

    @property
    def shard_problem(self) -> str:
        return self.sync.shard_problem if self.sync is not None else ""

    # ---- tasks -----------------------------------------------------------------------------------
    def get_task(self, worker: str) -> Task | Wait | Finished:
        ledger = self._ledger
        with ledger.lock:
            awaiting_settled = ledger.queue.awaiting_settled
        settled = self._settled_version() if awaiting_settled else None
        with ledger.lock:
            return ledger.queue.get(worker, self._version_fn(), settled)

    def report(self, report: Report) -> None:
        """Records a task's result; :class:`ReportError` (nothing changed) when it contradicts its task."""
        ledger = self._ledger
        with ledger.lock:
            before = ledger.queue.progress()
            ledger.queue.report(
                report.worker,
                report.task_id,
                report.success,
                loss_sum=report.loss_sum,
                metric_sums=dict(report.metric_sums),
                rejected=report.rejected,
                model_version=report.model_version,
                export_failed=report.export_failed,
                error=report.error,
                records=report.records,
                nonfinite_steps=report.nonfinite_steps,
                first_loss=report.first_loss,
            )
            self._write_journal()
            after = ledger.queue.progress()
        if self._iterations is not None and report.model_version > 0:
            self._iterations.heard(report.worker, report.model_version)  # decentralized: its iteration
        if report.export_failed:
            log.warning("%s could not write export task %d: %s", report.worker, report.task_id, report.error)
        if after.export_failure is not None and before.export_failure is None:
            log.error("the job fails: %s", self._export_error(after))
        self._draw(before, after)

    def heartbeat(self, worker: str, iteration: int = 0) -> None:
        with self._ledger.lock:
            self._ledger.queue.heartbeat(worker)
        if self._iterations is not None:
            self._iterations.heard(worker, iteration)

    def leave(self, worker: str) -> None:
        """``worker`` exits: its task goes back, and a round that waited for it may close now."""
        with self._ledger.lock:
            self._ledger.queue.leave(worker)
        log.info("worker %s left", worker)
        if self.sync is not None:
            self.sync.advance()

    def _draw(self, before: Progress, after: Progress) -> None:
        """Logs a completed evaluation and adds what a report changed to the training curves (one
        point per evaluation)."""
        if after.evaluations > before.evaluations:
            shown = ", ".join(f"{name} {value:.4f}" for name, value in sorted(after.metrics.items()))
            log.info("evaluation of model version %d: %s", after.metrics_version, shown)
        if self._curves is None:
            return
        try:
            if after.training_reports > before.training_reports:  # sync records count as rounds apply them
                self._curves.trained(
                    self._version_fn(), after.loss, after.records_done, after.epoch, self._local_steps()
                )
            if after.evaluations > before.evaluations:
                self._curves.evaluated(after.metrics_version, after.metrics)
        except OSError as err:  # a full disk loses curve points, never the job
            log.warning("could not write the training curves: %s", err)

    def _write_journal(self) -> None:
        """Under the queue's lock."""
        if self._journal is None or self.sync is not None:  # sync: saved per checkpointed version
            return
        try:
            write_atomically(self._journal, json.dumps(self._ledger.queue.state()))
        except OSError as err:
            log.error("cannot write the coordinator journal %s: %s", self._journal, err)

    # ---- sync joins ------------------------------------------------------------------------------
    def join(self, join: Join, wait_ms: int) -> JoinAnswer:
        """Counts the worker's staged gradient into a round, waiting in this thread (at most
        ``wait_ms``, capped at :data:`MAX_JOIN_WAIT_MS`) until its round is committed or it is
        refused; PENDING when the wait ran out. The thread that commits a round wakes it directly.
        Only for a :attr:`synchronous`, :attr:`ready` coordinator; :class:`CommitFailed` when a
        due round could not be committed."""
        sync = self.sync
        assert sync is not None
        give_up_at = time.monotonic() + min(wait_ms, MAX_JOIN_WAIT_MS) / 1000
        while True:
            seen = self._changes.generation
            answer, version = sync.join_step(join)
            if answer is not None:
                return answer
            remaining = give_up_at - time.monotonic()
            if remaining <= 0 or self._stopped.is_set():
                return JoinAnswer(Outcome.PENDING, version)
            self._changes.block(seen, min(remaining, TICK_S))

    async def join_async(self, join: Join, wait_ms: int) -> JoinAnswer:
        """:meth:`join` waiting on the event loop, holding no thread; each look at the rounds runs
        in a worker thread (``asyncio.to_thread``)."""
        sync = self.sync
        assert sync is not None
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + min(max(wait_ms, 0), MAX_JOIN_WAIT_MS) / 1000
        while True:
            seen = self._changes.generation
            answer, version = await asyncio.to_thread(sync.join_step, join)
            if answer is not None:
                return answer
            remaining = give_up_at - loop.time()
            if remaining <= 0 or self._stopped.is_set():
                return JoinAnswer(Outcome.PENDING, version)
            await self._changes.wait_for(
                lambda: self._changes.generation != seen or self._stopped.is_set(), min(remaining, TICK_S)
            )

    # ---- the ticker ------------------------------------------------------------------------------
    def start(self) -> None:
        """Starts the ticker (sync): it first brings the shards and the ledger to one version, then
        closes rounds whose missing members died or ran out of work and watches for restarted shards."""
        if self.sync is None:
            return
        start_ticker(self.first_recovery, self.tick, self._stopped)

    def first_recovery(self) -> None:
        """Brings the shards and the ledger to one version, then takes calls (:attr:`ready`)."""
        assert self._watch is not None and self.sync is not None
        self._watch.first_recovery(self._recovery_deadline_s, self._stopped)
        if self._watch.unrecoverable:
            return  # no task is handed out: the status says why, and the job fails with it
        self._ready.set()
        log.info("coordinator ready at version %d", self.sync.rounds.version)

    def tick(self) -> None:
        assert self._watch is not None and self.sync is not None
        self._watch.watch()
        with self._ledger.lock:
            self._ledger.queue.requeue_silent()
        self.sync.advance()
        self._changes.notify()  # joins re-check members whose task went back

    def stop(self) -> None:
        self._stopped.set()
        if self.sync is not None:
            self.sync.save_final()
        if self._curves is not None:
            self._curves.close()
        self._changes.notify()  # waiting joins answer PENDING now

    # ---- the job's status ------------------------------------------------------------------------
    def status(self) -> JobView:
        views = self._shard_views()
        shard_versions = [-1 if v is None else v.version for v in views] if views else [self._version_fn()]
        with self._ledger.lock:
            self._ledger.queue.requeue_silent()
            progress = self._ledger.queue.progress()
            live = len(self._ledger.queue.live_workers())
        lowest, highest = self._iterations.span() if self._iterations is not None else (-1, -1)
        grads_to_wait = 0
        if self.sync is not None:
            with self.sync.lock:
                grads_to_wait = self.sync.rounds.effective_grads_to_wait(live)
        output = self._output
        return JobView(
            progress=progress,
            num_epochs=self._settings.num_epochs,
            model_version=self._version_fn(),
            shard_versions=shard_versions,
            shard_bytes_received=[-1 if v is None else v.bytes_received for v in views],
            shard_bytes_sent=[-1 if v is None else v.bytes_sent for v in views],
            shard_rows=[(-1, -1, -1) if v is None else (v.embedding_rows, v.embedding_rows_made, v.embedding_rows_evicted)
                        for v in views],  # fmt: skip
            local_steps=self._local_steps(),
            staleness=self._staleness() if self._staleness is not None else (),
            live_workers=live,
            grads_to_wait=grads_to_wait,
            shard_problem=self.shard_problem,
            export_path=export_path(output, progress.export_version, progress.export_final)
            if output and progress.export_version >= 0
            else "",
            predictions_path=predictions_path(output) if output and progress.prediction_records else "",
            export_error=self._export_error(progress),
            min_iteration=lowest,
            max_iteration=highest,
            rollbacks=self.rollbacks,
            last_rollback=self.last_rollback,
            checkpoint_failure="; ".join(
                f"PS {i}: {v.checkpoint_failure}" for i, v in enumerate(views) if v is not None and v.checkpoint_failure
            ),
            unrecoverable=self._watch.unrecoverable if self._watch is not None else "",
        )

    def _local_steps(self) -> int:
        return self.sync.local_steps if self.sync is not None else 0

    def _export_error(self, progress: Progress) -> str:
        failure = progress.export_failure
        if failure is None:
            return ""
        return export_failure(
            self._output, failure.version, failure.final, failure.attempts, failure.error,
            self._checkpoint_dir, self._checkpoint_steps,
        )  # fmt: skip

    def _shard_views(self) -> list[ShardView | None]:
        """Every shard's state (None: no answer); without shards (tests), none."""
        return [] if self._shards is None else list(self._shards.describe())

    def _settled_version(self) -> int | None:
        """The version of the model a final export or the predictions take, asked once training is
        done; None while there is none yet (shards that disagree, hold no model or do not answer).

        Sync: the version every shard holds, of one incarnation (a round being committed shard
        after shard is waited for). Async: a shard's version counts its own pushes, so the shards
        of a finished job can stay apart for good (a worker killed between its pushes to two
        shards); once their versions have not moved for :data:`ASYNC_SETTLE_S`, nothing more will
        change the model, and it is named by the oldest shard's version."""
        if self._shards is None:
            return self._version_fn()
        views = self._shards.describe()
        known = [v for v in views if v is not None and v.initialized]
        if len(known) != len(views) or len({v.incarnation for v in known}) != 1:
            return None
        versions = tuple(v.version for v in known)
        if len(set(versions)) == 1:
            return versions[0]
        if self.sync is not None:
            return None
        with self._ledger.lock:
            now = self._clock()
            if self._unsettled is None or self._unsettled[0] != versions:
                self._unsettled = (versions, now)
                return None
            return min(versions) if now - self._unsettled[1] >= ASYNC_SETTLE_S else None
