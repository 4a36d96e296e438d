"""The Coordinator gRPC service (hosted by PS 0): a translator over :class:`TaskQueue` and :class:`Rounds`.

Served by the PS process's asyncio server (``rpc/serving.py``): the unary calls run in its work
pool, many at once, and one lock serialises them over the pure queue; ``JoinRound`` waits on the
event loop, holding no thread, and looks at the rounds from the pool. The model version
comes from PS 0's store through ``version_fn``, so evaluations follow the model's progress. With a
``journal`` path the queue's ledger is written there (atomically) after every report and read back
at start-up, so a restarted PS 0 goes on where it was instead of training every record again.

Sync jobs (``rounds`` given): ``JoinRound`` admits staged gradients into rounds, and a round that
reaches its quorum is committed on every shard (``shards.py``) by the thread that closed it, under
the rounds' lock, so rounds are applied one at a time and in order; every commit wakes the waiting
joins (``rpc/waking.py``). A worker's join may also come over PS 0's bulk channel, behind its push
there (``join_waiting``, from ``ps/bulk.py``): the same answer, waited for in that connection's
thread. A ticker re-checks the open round twice a second, so a round whose missing members died or
ran out of work still closes. Waiting joins are bounded (over gRPC by ``--max_long_polls``,
RESOURCE_EXHAUSTED past it; over the bulk channel by its connections, ``--max_push_streams``). Lock order: the rounds' lock, then the queue's.

Export (``output`` given, ``spec.output``): once training and the final evaluation are done, the
queue waits for every shard to hold one version (asked here, of the shards, only then) and hands
one worker the final export of exactly that version; ``GetJobStatus`` says where the newest export
went (``api/output.py`` lays the folder out), or, once the output refused an export every attempt
(``QueueSettings.export_attempts``), why the job cannot succeed (``export_error``, which the planner
turns into Failed, reason ExportFailed) and where the PS checkpoints to export it from later are.

Prediction (``spec.prediction``): after the final export the shards are asked once more for their
one version, which every prediction task carries; ``GetJobStatus`` counts the records predicted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from pathlib import Path

import grpc
from grpc import aio

from elasticps.api.output import export_failure, export_path, predictions_path
from elasticps.coordinator.curves import StalenessCounts, TrainingCurves
from elasticps.coordinator.iterations import Iterations
from elasticps.coordinator.journal import Journals
from elasticps.coordinator.recovery import Rollback, decide, needs_recovery
from elasticps.coordinator.rounds import Admission, Period, Rounds
from elasticps.coordinator.shards import RoundAborted, Shards, ShardRefused, ShardView
from elasticps.coordinator import requests
from elasticps.coordinator.tasks import (
    Finished, Progress, QueueSettings, ReportError, Task, TaskKind, TaskQueue, Wait,
)  # fmt: skip
from elasticps.files import write_atomically
from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc
from elasticps.rpc import edges
from elasticps.rpc.limits import ServerLimits, Slots
from elasticps.rpc.receiving import Refused
from elasticps.rpc.serving import AsyncServer
from elasticps.rpc.waking import Changes

log = logging.getLogger(__name__)

R = TypeVar("R")
Context = aio.ServicerContext[Any, Any]

_KINDS = {
    TaskKind.TRAINING: pb.TASK_TYPE_TRAINING,
    TaskKind.EVALUATION: pb.TASK_TYPE_EVALUATION,
    TaskKind.EXPORT: pb.TASK_TYPE_EXPORT,
    TaskKind.PREDICTION: pb.TASK_TYPE_PREDICTION,
}

ASYNC_SETTLE_S = 3.0  # async: shard versions unmoved this long after training make the final model
MAX_JOIN_WAIT_MS = 10_000  # the longest a join waits before it answers PENDING
NOT_READY = "the coordinator is still asking the PS shards what they hold"
TICK_S = 0.5


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
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
        limits: ServerLimits = ServerLimits(),
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
        self._lock = threading.Lock()
        self._queue = TaskQueue(settings, clock)
        self._version_fn = version_fn
        self._settings = settings
        self._output = output
        self._journal = journal
        self._rounds = rounds
        self._shards = shards
        self._rounds_changed = threading.Condition()  # guards _rounds and _joined (a lock: joins wait on _changes)
        self._changes = Changes()  # notified per commit, abort, recovery and tick: waiting joins look again
        self._polls = Slots("waiting joins", limits.max_long_polls, "--max_long_polls")
        self._joined: dict[str, tuple[int, int]] = {}  # worker -> (version computed on, round joined)
        self._shard_problem = ""
        self._stopped = threading.Event()
        # Sync: the ledger is saved at checkpointed versions and rolled back with the shards.
        self._journals = journals if rounds is not None else None
        self._checkpoint_steps = checkpoint_steps
        self._checkpoint_dir = checkpoint_dir
        self._recovery_deadline_s = recovery_deadline_s
        self._boots: list[int | None] = [None] * (len(shards) if shards is not None else 0)
        self._incarnation = 0
        self.rollbacks = 0
        # Sync: nothing is handed out until the shards were asked what they hold (PS 0 may have restarted).
        self._ready = threading.Event()
        if rounds is None:
            self._ready.set()
        if journal is not None and rounds is None and journal.exists():
            try:
                self._queue.restore(json.loads(journal.read_text()))
                log.info("coordinator resumes from %s", journal)
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("ignoring coordinator journal %s: %s", journal, err)

    def _require_ready(self, context: grpc.ServicerContext) -> None:
        if not self._ready.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, NOT_READY)

    def GetTask(self, request: pb.GetTaskRequest, context: grpc.ServicerContext) -> pb.Task:
        _checked(requests.check_get_task, request, context)
        self._require_ready(context)
        with self._lock:
            awaiting_settled = self._queue.awaiting_settled
        settled = self._settled_version() if awaiting_settled else None
        with self._lock:
            got = self._queue.get(request.worker, self._version_fn(), settled)
        if isinstance(got, Task):
            return pb.Task(
                id=got.id,
                type=_KINDS[got.kind],
                start=got.start,
                end=got.end,
                epoch=got.epoch,
                model_version=got.model_version,
                final=got.final,
            )
        if got is Finished.FINISHED:
            return pb.Task(type=pb.TASK_TYPE_FINISHED)
        assert got is Wait.WAIT
        return pb.Task(type=pb.TASK_TYPE_WAIT)

    def ReportTask(self, request: pb.TaskResult, context: grpc.ServicerContext) -> pb.Ack:
        _checked(requests.check_report, request, context)
        self._require_ready(context)
        with self._lock:
            before = self._queue.progress()
            try:
                self._queue.report(
                    request.worker,
                    request.task_id,
                    request.success,
                    loss_sum=request.loss_sum,
                    metric_sums=dict(request.metric_sums),
                    rejected=request.rejected,
                    model_version=request.model_version,
                    export_failed=request.export_failed,
                    error=requests.error_text(request.error),
                    records=request.records,
                )
            except ReportError as err:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ReportTask: {err}")
            self._write_journal()
            after = self._queue.progress()
        if self._iterations is not None and request.model_version > 0:
            self._iterations.heard(request.worker, request.model_version)  # decentralized: its iteration
        if request.export_failed:
            log.warning("%s could not write export task %d: %s", request.worker, request.task_id, request.error)
        if after.export_failure is not None and before.export_failure is None:
            log.error("the job fails: %s", self._export_error(after))
        self._draw(before, after)
        return pb.Ack()

    def _draw(self, before: Progress, after: Progress) -> None:
        """Logs a completed evaluation and adds what a report changed to the training curves (one
        point per evaluation)."""
        if after.evaluations > before.evaluations:
            shown = ", ".join(f"{name} {value:.4f}" for name, value in sorted(after.metrics.items()))
            log.info("evaluation of model version %d: %s", after.metrics_version, shown)
        if self._curves is None:
            return
        try:
            if after.records_done > before.records_done:
                self._curves.trained(
                    self._version_fn(), after.loss, after.records_done, after.epoch, self._local_steps()
                )
            if after.evaluations > before.evaluations:
                self._curves.evaluated(after.metrics_version, after.metrics)
        except OSError as err:  # a full disk loses curve points, never the job
            log.warning("could not write the training curves: %s", err)

    def _write_journal(self) -> None:
        if self._journal is None or self._rounds is not None:  # sync: saved per checkpointed version
            return
        try:
            write_atomically(self._journal, json.dumps(self._queue.state()))
        except OSError as err:
            log.error("cannot write the coordinator journal %s: %s", self._journal, err)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.Ack:
        _checked(requests.check_heartbeat, request, context)
        with self._lock:
            if request.leaving:
                self._queue.leave(request.worker)
                log.info("worker %s left", request.worker)
            else:
                self._queue.heartbeat(request.worker)
        if self._iterations is not None and not request.leaving:
            self._iterations.heard(request.worker, request.iteration)
        if request.leaving:
            self._advance_rounds()
        return pb.Ack()

    # ---- sync rounds ---------------------------------------------------------------------------
    @property
    def waiting_joins(self) -> int:
        """Joins waiting for their round now (metrics; tests)."""
        return self._polls.in_use

    async def JoinRound(self, request: pb.JoinRequest, context: Context) -> pb.JoinReply:
        """Admits the worker's staged gradient into the open round and waits (on the event loop,
        holding no thread) until that round is committed, the gradient is refused, or ``wait_ms``
        passes (PENDING: the worker asks again). Each look at the rounds runs in the work pool."""
        refusal = self._join_refusal(request)
        if refusal is not None:
            await context.abort(refusal.code, refusal.message)
        if request.wait_ms <= 0:
            return await self._join(request, context, 0.0)
        async with self._polls.taking(context, "JoinRound"):
            return await self._join(request, context, min(request.wait_ms, MAX_JOIN_WAIT_MS) / 1000)

    async def _join(self, request: pb.JoinRequest, context: Context, wait_s: float) -> pb.JoinReply:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + wait_s
        while True:
            seen = self._changes.generation
            try:
                reply, version = await asyncio.to_thread(self._join_step, request)
            except (ShardRefused, grpc.RpcError) as err:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"JoinRound: a shard did not commit: {err}")
            if reply is not None:
                return reply
            remaining = give_up_at - loop.time()
            if remaining <= 0 or self._stopped.is_set():
                return pb.JoinReply(outcome=pb.JOIN_OUTCOME_PENDING, version=version)
            await self._changes.wait_for(
                lambda: self._changes.generation != seen or self._stopped.is_set(), min(remaining, TICK_S)
            )

    def join_waiting(self, request: pb.JoinRequest) -> pb.JoinReply:
        """``JoinRound`` for PS 0's bulk channel (``ps/bulk.py``), where the worker writes it behind its
        push: the same answer, waited for in the caller's thread, so the thread that commits a round
        wakes it directly. Refusals raise :class:`Refused` with the status gRPC would answer."""
        refusal = self._join_refusal(request)
        if refusal is not None:
            raise refusal
        give_up_at = time.monotonic() + min(request.wait_ms, MAX_JOIN_WAIT_MS) / 1000
        while True:
            seen = self._changes.generation
            try:
                reply, version = self._join_step(request)
            except (ShardRefused, grpc.RpcError) as err:
                raise Refused(grpc.StatusCode.UNAVAILABLE, f"JoinRound: a shard did not commit: {err}") from None
            if reply is not None:
                return reply
            remaining = give_up_at - time.monotonic()
            if remaining <= 0 or self._stopped.is_set():
                return pb.JoinReply(outcome=pb.JOIN_OUTCOME_PENDING, version=version)
            self._changes.block(seen, min(remaining, TICK_S))

    def _join_refusal(self, request: pb.JoinRequest) -> Refused | None:
        """Why a join is refused before it looks at the rounds; None when it is not."""
        if self._rounds is None:
            return Refused(grpc.StatusCode.FAILED_PRECONDITION, "JoinRound: this job trains asynchronously")
        problem = _problem(requests.check_join, request)
        if problem:
            return Refused(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if not self._ready.is_set():
            return Refused(grpc.StatusCode.UNAVAILABLE, NOT_READY)
        return None

    def _join_step(self, request: pb.JoinRequest) -> tuple[pb.JoinReply | None, int]:
        """One look at the rounds for a join (in the work pool): commits a round that is due, admits
        the worker's gradient; its answer, or None while its round is open, and the rounds' version."""
        rounds = self._rounds
        assert rounds is not None
        worker, version = request.worker, request.version
        period = Period(request.local_steps, request.loss, request.learning_rate) if request.local_steps > 0 else None
        with self._rounds_changed:
            while True:
                try:
                    self._advance_rounds_locked()
                except (ShardRefused, grpc.RpcError) as err:
                    log.warning("round %d could not be committed: %s", rounds.version, err)
                    raise
                joined = self._joined.get(worker)
                if joined is None or joined[0] != version:  # a new gradient: ask to join
                    with self._lock:
                        self._queue.heartbeat(worker)
                        live = len(self._queue.live_workers())
                    admission = rounds.join(worker, version, live, period)
                    if admission is Admission.REFUSED:
                        return pb.JoinReply(outcome=pb.JOIN_OUTCOME_REFUSED, version=rounds.version), rounds.version
                    if admission is Admission.ADMITTED:
                        self._joined[worker] = (version, rounds.version)
                        continue  # the join may complete the quorum
                else:
                    counted = rounds.counted(worker, joined[1])
                    if counted is True:
                        committed = pb.JoinReply(
                            outcome=pb.JOIN_OUTCOME_COMMITTED,
                            version=rounds.version,
                            local_steps=rounds.period_after(joined[1]),
                        )
                        return committed, rounds.version
                    if counted is False or not rounds.is_member(worker):  # taken out: its task went back
                        del self._joined[worker]  # its next gradient, even of this version, may join
                        return pb.JoinReply(outcome=pb.JOIN_OUTCOME_REFUSED, version=rounds.version), rounds.version
                return None, rounds.version

    def _advance_rounds(self) -> None:
        """Closes and commits the open round if it is due (from any thread, logging failures)."""
        if self._rounds is None:
            return
        with self._rounds_changed:
            try:
                self._advance_rounds_locked()
            except (ShardRefused, grpc.RpcError) as err:
                log.warning("round %d could not be committed: %s", self._rounds.version, err)

    def _advance_rounds_locked(self) -> None:
        rounds, shards = self._rounds, self._shards
        assert rounds is not None and shards is not None
        with self._lock:
            for worker in self._queue.take_requeued_workers():
                rounds.drop(worker)
            can_train = self._queue.can_train()
        closed = rounds.closing or rounds.due(can_train)
        if closed is None:
            return
        try:
            versions = shards.commit(closed.round, closed.members)
        except RoundAborted as err:
            # Checked before anything was applied: the round is dropped, its members train again.
            log.warning("round %d aborted: %s", closed.round, err)
            rounds.abort(closed)
            self._changes.notify()
            return
        rounds.committed(closed)
        if any(v != rounds.version for v in versions):
            self._shard_problem = f"after round {closed.round} the shards are at versions {versions}"
            log.error("%s", self._shard_problem)
        self._save_ledger(rounds.version)
        self._changes.notify()

    def _save_ledger(self, version: int) -> None:
        """At a version the shards checkpoint, the ledger too: what a rollback to it goes back to."""
        steps = self._checkpoint_steps
        if self._journals is None or steps <= 0 or version % steps:
            return
        with self._lock:
            state = {**self._queue.state(), "incarnation": self._incarnation}
        try:
            self._journals.write(version, state)
        except OSError as err:
            log.error("cannot save the ledger at version %d: %s", version, err)

    # ---- recovery (sync) -----------------------------------------------------------------------
    def _recover_locked(self, views: list[ShardView]) -> None:
        """Brings every shard and the ledger to one version (see ``recovery.py``)."""
        rounds, shards = self._rounds, self._shards
        assert rounds is not None and shards is not None
        journals = self._journals.versions() if self._journals is not None else []
        decision = decide(views, journals)
        if isinstance(decision, Rollback):
            assert self._journals is not None
            state = self._journals.read(decision.version)
            incarnation = max([int(state.get("incarnation", 0)), self._incarnation, *(v.incarnation for v in views)]) + 1
            views = shards.roll_back(decision.version, incarnation)
            self._journals.discard_after(decision.version)
            with self._lock:
                queue = TaskQueue(self._settings, self._clock)
                queue.restore(state)
                queue.take_over_workers(self._queue)
                self._queue = queue
            self._incarnation = incarnation
            rounds.reset(decision.version)
            self._joined.clear()
            self._shard_problem = ""  # one version everywhere again
            self.rollbacks += 1
            log.warning(
                "every shard and the task ledger rolled back to version %d (incarnation %d)",
                decision.version, incarnation,
            )
        else:
            rounds.reset(decision.version)
            self._joined.clear()
            if decision.lost:
                self._shard_problem = (
                    f"PS shards {list(decision.lost)} restarted without a checkpoint and lost their model "
                    f"(optimizer state included); the workers' copy of version {decision.version} replaces it"
                )
                log.warning("%s", self._shard_problem)
        self._boots = [v.boot for v in views]
        self._changes.notify()

    def _watch_shards(self) -> None:
        """Rolls every shard back when one restarted (its boot number changed), and follows shards
        that a worker repaired at its version after they lost their model."""
        shards, rounds = self._shards, self._rounds
        assert shards is not None and rounds is not None
        with self._rounds_changed:
            views = shards.describe()
            if any(v is None for v in views):
                return  # a shard is down: it is looked at again once it answers
            known = [v for v in views if v is not None]
            if needs_recovery(self._boots, known):
                restarted = [i for i, (b, v) in enumerate(zip(self._boots, known)) if b is not None and b != v.boot]
                log.warning("PS shards %s restarted", restarted)
                try:
                    self._recover_locked(known)
                except (ShardRefused, grpc.RpcError, OSError, ValueError, KeyError) as err:
                    log.error("recovery after the restart of PS shards %s failed: %s", restarted, err)
                return
            held = {v.version for v in known if v.initialized}
            if len(held) == 1 and all(v.initialized for v in known) and rounds.closing is None:
                (version,) = held
                if version != rounds.version:  # outside a commit only a repair moves a shard
                    self._shard_problem = (
                        f"the PS shards lost their model (restarted without a checkpoint); a worker's copy "
                        f"of version {version} replaced it, without the optimizer's state"
                    )
                    log.warning("%s", self._shard_problem)
                    rounds.reset(version)
                    self._joined.clear()
                    self._changes.notify()

    def start(self) -> None:
        """Starts the ticker: it first brings the shards and the ledger to one version, then closes
        rounds whose missing members died or ran out of work and watches for restarted shards."""
        if self._rounds is None:
            return
        threading.Thread(target=self._tick, name="rounds", daemon=True).start()

    def _first_recovery(self) -> None:
        shards = self._shards
        assert shards is not None
        while not self._stopped.is_set():
            try:
                views = shards.describe_all(self._recovery_deadline_s)
                with self._rounds_changed:
                    self._recover_locked(views)
                break
            except (ShardRefused, grpc.RpcError, OSError, ValueError, KeyError) as err:
                log.error("cannot bring the shards to one version yet: %s", err)
                self._stopped.wait(1.0)
        self._ready.set()
        log.info("coordinator ready at version %d", self._rounds.version if self._rounds else 0)

    def stop(self) -> None:
        self._stopped.set()
        if self._curves is not None:
            self._curves.close()
        self._changes.notify()  # waiting joins answer PENDING now

    def _tick(self) -> None:
        self._first_recovery()
        while not self._stopped.wait(TICK_S):
            self._watch_shards()
            with self._lock:
                self._queue.requeue_silent()
            self._advance_rounds()
            self._changes.notify()  # joins re-check members whose task went back

    def _local_steps(self) -> int:
        """LocalSGD: the workers' current period (0 in other modes). Read without the rounds'
        lock, which a commit holds through its calls to every shard: one int, for display."""
        rounds = self._rounds
        if rounds is None or rounds.periods is None:
            return 0
        return rounds.periods.current

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
        if self._rounds is not None:
            return None
        with self._lock:
            now = self._clock()
            if self._unsettled is None or self._unsettled[0] != versions:
                self._unsettled = (versions, now)
                return None
            return min(versions) if now - self._unsettled[1] >= ASYNC_SETTLE_S else None

    def GetJobStatus(self, request: pb.JobStatusRequest, context: grpc.ServicerContext) -> pb.JobStatus:
        views = self._shard_views()
        shard_versions = [-1 if v is None else v.version for v in views] if views else [self._version_fn()]
        with self._lock:
            self._queue.requeue_silent()
            progress = self._queue.progress()
            live_workers = self._queue.live_workers()
        live = len(live_workers)
        lowest, highest = self._iterations.span() if self._iterations is not None else (-1, -1)
        grads_to_wait = 0
        if self._rounds is not None:
            with self._rounds_changed:
                grads_to_wait = self._rounds.effective_grads_to_wait(live)
        staleness = self._staleness() if self._staleness is not None else ()
        return pb.JobStatus(
            finished=progress.finished,
            epoch=progress.epoch,
            num_epochs=self._settings.num_epochs,
            records_done=progress.records_done,
            records_total=progress.records_total,
            model_version=self._version_fn(),
            loss=progress.loss,
            metrics=dict(progress.metrics),
            metrics_version=progress.metrics_version,
            tasks_requeued=progress.tasks_requeued,
            gradients_rejected=progress.gradients_rejected,
            epoch_records=list(progress.epoch_records),
            shard_versions=shard_versions,
            shard_bytes_received=[-1 if v is None else v.bytes_received for v in views],
            shard_bytes_sent=[-1 if v is None else v.bytes_sent for v in views],
            local_steps=self._local_steps(),
            staleness_bounds=[bound for bound, _ in staleness],
            staleness_pushes=[int(count) for _, count in staleness],
            live_workers=live,
            grads_to_wait=grads_to_wait,
            shard_problem=self._shard_problem,
            export_path=export_path(self._output, progress.export_version, progress.export_final)
            if self._output and progress.export_version >= 0
            else "",
            export_version=progress.export_version,
            export_final=progress.export_final,
            records_predicted=progress.records_predicted,
            prediction_records=progress.prediction_records,
            predictions_path=predictions_path(self._output) if self._output and progress.prediction_records else "",
            export_error=self._export_error(progress),
            min_iteration=lowest,
            max_iteration=highest,
        )

    def _export_error(self, progress: Progress) -> str:
        failure = progress.export_failure
        if failure is None:
            return ""
        return export_failure(
            self._output, failure.version, failure.final, failure.attempts, failure.error,
            self._checkpoint_dir, self._checkpoint_steps,
        )  # fmt: skip


def _checked(check: Callable[[R], None], request: R, context: grpc.ServicerContext) -> None:
    problem = _problem(check, request)
    if problem:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)


def _problem(check: Callable[[R], None], request: R) -> str:
    """What ``check`` finds wrong with ``request`` ("" when nothing)."""
    try:
        check(request)
    except requests.RequestError as err:
        return str(err)
    return ""


def add_to_server(servicer: CoordinatorServicer, server: AsyncServer) -> None:
    """Registers the service, every method unary: a request that does not parse is answered
    INVALID_ARGUMENT and logged as one rate-limited line (``rpc/edges.py``). ``JoinRound`` is a
    coroutine; the other methods are plain functions, which the server runs in its work pool."""
    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    handlers = {}
    for method in service.methods:
        request_type = getattr(pb, method.input_type.name)
        reply_type = getattr(pb, method.output_type.name)
        handlers[method.name] = edges.unary_unary(
            getattr(servicer, method.name), method.name, request_type.FromString, reply_type.SerializeToString
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
