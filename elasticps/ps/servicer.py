"""The ParameterServer gRPC service: a translator between frame streams and the parameter store.

Called by gRPC's thread pool, many calls at once. Store exceptions become status codes:
a malformed stream, a bad tensor or head field, or a push whose update would make the model NaN
or infinite is INVALID_ARGUMENT; an empty shard, or a PushModel of another model than the one the
shard holds, FAILED_PRECONDITION. A request message that does not parse is INVALID_ARGUMENT too,
logged as one rate-limited line (``rpc/edges.py``).

Tensor streams reach this servicer as serialized ``Frame`` bytes (``add_to_server`` registers the
service's methods, by their names in the .proto, with an identity deserializer): ``frames.decode``
parses them with one copy instead of protobuf's three (docs/benchmarks.md). The wire format is the
.proto's; a stub generated from it talks to this server unchanged.

When the store's rule keeps a version fixed while it is read (``consistent_reads``: sync), every
worker pulls the same version, so the encoded frames of the latest version are kept and served to
every puller (encoded once per version, not once per pull); otherwise (async) each pull encodes the
live arrays as it streams them. The servicer itself has no notion of the training mode.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import grpc
from prometheus_client import CollectorRegistry

from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.metrics import PSMetrics
from elasticps.api.optimizer import OptimizerConfig, OptimizerError
from elasticps.ps.checkpoint import CheckpointError
from elasticps.ps.store import GradientError, ModelMismatch, ParameterStore, RoundError, UninitializedError
from elasticps.rpc import edges, frames

log = logging.getLogger(__name__)

MAX_WAIT_MS = 10_000  # a long poll never holds a server thread longer than this


class ParameterServerServicer:
    def __init__(
        self, store: ParameterStore, chunk_bytes: int = frames.CHUNK_BYTES, metrics: PSMetrics | None = None
    ) -> None:
        self._store = store
        self._chunk_bytes = chunk_bytes
        self._metrics = metrics or PSMetrics(CollectorRegistry(), store.settings.shard)
        self._cache_lock = threading.Lock()
        self._cached: tuple[tuple[int, int], list[bytes]] | None = None  # (incarnation, version) -> frames

    def PushModel(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.ModelHead:
        decoded = _decode(request_iterator, context)
        if not decoded.first.HasField("model"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "PushModel: the first frame needs a model head")
        spec = decoded.first.model.optimizer
        config = OptimizerConfig(name=spec.name, params=dict(spec.params))
        try:
            head = decoded.first.model
            self._store.initialize(decoded.tensors, config, head.version, head.incarnation, decoded.state)
        except (GradientError, OptimizerError) as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except ModelMismatch as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return pb.ModelHead(initialized=True, version=self._store.version)

    def PullDense(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        store = self._store
        if not store.initialized:
            self._metrics.pulled("uninitialized")
            yield pb.Frame(model=pb.ModelHead(initialized=False, version=0)).SerializeToString()
            return
        current = request.incarnation == store.incarnation
        if current and request.version == store.version and request.wait_ms > 0:
            store.wait_newer(request.version, min(request.wait_ms, MAX_WAIT_MS) / 1000)
        if request.incarnation == store.incarnation and request.version == store.version:
            self._metrics.pulled("current")
            head = pb.ModelHead(initialized=True, version=request.version, incarnation=request.incarnation)
            yield pb.Frame(model=head).SerializeToString()
            return
        self._metrics.pulled("full")
        # The store says whether a version is fixed while it is read (then encode it once for every
        # puller) or live (then encode it for this pull, while reading).
        for message in (self._shared_frames() if store.consistent_reads else self._live_frames()):
            self._metrics.bytes_sent.inc(len(message))
            yield message

    def _live_frames(self) -> Iterator[bytes]:
        with self._store.reading_model() as found:
            head = pb.Frame(model=pb.ModelHead(initialized=True, version=found.version, incarnation=found.incarnation))
            yield from frames.encode(head, found.variables, self._chunk_bytes, found.state)

    def _shared_frames(self) -> list[bytes]:
        with self._cache_lock:
            cached = self._cached
            if cached is not None and cached[0] == (self._store.incarnation, self._store.version):
                return cached[1]
            with self._store.reading_model() as found:
                incarnation, version = found.incarnation, found.version
                head = pb.Frame(model=pb.ModelHead(initialized=True, version=version, incarnation=incarnation))
                encoded = list(frames.encode(head, found.variables, self._chunk_bytes, found.state))
            self._cached = ((incarnation, version), encoded)
            return encoded

    def PushGradients(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.PushReply:
        decoded = _decode(request_iterator, context)
        if not decoded.first.HasField("push"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "PushGradients: the first frame needs a push head")
        head = decoded.first.push
        received = sum(t.nbytes for t in decoded.tensors.values()) + sum(t.nbytes for t in decoded.state.values())
        self._metrics.bytes_received.inc(received)
        started = time.perf_counter()
        try:
            outcome = self._store.push(
                decoded.tensors,
                head.version,
                head.learning_rate,
                head.worker,
                head.minibatch,
                head.incarnation,
                state=decoded.state,
            )
        except UninitializedError as err:
            self._metrics.pushed("uninitialized")
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except GradientError as err:
            self._metrics.pushed("invalid")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        self._metrics.push_seconds.observe(time.perf_counter() - started)
        self._metrics.pushed("accepted" if outcome.accepted else "rejected")
        self._metrics.staleness.observe(outcome.staleness)
        self._metrics.model_version.set(outcome.version)
        return pb.PushReply(accepted=outcome.accepted, version=outcome.version)

    def CommitRound(self, request: pb.CommitRequest, context: grpc.ServicerContext) -> pb.CommitReply:
        try:
            outcome = self._store.commit(request.round, list(request.workers), request.dry_run)
        except UninitializedError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except RoundError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        self._metrics.model_version.set(outcome.version)
        return pb.CommitReply(version=outcome.version)

    def DescribeShard(self, request: pb.DescribeRequest, context: grpc.ServicerContext) -> pb.ShardState:
        store = self._store
        return pb.ShardState(
            initialized=store.initialized,
            version=store.version,
            boot=store.boot,
            incarnation=store.incarnation,
            checkpoints=store.checkpoint_versions(),
        )

    def RestoreShard(self, request: pb.RestoreRequest, context: grpc.ServicerContext) -> pb.ShardState:
        try:
            self._store.roll_back(request.version, request.incarnation)
        except CheckpointError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"RestoreShard: {err}")
        self._metrics.model_version.set(self._store.version)
        return self.DescribeShard(pb.DescribeRequest(), context)


def add_to_server(servicer: ParameterServerServicer, server: grpc.Server) -> None:
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
    }
    declared = set(frames.PS_SERVICE.methods_by_name)
    if declared != set(handlers):  # the .proto is the one definition: fail loudly if they drift
        raise RuntimeError(f"ParameterServer methods {sorted(declared)} != handlers {sorted(handlers)}")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(frames.PS_SERVICE.full_name, handlers),))


def _decode(request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> frames.Decoded:
    try:
        return frames.decode(request_iterator)
    except frames.FrameError as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        raise  # unreachable: abort raises
