"""The ParameterServer gRPC service: a translator between frame streams and the parameter store.

Served by the PS process's asyncio server (``rpc/serving.py``), many calls at once. What waits
runs on the event loop and holds no thread: a long-polling pull awaits the store's next version
(announced through ``ParameterStore.on_version_change``), a push stream is received frame by
frame (``rpc/receiving.py``: its head checked against the model by ``intake.py`` before its
payload is buffered, a peer that stops sending cut off DEADLINE_EXCEEDED). What computes (the
store's updates, encoding a pull, the unary calls) runs in the server's work pool. Push calls in
flight and waiting pulls are bounded (``rpc/limits.py``): past a bound a call is answered
RESOURCE_EXHAUSTED at once, and the clients retry it.

Store exceptions become status codes: a malformed stream, a bad tensor or head field, a stream
larger than the model allows, or a push whose update would make the model NaN or infinite is
INVALID_ARGUMENT; an empty shard, or a PushModel of another model than the one the shard holds,
FAILED_PRECONDITION. A request message that does not parse is INVALID_ARGUMENT too, logged as one
rate-limited line (``rpc/edges.py``).

Tensor streams reach this servicer as serialized ``Frame`` bytes (``add_to_server`` registers the
service's methods, by their names in the .proto, with an identity deserializer): ``frames.decode``
(``Assembly``) parses them with one copy instead of protobuf's three (docs/benchmarks.md). The wire format is the
.proto's; a stub generated from it talks to this server unchanged.

When the store's rule keeps a version fixed while it is read (``consistent_reads``: sync), every
worker pulls the same version, so the encoded frames of the latest version are kept and served to
every puller (encoded once per version, not once per pull), held by the pulls sending them and only
weakly by the servicer (woken by one commit, a version's pulls come together; the frames are not
kept through the next round's pushes); otherwise (async) each pull encodes the
live arrays as it streams them, a few MiB at a time. The servicer itself has no notion of the training mode.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Generator
from typing import Any

import grpc
import numpy as np
from grpc import aio
from prometheus_client import CollectorRegistry

from elasticps import allocator, identity
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps import intake
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.optimizers import finite
from elasticps.api.optimizer import OptimizerConfig, OptimizerError
from elasticps.api.embedding import EmbeddingError
from elasticps.ps.checkpoint import CheckpointError
from elasticps.rpc.embedding_wire import ids_of, spec_of
from elasticps.ps.applied import LedgerCopy, TaskProgress
from elasticps.ps.store import GradientError, ModelMismatch, ParameterStore, RoundError, UninitializedError
from elasticps.ps.tables import RowStats
from elasticps.ps.versions import version_problem
from elasticps.rpc import edges, frames, guard, receiving
from elasticps.rpc.limits import ServerLimits, Slots
from elasticps.rpc.serving import AsyncServer
from elasticps.rpc.waking import Changes

MAX_WAIT_MS = 10_000  # the longest a long poll waits before it answers "still current"
LIVE_BATCH_BYTES = 4 << 20  # async pulls: frames encoded per trip to the work pool
# Sync pulls: every version's shared frames (the shard's bytes in 1 MiB pieces) are encoded by this
# one thread. Measured (docs/large-model.md): a shard of 89 MiB peaked at 1.01-1.13 GiB resident
# when any thread of the work pool encoded them, 0.80-0.83 GiB with this thread. The likely reason:
# glibc gives busy threads arenas of their own and keeps what is freed in each, so pieces freed in
# several arenas stayed resident in each (the PS's heap held 350-415 MiB free at its peak).
_ENCODER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="encoder")

Context = aio.ServicerContext[Any, Any]


class _Encoded:
    """A sync version's frames, encoded once for every puller of it."""

    def __init__(self, key: tuple[int, int], encoded: list[bytes]) -> None:
        self.key = key  # (incarnation, version)
        self.frames = encoded


class ParameterServerServicer:
    def __init__(
        self,
        store: ParameterStore,
        chunk_bytes: int = frames.CHUNK_BYTES,
        metrics: PSMetrics | None = None,
        limits: ServerLimits = ServerLimits(),
    ) -> None:
        self._store = store
        self._chunk_bytes = chunk_bytes
        self._metrics = metrics or PSMetrics(CollectorRegistry(), store.settings.shard)
        self._limits = limits
        self._streams = Slots("push calls", limits.max_push_streams, "--max_push_streams")
        self._polls = Slots("waiting pulls", limits.max_long_polls, "--max_long_polls")
        self._installing = asyncio.Lock()  # PushModel streams, one at a time
        self._versions = Changes()
        store.on_version_change(self._versions.notify)
        self._cache_lock = threading.Lock()
        self._cached: weakref.ref[_Encoded] | None = None  # alive while a pull sends it
        self.bulk_port = 0  # the shard's bulk channel (ps/bulk.py), told to clients by DescribeShard; 0: none

    def in_flight(self) -> tuple[int, int]:
        """Push calls in flight and pulls waiting for a newer version, now (metrics; tests)."""
        return self._streams.in_use, self._polls.in_use

    async def PushModel(self, request_iterator: AsyncIterable[bytes], context: Context) -> pb.ModelHead:
        async with self._streams.taking(context, "PushModel"), self._installing:
            # One model stream received at a time: every worker pushes the model when it starts, and
            # once one is installed the others' values are not needed, only their heads' shapes.
            held: list[frames.Head] = []

            def drain(head: frames.Head) -> receiving.Piece | None:
                layout = self._store.layout
                if layout is None or layout.empty:
                    return None
                held.append(head)
                return _finite_piece

            decoded = await receiving.receive(
                request_iterator, context, "PushModel", self._limits, self._admit_model, drain
            )
            head = decoded.first.model
            try:
                tables = [spec_of(table) for table in head.tables]
                spec = decoded.first.model.optimizer
                config = OptimizerConfig(name=spec.name, params=dict(spec.params))
                if held:
                    specs = held[0].tensors
                    self._store.holds({t.name: t for t in specs if not t.state and not t.table},
                                      {t.name: t for t in specs if t.state}, config, head.version, tables)  # fmt: skip
                    return pb.ModelHead(initialized=True, version=self._store.version)
                installed = await asyncio.to_thread(
                    self._store.initialize, decoded.tensors, config, head.version, head.incarnation, decoded.state,
                    tables, max(1, head.shards), True,
                )
                del decoded
                if installed:  # the stream's frames went through the heap once: give their pages back
                    await asyncio.to_thread(allocator.give_back_free_memory)
            except (GradientError, OptimizerError, EmbeddingError) as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            except ModelMismatch as err:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return pb.ModelHead(initialized=True, version=self._store.version)

    def _admit_model(self, head: frames.Head) -> None:
        intake.admit_model(head, self._store.layout, self._store.settings.shard, self._limits.max_model_bytes)

    async def PullDense(self, request: pb.PullRequest, context: Context) -> AsyncIterator[bytes]:
        store = self._store
        if not store.initialized:
            self._metrics.pulled("uninitialized")
            yield pb.Frame(model=pb.ModelHead(initialized=False, version=0)).SerializeToString()
            return
        held = (request.incarnation, request.version)
        if held == (store.incarnation, store.version) and request.wait_ms > 0:
            async with self._polls.taking(context, "PullDense"):
                await self._versions.wait_for(
                    lambda: (store.incarnation, store.version) != held, min(request.wait_ms, MAX_WAIT_MS) / 1000
                )
        if held == (store.incarnation, store.version):
            self._metrics.pulled("current")
            head = pb.ModelHead(initialized=True, version=request.version, incarnation=request.incarnation)
            yield pb.Frame(model=head).SerializeToString()
            return
        self._metrics.pulled("full")
        # The store says whether a version is fixed while it is read (then encode it once for every
        # puller) or live (then encode it for this pull, while reading).
        if store.consistent_reads:
            encoded = await asyncio.get_running_loop().run_in_executor(_ENCODER, self._shared_frames)
            for message in encoded.frames:
                self._metrics.bytes_sent.inc(len(message))
                yield message
        else:
            async for message in self._live_frames():
                self._metrics.bytes_sent.inc(len(message))
                yield message

    async def _live_frames(self) -> AsyncIterator[bytes]:
        """The live arrays, encoded in the work pool a batch at a time while the stream goes out."""
        live = _Batches(self._live_messages())
        try:
            while True:
                batch, finished = await asyncio.to_thread(live.take, LIVE_BATCH_BYTES)
                for message in batch:
                    yield message
                if finished:
                    return
        finally:
            try:
                asyncio.get_running_loop().run_in_executor(None, live.close)  # in the pool: a take may still run
            except RuntimeError:  # the server is stopping and its pool is gone
                live.close()

    def _live_messages(self) -> Generator[bytes, None, None]:
        with self._store.reading_model() as found:
            head = pb.Frame(model=pb.ModelHead(initialized=True, version=found.version, incarnation=found.incarnation))
            yield from frames.encode(head, found.variables, self._chunk_bytes, found.state)

    def _shared_frames(self) -> _Encoded:
        with self._cache_lock:
            cached = None if self._cached is None else self._cached()
            if cached is not None and cached.key == (self._store.incarnation, self._store.version):
                return cached
            # The old version's frames go before the new ones are encoded: a shard of P bytes holds
            # one encoding (P), not two, while it encodes (pulls still sending them keep their own).
            self._cached = cached = None
            with self._store.reading_model() as found:
                incarnation, version = found.incarnation, found.version
                head = pb.Frame(model=pb.ModelHead(initialized=True, version=version, incarnation=incarnation))
                pieces = list(frames.encode(head, found.variables, self._chunk_bytes, found.state))
            encoded = _Encoded((incarnation, version), pieces)
            self._cached = weakref.ref(encoded)
            return encoded

    async def PushGradients(self, request_iterator: AsyncIterable[bytes], context: Context) -> pb.PushReply:
        async with self._streams.taking(context, "PushGradients"):
            decoded = await receiving.receive(
                request_iterator, context, "PushGradients", self._limits, self._admit_push
            )
            head = decoded.first.push
            self._metrics.bytes_received.inc(frames.tensor_bytes(decoded))
            started = time.perf_counter()
            try:
                outcome = await asyncio.to_thread(
                    self._store.push,
                    decoded.tensors,
                    head.version,
                    head.learning_rate,
                    head.worker,
                    head.minibatch,
                    head.incarnation,
                    state=decoded.state,
                    embeddings=decoded.embeddings,
                    received=True,
                )
            except UninitializedError as err:
                self._metrics.pushed("uninitialized")
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            except GradientError as err:
                self._metrics.pushed("invalid")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        self._metrics.push_seconds.observe(time.perf_counter() - started)
        self._metrics.answered(outcome)
        return pb.PushReply(accepted=outcome.accepted, version=outcome.version)

    def _admit_push(self, head: frames.Head) -> None:
        if (problem := identity.claim_refusal(guard.caller(), head.first.push.worker, "PushGradients: worker")) is not None:
            raise receiving.Refused(grpc.StatusCode.PERMISSION_DENIED, problem)
        try:
            intake.admit_push(head, self._store.layout, self._store.settings.shard)
        except receiving.Refused as refused:
            self._metrics.pushed("uninitialized" if refused.code is grpc.StatusCode.FAILED_PRECONDITION else "invalid")
            raise

    async def PullEmbeddings(self, request: pb.EmbeddingRequest, context: Context) -> AsyncIterator[bytes]:
        """The rows of the ids asked, per table: a head with the version they are of, then the rows
        (read and encoded in the work pool)."""
        try:
            encoded = await asyncio.to_thread(self._embedding_frames, request)
        except UninitializedError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except (GradientError, EmbeddingError) as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"PullEmbeddings: {err}")
        for message in encoded:
            self._metrics.bytes_sent.inc(len(message))
            yield message

    def _embedding_frames(self, request: pb.EmbeddingRequest) -> list[bytes]:
        incarnation, version, parts = self._store.pull_embeddings(ids_of(request), make=not request.read_only)
        head = pb.Frame(model=pb.ModelHead(initialized=True, version=version, incarnation=incarnation))
        return list(frames.encode(head, {}, self._chunk_bytes, embeddings=parts))

    def CommitRound(self, request: pb.CommitRequest, context: grpc.ServicerContext) -> pb.CommitReply:
        if len(request.applied) > len(request.workers) or any(
            min(t.epoch, t.first, t.reached, t.task_id) < 0 or t.reached < t.first for t in request.applied
        ) or request.restorable < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "CommitRound: applied names more tasks than members, "
                          "or a negative or backward one; or restorable is negative")  # fmt: skip
        try:
            outcome = self._store.commit(request.round, list(request.workers), request.dry_run, tasks_of(request),
                                         request.restorable)  # fmt: skip
        except UninitializedError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except RoundError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        self._metrics.model_version.set(outcome.version)
        return pb.CommitReply(version=outcome.version)

    def ReadLedger(self, request: pb.LedgerRequest, context: grpc.ServicerContext) -> pb.LedgerCopy:
        return ledger_message(self._store.applied.copy())

    def DescribeShard(self, request: pb.DescribeRequest, context: grpc.ServicerContext) -> pb.ShardState:
        return shard_state(self._store, self._metrics, self.bulk_port)

    def RestoreShard(self, request: pb.RestoreRequest, context: grpc.ServicerContext) -> pb.ShardState:
        problem = version_problem("version", request.version) or version_problem("incarnation", request.incarnation)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"RestoreShard: {problem}")
        try:
            self._store.roll_back(request.version, request.incarnation)
        except CheckpointError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"RestoreShard: {err}")
        self._metrics.model_version.set(self._store.version)
        return self.DescribeShard(pb.DescribeRequest(), context)


def _finite_piece(spec: frames.TensorSpec, start: int, values: np.ndarray) -> None:
    """A pushed model's piece, checked as ``ParameterStore.initialize`` checks the values."""
    if values.dtype.kind == "f" and not finite(values):
        raise receiving.Refused(grpc.StatusCode.INVALID_ARGUMENT, f"PushModel: {spec.name!r} holds NaN or infinity")


def shard_state(store: ParameterStore, metrics: PSMetrics | None, bulk_port: int = 0) -> pb.ShardState:
    """What the shard says of itself (DescribeShard; PS 0's coordinator reads its own shard so too)."""
    received, sent = (0, 0) if metrics is None else metrics.traffic()
    rows = sum(store.row_stats().values(), RowStats())
    return pb.ShardState(
        initialized=store.initialized,
        version=store.version,
        boot=store.boot,
        incarnation=store.incarnation,
        checkpoints=store.checkpoint_versions(),
        bulk_port=bulk_port,
        tensor_bytes_received=received,
        tensor_bytes_sent=sent,
        embedding_rows=rows.rows,
        embedding_bytes=rows.bytes,
        embedding_rows_made=rows.made,
        embedding_rows_evicted=rows.evicted,
        embedding_rowless_reads=rows.rowless_reads,
        embedding_dropped_gradients=rows.dropped_gradients,
        unreadable=store.unreadable_checkpoints(),
        checkpoint_failure=store.checkpoint_failure,
    )


def add_to_server(servicer: ParameterServerServicer, server: AsyncServer) -> None:
    """Registers the service; frame streams travel as bytes (parsed by ``frames``), the small
    messages through protobuf (a request that does not parse: INVALID_ARGUMENT, ``rpc/edges.py``)."""
    handlers = {
        "PushModel": grpc.stream_unary_rpc_method_handler(
            servicer.PushModel, request_deserializer=None, response_serializer=pb.ModelHead.SerializeToString
        ),
        "PullDense": edges.unary_stream(servicer.PullDense, "PullDense", pb.PullRequest.FromString, None),
        "PushGradients": grpc.stream_unary_rpc_method_handler(
            servicer.PushGradients, request_deserializer=None, response_serializer=pb.PushReply.SerializeToString
        ),
        "CommitRound": edges.unary_unary(
            servicer.CommitRound, "CommitRound", pb.CommitRequest.FromString, pb.CommitReply.SerializeToString
        ),
        "DescribeShard": edges.unary_unary(
            servicer.DescribeShard, "DescribeShard", pb.DescribeRequest.FromString, pb.ShardState.SerializeToString
        ),
        "RestoreShard": edges.unary_unary(
            servicer.RestoreShard, "RestoreShard", pb.RestoreRequest.FromString, pb.ShardState.SerializeToString
        ),
        "ReadLedger": edges.unary_unary(
            servicer.ReadLedger, "ReadLedger", pb.LedgerRequest.FromString, pb.LedgerCopy.SerializeToString
        ),
        "PullEmbeddings": edges.unary_stream(
            servicer.PullEmbeddings, "PullEmbeddings", pb.EmbeddingRequest.FromString, None
        ),
    }
    declared = set(frames.PS_SERVICE.methods_by_name)
    if declared != set(handlers):  # the .proto is the one definition: fail loudly if they drift
        raise RuntimeError(f"ParameterServer methods {sorted(declared)} != handlers {sorted(handlers)}")
    server.add_service(frames.PS_SERVICE.full_name, handlers)


class _Batches:
    """A frame generator read a batch at a time from pool threads, one at a time, and closed from
    any thread once the pull ends (after the batch being read, if one is)."""

    def __init__(self, messages: Generator[bytes, None, None]) -> None:
        self._messages = messages
        self._lock = threading.Lock()

    def take(self, max_bytes: int) -> tuple[list[bytes], bool]:
        batch: list[bytes] = []
        size = 0
        with self._lock:
            for message in self._messages:
                batch.append(message)
                size += len(message)
                if size >= max_bytes:
                    return batch, False
        return batch, True

    def close(self) -> None:
        with self._lock:
            self._messages.close()


def tasks_of(request: pb.CommitRequest) -> list[TaskProgress]:
    """The training tasks a commit brings forward (``ps/applied.py``)."""
    return [TaskProgress(t.epoch, t.first, t.reached, t.task_id) for t in request.applied]


def ledger_message(copy: LedgerCopy) -> pb.LedgerCopy:
    tasks = [pb.TaskProgress(epoch=t.epoch, first=t.first, reached=t.reached, task_id=t.task_id) for t in copy.tasks]
    return pb.LedgerCopy(version=copy.version, whole=copy.whole, tasks=tasks)
