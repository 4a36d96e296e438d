"""The worker's view of all PS shards: split by variable, fan out concurrently, merge.

Used by the worker (and the benchmark). It owns the placement (``psclient/sharding.py``: by size, tensors
above ``split_bytes`` cut into row slices over all shards) so the worker deals in whole models: a
push sends each shard its pieces of the gradients, a pull asks every shard at once, joins slices
back into whole tensors and returns only what changed.

The placement is computed from the model: :meth:`PSClient.place` (the worker calls it with its
model before its first pull), else the first :meth:`PSClient.push_model` or
:meth:`PSClient.push` places the tensors it is given. A client that has placed nothing
(an observer) pulls the tensors as the shards hold them, slices under their own names.
Transient failures (a PS not up yet, restarting) are retried with backoff until ``deadline_s``, so
a worker that starts before its PS waits instead of failing. A shard that lost its model (restarted
without a checkpoint) raises :class:`ShardsUninitialized` so the worker can push its model again.

The model's non-trainable state (BatchNorm statistics; ``TensorMeta.state`` in the .proto) travels
beside the variables: placed with them, sent with the model and with every push, returned
by every full pull in :attr:`Pulled.state`.

Embedding tables (issue 17): the model's tables (:meth:`PSClient.declare_tables`) go with the
model to every shard; :meth:`PSClient.pull_embeddings` asks each shard for the rows of its ids
(``id mod N``), all shards at once, and puts them back in the order asked; a push's row
gradients (:class:`RowGrads`, per table) are split the same way and ride with the shard's dense
part. Each table is cut by its kind's splitter (``psclient/kinds.py``: the placement for the dense
and state tensors, ``id mod N`` for embedding rows).

A push is one :class:`PushRequest` and comes back as a :class:`PushHandle` (ps-lite's shape:
``KVWorker::Push`` returns a timestamp that ``Wait`` waits on): the request says what rides behind
it (:class:`PullBehind`) and where it runs, in the caller's thread or on the client's push thread.

Pushes and pulls of a shard travel over its bulk channel (raw TCP, ``rpc/bulk.py``) when it has
one that connects, as gRPC frames otherwise (``psclient/routes.py``); the answers, and their retries,
are the same either way.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import numpy as np

from elasticps.proto import elasticps_pb2 as pb
from elasticps.api.embedding import PART_IDS, PART_ROWS, IdArray, RowGrads, TableSpec
from elasticps.api.table_kinds import DEFAULT_KIND, TableKind
from elasticps.api.optimizer import OptimizerConfig
from elasticps.rpc.embedding_wire import all_request, ids_request, spec_message
from elasticps.psclient.kinds import RowSplitter, by_id, placed
from elasticps.psclient.routes import BulkRoute
from elasticps.psclient.sharding import DEFAULT_SPLIT_BYTES, Joined, Misplaced, Placement, place, tensor_infos
from elasticps.rpc import bulk, frames
from elasticps.rpc.channels import create_channel
from elasticps.rpc.status import Failure, classify, retrying

T = TypeVar("T")
# One shard's pulled model: its whole variables, its whole state tensors, the split tensors it brought slices of.
_Part = tuple[dict[str, np.ndarray], dict[str, np.ndarray], set[str]]

CONNECT_S = 5.0  # asking a shard for its bulk port


class _FrameStub:
    """The ParameterServer methods with tensor streams as serialized Frame bytes (``frames``
    writes and parses them; see ``ps/servicer.py``), small messages through protobuf."""

    def __init__(self, channel: grpc.Channel) -> None:
        path = f"/{frames.PS_SERVICE.full_name}/"
        self.PushModel: grpc.StreamUnaryMultiCallable[bytes, pb.ModelHead] = channel.stream_unary(
            path + "PushModel", request_serializer=None, response_deserializer=pb.ModelHead.FromString
        )
        self.PullDense: grpc.UnaryStreamMultiCallable[pb.PullRequest, bytes] = channel.unary_stream(
            path + "PullDense", request_serializer=pb.PullRequest.SerializeToString, response_deserializer=None
        )
        self.PushGradients: grpc.StreamUnaryMultiCallable[bytes, pb.PushReply] = channel.stream_unary(
            path + "PushGradients", request_serializer=None, response_deserializer=pb.PushReply.FromString
        )
        self.PullEmbeddings: grpc.UnaryStreamMultiCallable[pb.EmbeddingRequest, bytes] = channel.unary_stream(
            path + "PullEmbeddings", request_serializer=pb.EmbeddingRequest.SerializeToString,
            response_deserializer=None,
        )
        self.DescribeShard: grpc.UnaryUnaryMultiCallable[pb.DescribeRequest, pb.ShardState] = channel.unary_unary(
            path + "DescribeShard",
            request_serializer=pb.DescribeRequest.SerializeToString,
            response_deserializer=pb.ShardState.FromString,
        )


class ShardsUninitialized(Exception):
    def __init__(self, shards: Sequence[int]) -> None:
        super().__init__(f"PS shards {list(shards)} hold no model")
        self.shards = list(shards)


@dataclass(frozen=True)
class Pulled:
    """A split tensor's array is the client's buffer, overwritten by the next pull (copy to keep)."""

    versions: list[int]  # per shard
    incarnations: list[int]  # per shard: which timeline the version counts on (see ModelHead)
    tensors: dict[str, np.ndarray]  # only the shards that had a newer model
    uninitialized: list[int]  # shards that hold no model yet
    state: dict[str, np.ndarray] = field(default_factory=dict)  # the same shards' state tensors


class ModelMismatch(RuntimeError):
    """A shard holds another model than the one offered (other variables, shapes or dtypes), or
    one placed by another rule (a pull found tensors the placement puts elsewhere)."""


@dataclass(frozen=True)
class PulledRows:
    """Rows of embedding tables, per table in the order the ids were asked, and each shard's
    (incarnation, version) the rows are of."""

    rows: dict[str, np.ndarray]
    versions: list[int]
    incarnations: list[int]


@dataclass(frozen=True)
class PullBehind:
    """A pull sent right behind a push on each shard's bulk connection, in the same write, answered
    once the push is done there (:attr:`Pushed.behind` reads it): async, the model with the push in
    it, for one round trip instead of two; sync, the round's model, sent by each shard as soon as
    it commits the round."""

    wait_ms: int = 0  # how long each shard waits for a model newer than the push's versions
    # Sync: shard 0's pull is held back, to go behind the round's join there (Behind.join: PS 0
    # hosts the coordinator).
    join: bool = False


@dataclass(frozen=True, eq=False)  # eq=False: arrays do not compare as booleans
class PushRequest:
    """One push of a worker's gradients to every shard (:meth:`PSClient.push`).

    Async, every shard applies its part; sync, every shard stages it for the round the worker then
    joins. The mappings and sequences are read while the push travels: a caller must not change
    them before its handle is done."""

    gradients: Mapping[str, np.ndarray]
    versions: Sequence[int]  # per shard: the model the gradients were computed at
    learning_rate: float = 0.0
    minibatch: str = ""  # names the push in the shards' audit log (sync)
    incarnations: Sequence[int] | None = None  # per shard; None: all 0
    state: Mapping[str, np.ndarray] | None = None  # the worker's state tensors, each to its shard
    embeddings: Mapping[str, RowGrads] | None = None  # row gradients per table, each shard its ids' rows
    pull_behind: PullBehind | None = None
    # Rows to pull right behind the push (distinct ids per table: the next minibatch's), answered in
    # Pushed.rows: on each shard reached over its bulk channel, in the same write, once the push is
    # done there (async: the rows include it; sync: the push is only staged, the round's update is
    # not in them); elsewhere pulled after the push.
    rows_behind: Mapping[str, IdArray] | None = None
    # Where the push runs: False, in the caller's thread (its handle is done on return); True, on
    # the client's push thread, one push at a time in order, so the caller computes meanwhile;
    # a pull behind it is then read there too, and Pushed.behind has its answer.
    background: bool = False

    def __post_init__(self) -> None:
        if self.background and self.pull_behind is not None and self.pull_behind.join:
            raise ValueError("a push whose pull waits for a join runs in the caller's thread")


@dataclass(frozen=True)
class Pushed:
    accepted: list[bool]  # per shard
    versions: list[int]  # per shard, after the push
    behind: Behind | None = None  # the pull sent right behind the push, when one was asked for
    rows: PulledRows | None = None  # the rows asked for behind the push (PushRequest.rows_behind)

    @property
    def all_accepted(self) -> bool:
        return all(self.accepted)


class PushHandle:
    """A push sent (:meth:`PSClient.push`): :meth:`result` waits for every shard's answer and
    returns it, or raises what the push raised; :meth:`done` says whether it has come."""

    def __init__(self, future: Future[Pushed]) -> None:
        self._future = future

    @classmethod
    def now(cls, send: Callable[[], Pushed]) -> PushHandle:
        """Runs ``send`` in the caller's thread: the handle is done on return, holding its
        answer or its error."""
        future: Future[Pushed] = Future()
        try:
            future.set_result(send())
        except Exception as err:  # noqa: BLE001 - raised again by result(), as a pool's future would
            future.set_exception(err)
        return cls(future)

    def result(self, timeout: float | None = None) -> Pushed:
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()


class Dropped(Exception):
    """The pulls behind a push were dropped (:meth:`Behind.cancel`) before their answers came."""


class Behind:
    """The pull a push sent right behind itself (a :class:`PushRequest` with :class:`PullBehind`):
    on each shard reached over its bulk channel, the request is on the connection the push used,
    answered once the push is done there (``rpc/bulk.py``); :meth:`result` reads the answers (and
    pulls the other shards, and any whose answer did not come, as :meth:`PSClient.pull` does), once.
    :meth:`cancel`, from any thread, drops the answers not read: their connections are closed (a
    :meth:`result` reading them meanwhile raises :class:`Dropped`). A connection is closed only
    while it is this object's: one whose answer was read goes back to the client's pool
    (:meth:`release`) and is never closed by a later :meth:`cancel`."""

    def __init__(
        self,
        client: PSClient,
        versions: Sequence[int],
        incarnations: Sequence[int],
        wait_ms: int,
        waiting: Sequence[bulk.BulkConnection | None],
        held_back: pb.PullRequest | None = None,
    ) -> None:
        self._client = client
        self._versions = list(versions)
        self._incarnations = list(incarnations)
        self._wait_ms = wait_ms
        self._held: list[bulk.BulkConnection | None] = list(waiting)  # per shard, until released
        # Shard 0's pull, not sent yet: it goes behind the round's join (join()); None once it went.
        self._held_back = held_back if waiting and waiting[0] is not None else None
        self.sent = sum(connection is not None for connection in waiting)  # shards whose pull went behind
        self._lock = threading.Lock()  # guards _held and _dropped
        self._once = threading.Lock()  # one result() reads
        self._dropped = False
        self._pulled: Pulled | None = None

    def dropped(self) -> bool:
        return self._dropped

    def connection(self, shard: int) -> bulk.BulkConnection | None:
        """The connection holding ``shard``'s answer, None when there is none (or it was dropped)."""
        with self._lock:
            return None if self._dropped else self._held[shard]

    def join(self, request: pb.JoinRequest) -> pb.JoinReply | None:
        """Sync: joins the round over shard 0's connection, behind the push there, with that shard's
        held-back pull behind the join: the answer, or None when the join could not go that way (no
        pull held back, the connection failed, PS 0 takes no joins there): the caller then joins
        over gRPC, and shard 0 is pulled as any pull."""
        taken = self._take_held_back()
        if taken is None:
            return None
        connection, pull = taken
        try:
            return connection.join(request, pull)
        except (OSError, grpc.RpcError, bulk.DeadlineExceeded):
            return None  # the connection is broken: reading its pull fails, and shard 0 is pulled again

    def release(self, shard: int) -> bool:
        """``shard``'s answer was read (or failed): its connection is the caller's again, to give
        back to the pool; False when a :meth:`cancel` closed it first."""
        with self._lock:
            self._held[shard] = None
            return not self._dropped

    def result(self) -> Pulled:
        """The model as the pulls behind the push found it (read once; later calls get the same)."""
        with self._once:
            if self._pulled is None:
                if self._dropped:
                    raise Dropped("the pulls behind the push were dropped")
                self._send_held_back()
                self._pulled = self._client._pull(self._versions, self._wait_ms, None, self._incarnations, self)
            return self._pulled

    def _send_held_back(self) -> None:
        """Shard 0's pull, held back for a join that did not come: sent now, on its connection."""
        taken = self._take_held_back()
        if taken is not None:
            connection, pull = taken
            connection.send_pull(pull)  # a failure breaks the connection: the read fails, shard 0 is pulled again

    def _take_held_back(self) -> tuple[bulk.BulkConnection, pb.PullRequest] | None:
        """Shard 0's held-back pull and its connection, once; None when there is none or it was dropped."""
        with self._lock:
            pull, self._held_back = self._held_back, None
            connection = None if self._dropped else self._held[0]
        return None if connection is None or pull is None else (connection, pull)

    def cancel(self) -> bool:
        """Drops the answers not read yet, closing their connections; False when they were read already."""
        with self._lock:
            if self._dropped or self._pulled is not None:
                return False
            self._dropped = True
            for connection in self._held:  # under the lock: release() cannot hand one back meanwhile
                if connection is not None:
                    connection.abort()
            self._held = [None] * len(self._held)
        return True


def _unmoved(answer: frames.Decoded, request: pb.PullRequest) -> bool:
    """Whether a pull's answer is the model the request already had (nothing newer came)."""
    head = answer.first.model
    return head.initialized and (head.incarnation, head.version) == (request.incarnation, request.version)


_ShardRows = tuple[int, int, dict[str, np.ndarray]]  # a shard's version, incarnation, rows per table
PHASED_BYTES = 1 << 20  # a push of at most this many bytes per shard is written to every shard from one thread


def _payload_bytes(*groups: Mapping[str, np.ndarray | Mapping[str, np.ndarray]]) -> int:
    """The bytes of a push's arrays (tensors, state, and each table's parts)."""
    total = 0
    for group in groups:
        for value in group.values():
            total += value.nbytes if isinstance(value, np.ndarray) else sum(a.nbytes for a in value.values())
    return total


def _gathered(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Every call's result in order; after all ran, the first error raised, or the shards whose
    call raised ShardsUninitialized as one."""
    results: list[T] = []
    uninitialized: list[int] = []
    error: BaseException | None = None
    for shard, call in enumerate(calls):
        try:
            results.append(call())
        except ShardsUninitialized:
            uninitialized.append(shard)
        except BaseException as err:  # re-raised below, after every shard answered
            error = error or err
    if error is not None:
        raise error
    if uninitialized:
        raise ShardsUninitialized(uninitialized)
    return results


@dataclass(frozen=True)
class _RowsAsked:
    """A pull of rows cut over the shards: the ids per table, each shard's part and its request
    (None: nothing of it there)."""

    ids: dict[str, IdArray]
    splitters: dict[str, RowSplitter]
    mine: list[dict[str, IdArray]]
    requests: list[pb.EmbeddingRequest | None]
    shards: int

    def joined(self, answers: Sequence[_ShardRows]) -> PulledRows:
        rows = {table: self.splitters[table].join(values, self.shards, [a[2].get(table) for a in answers])
                for table, values in self.ids.items()}  # fmt: skip
        return PulledRows(rows, [a[0] for a in answers], [a[1] for a in answers])


class PSClient:
    def __init__(
        self,
        addresses: Sequence[str],
        worker: str,
        chunk_bytes: int = frames.CHUNK_BYTES,
        deadline_s: float = 120.0,
        timeout_s: float = 120.0,
        placement: Placement | None = None,
        interceptors: Sequence[grpc.Interceptor] = (),
        split_bytes: int = DEFAULT_SPLIT_BYTES,
        use_bulk: bool = True,
        token: str | None = None,
    ) -> None:
        """``interceptors``: gRPC client interceptors every call goes through (a harness counting
        each attempt's status code; none for a real worker). ``placement``: one made by hand (tests),
        instead of the one :meth:`place` computes with ``split_bytes``. ``use_bulk``: pushes and
        pulls over the shards' bulk channels where they connect (False: gRPC frames only).
        ``token``: the caller's identity in the job on every call, gRPC and bulk (None: this
        process's, ``identity.own_token``)."""
        if not addresses:
            raise ValueError("at least one PS address is needed")
        if placement is not None and placement.num_shards != len(addresses):
            raise ValueError(
                f"the placement puts tensors on {placement.num_shards} shards, "
                f"but {len(addresses)} PS addresses are given"
            )
        if split_bytes < 0:
            raise ValueError(f"split_bytes must be >= 0, got {split_bytes}")
        self.worker = worker
        self.num_shards = len(addresses)
        self.split_bytes = split_bytes
        self._dense, self._state = placed(TableKind.DENSE), placed(TableKind.STATE)  # psclient/kinds.py
        self._joined: Joined | None = None if placement is None else self._dense.joiner(placement)
        self._chunk_bytes = chunk_bytes
        self._deadline_s = deadline_s
        self._timeout_s = timeout_s
        self._channels = [create_channel(a, token) for a in addresses]
        self._stubs = [_FrameStub(grpc.intercept_channel(c, *interceptors)) for c in self._channels]
        self._routes: list[BulkRoute | None] = [
            BulkRoute(address, self._describer(shard), timeout_s, token=token) if use_bulk else None
            for shard, address in enumerate(addresses)
        ]
        self._pool = ThreadPoolExecutor(max_workers=2 * self.num_shards, thread_name_prefix="ps-client")
        # Background pushes (PushRequest.background) run here, one at a time in order: a push waits on fan-out
        # calls in _pool, so running it in _pool itself would deadlock once pushes fill that pool.
        self._push_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ps-push")
        self.tables: tuple[TableSpec, ...] = ()  # the model's embedding tables (declare_tables)

    def declare_tables(self, tables: Sequence[TableSpec]) -> None:
        """The model's embedding tables: sent with the model to every shard (push_model)."""
        self.tables = tuple(tables)

    # ---- placement ---------------------------------------------------------------------------
    def place(self, variables: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray] | None = None) -> Placement:
        """Places the model whose variables and state tensors these are (only names, shapes and
        dtypes are read); every later push is split and every pull joined by it."""
        placement = place(tensor_infos(variables, state), self.num_shards, self.split_bytes)
        self._joined = self._dense.joiner(placement)
        return placement

    @property
    def placement(self) -> Placement | None:
        return None if self._joined is None else self._joined.placement

    def split(self, tensors: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """``tensors`` as each shard takes them (pieces by held name); needs a placement."""
        if self._joined is None:
            raise RuntimeError("the PS client has placed no model yet (PSClient.place)")
        return self._dense.split(tensors, self._joined.placement)

    def _placed(self, tensors: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray] | None) -> Placement:
        """The placement, made from ``tensors`` and ``state`` (a whole model) when there is none yet."""
        return self._joined.placement if self._joined is not None else self.place(tensors, state)

    # ---- calls -------------------------------------------------------------------------------
    def push_model(
        self,
        tensors: Mapping[str, np.ndarray],
        optimizer: OptimizerConfig,
        versions: Sequence[int] | None = None,
        incarnation: int = 0,
        state: Mapping[str, np.ndarray] | None = None,
    ) -> list[int]:
        """Offers the model (its variables ``tensors`` and its ``state``) to every shard; shards
        that already hold one keep theirs.

        ``versions``: per shard, the version the offered model is (a worker repairing a shard that
        lost its model offers its copy at the version and incarnation it pulled); None or -1: a new
        model, version 0."""
        config = pb.OptimizerConfig(name=optimizer.name, params=dict(optimizer.params))
        placement = self._placed(tensors, state)
        parts = self._dense.split(tensors, placement)
        state_parts = self._state.split(state or {}, placement)

        def push(shard: int) -> int:
            version = max(0, versions[shard]) if versions is not None else 0
            head = pb.Frame(
                model=pb.ModelHead(
                    initialized=True, version=version, incarnation=incarnation, optimizer=config,
                    tables=[spec_message(spec) for spec in self.tables],
                    shards=self.num_shards if self.tables else 0,
                )
            )

            def stream() -> Iterator[bytes]:  # made anew for each attempt of the call
                return frames.encode(head, parts[shard], self._chunk_bytes, state_parts[shard])

            try:
                reply: pb.ModelHead = self._call(
                    lambda: self._stubs[shard].PushModel(stream(), timeout=self._timeout_s), "PushModel"
                )
            except grpc.RpcError as err:
                # PushModel's FAILED_PRECONDITION: the shard holds another model (not "no model").
                if isinstance(err, grpc.Call) and err.code() is grpc.StatusCode.FAILED_PRECONDITION:
                    raise ModelMismatch(f"PS shard {shard}: {err.details()}") from err
                raise
            return reply.version

        return self._fan_out(push)

    def pull(
        self,
        versions: Sequence[int],
        wait_ms: int = 0,
        only: Sequence[int] | None = None,
        incarnations: Sequence[int] | None = None,
    ) -> Pulled:
        """Pulls every shard whose (incarnation, version) differs from the caller's (-1: "I have nothing").

        With ``wait_ms``, a shard where the caller is current answers once its version moves (or
        after ``wait_ms``): a long poll instead of a busy loop. ``only``: ask just these shards (the
        others keep the caller's version, with no tensors).

        A tensor split over shards is returned once every slice of it has arrived at least once
        (after a first full pull, whenever a shard holding a slice had a newer model); its rows
        from shards that had nothing newer are those they answered last. A shard holding tensors
        the placement puts elsewhere raises :class:`ModelMismatch`.
        """
        return self._pull(versions, wait_ms, only, incarnations, None)

    def _pull(
        self,
        versions: Sequence[int],
        wait_ms: int,
        only: Sequence[int] | None,
        incarnations: Sequence[int] | None,
        behind: Behind | None,
    ) -> Pulled:
        """:meth:`pull`; ``behind``: pulls already sent behind a push (:meth:`Behind.result`): a
        shard's answer is read from the connection holding it, and asked again as any pull when it
        does not come, unless the answers were dropped meanwhile (:class:`Dropped`)."""
        held = list(incarnations) if incarnations is not None else [0] * self.num_shards
        joined = self._joined

        def pull(shard: int) -> tuple[int, int, _Part | None, bool]:
            if only is not None and shard not in only:
                return versions[shard], held[shard], None, True
            request = pb.PullRequest(
                worker=self.worker, version=versions[shard], wait_ms=wait_ms, incarnation=held[shard]
            )

            def attempt() -> frames.Decoded:
                decoded = self._over_bulk(shard, lambda connection: connection.pull(request))
                if decoded is not None:
                    return decoded
                return frames.decode(self._stubs[shard].PullDense(request, timeout=self._timeout_s))

            answered = self._read_behind(shard, behind) if behind is not None else None
            if answered is not None and wait_ms > 0 and _unmoved(answered, request):
                answered = None  # its long poll ended before the model moved: asked again
            if answered is None and behind is not None and behind.dropped():
                raise Dropped("the pulls behind the push were dropped")
            decoded: frames.Decoded = answered if answered is not None else self._call(attempt, "PullDense")
            head = decoded.first.model
            part: _Part = (decoded.tensors, decoded.state, set())
            if joined is not None and head.initialized and (decoded.tensors or decoded.state):
                try:  # here, in the shard's own thread: the slices of shards are copied in parallel
                    part = joined.take(shard, decoded.tensors, decoded.state)
                except Misplaced as err:
                    raise ModelMismatch(str(err)) from None
            return head.version, head.incarnation, part, head.initialized

        results = self._fan_out(pull)
        tensors: dict[str, np.ndarray] = {}
        state: dict[str, np.ndarray] = {}
        touched: set[str] = set()
        for _, _, part, _ in results:
            if part is not None:
                tensors.update(part[0])
                state.update(part[1])
                touched |= part[2]
        if joined is not None and touched:
            whole, whole_state = joined.whole(sorted(touched))
            tensors.update(whole)
            state.update(whole_state)
        return Pulled(
            versions=[version for version, _, _, _ in results],
            incarnations=[incarnation for _, incarnation, _, _ in results],
            tensors=tensors,
            uninitialized=[shard for shard, (_, _, _, ok) in enumerate(results) if not ok],
            state=state,
        )

    def push(self, request: PushRequest) -> PushHandle:
        """Sends ``request`` to every shard, split by the placement (made from its gradients and
        state when there is none yet), where the request says: in the caller's thread, or on the
        client's push thread (``background``). With a :class:`PullBehind`, :attr:`Pushed.behind`
        reads its answers (a shard the push reached over gRPC frames is pulled there instead)."""
        if not request.background:
            return PushHandle.now(lambda: self._send(request))

        def travel() -> Pushed:
            pushed = self._send(request)
            if pushed.behind is not None:
                try:
                    pushed.behind.result()
                except Exception:
                    pass  # raised again by the caller's result(), which pulls again
            return pushed

        return PushHandle(self._push_pool.submit(travel))

    def _send(self, request: PushRequest) -> Pushed:
        """The push itself, in whichever thread :meth:`push` runs it (a subclass timing pushes
        wraps this)."""
        gradients, versions, state = request.gradients, request.versions, request.state
        learning_rate, minibatch, behind_spec = request.learning_rate, request.minibatch, request.pull_behind
        join_behind = behind_spec is not None and behind_spec.join
        placement = self._placed(gradients, state)
        parts = self._dense.split(gradients, placement)
        state_parts = self._state.split(state or {}, placement)
        row_parts = self._split_rows(request.embeddings or {})
        rows_asked = None if request.rows_behind is None else self._ask_rows(request.rows_behind)
        held = list(request.incarnations) if request.incarnations is not None else [0] * self.num_shards
        waiting: list[bulk.BulkConnection | None] = [None] * self.num_shards
        pulls = [
            None if behind_spec is None else
            pb.PullRequest(worker=self.worker, version=versions[shard], wait_ms=behind_spec.wait_ms,
                           incarnation=held[shard])
            for shard in range(self.num_shards)
        ]  # fmt: skip

        def head_of(shard: int) -> pb.Frame:
            return pb.Frame(push=pb.PushHead(worker=self.worker, version=versions[shard], learning_rate=learning_rate,
                                             minibatch=minibatch, incarnation=held[shard]))  # fmt: skip

        def behind_of(shard: int) -> pb.PullRequest | None:
            return None if join_behind and shard == 0 else pulls[shard]  # shard 0's goes behind the join

        def rows_of(shard: int) -> pb.EmbeddingRequest | None:
            return None if rows_asked is None else rows_asked.requests[shard]

        def follows(shard: int) -> bool:
            """Whether a dense pull or a join follows the push (and its rows) on its connection."""
            return behind_of(shard) is not None or (join_behind and shard == 0)

        def kept(shard: int) -> bool:
            """Whether the connection stays the push's after its reply: answers follow on it."""
            return follows(shard) or rows_of(shard) is not None

        def write(shard: int, connection: bulk.BulkConnection) -> None:
            connection.send_push(head_of(shard), parts[shard], state_parts[shard], row_parts[shard], behind_of(shard),
                                 rows_of(shard))  # fmt: skip

        def push(shard: int) -> pb.PushReply:
            head = head_of(shard)

            def stream() -> Iterator[bytes]:  # made anew for each attempt of the call
                return frames.encode(head, parts[shard], self._chunk_bytes, state_parts[shard], row_parts[shard])

            def attempt() -> pb.PushReply:
                def over(connection: bulk.BulkConnection) -> pb.PushReply:
                    write(shard, connection)
                    return connection.read_push()

                reply = self._over_bulk(shard, over, keep=waiting if kept(shard) else None)
                if reply is not None:
                    return reply
                return self._stubs[shard].PushGradients(stream(), timeout=self._timeout_s)

            reply: pb.PushReply = self._call(attempt, "PushGradients")
            return reply

        def rows_behind(shard: int) -> _ShardRows:
            # The rows' answer is on the connection when the push went over it; else (or when it
            # did not come) they are pulled now. Never the push again: it was applied.
            assert rows_asked is not None
            decoded = self._read_rows(shard, waiting, keep=follows(shard)) if rows_of(shard) is not None else None
            return self._rows_answer(shard, rows_asked, decoded)

        small = all(_payload_bytes(parts[shard], state_parts[shard], row_parts[shard]) <= PHASED_BYTES
                    for shard in range(self.num_shards))  # fmt: skip
        try:
            if small and self.num_shards > 1:
                replies = self._phased(write, lambda shard, connection: connection.read_push(), push,
                                       [True] * self.num_shards, waiting, kept)  # fmt: skip
            else:
                replies = self._fan_out(push)
            pulled = None if rows_asked is None else rows_asked.joined(self._fan_out(rows_behind, threads=False))
        except BaseException:
            Behind(self, versions, held, 0, waiting).cancel()
            raise
        behind = None
        if behind_spec is not None:
            behind = Behind(self, versions, held, behind_spec.wait_ms, waiting, pulls[0] if join_behind else None)
        return Pushed([r.accepted for r in replies], [r.version for r in replies], behind, pulled)

    def _read_rows(self, shard: int, waiting: list[bulk.BulkConnection | None], keep: bool) -> frames.Decoded | None:
        """The answer of the rows pulled behind a push on ``waiting[shard]``'s connection; None when
        the push went another way or the answer did not come (the caller pulls them again).
        ``keep``: a dense pull or a join follows on the connection, which stays in ``waiting``;
        otherwise it goes back to the pool."""
        connection = waiting[shard]
        if connection is None:
            return None
        try:
            return connection.read_pull()
        except (OSError, grpc.RpcError, bulk.DeadlineExceeded, frames.FrameError):
            return None  # a broken connection is closed by give_back (and the dense pull read after it fails)
        finally:
            route = self._routes[shard]
            if not keep:
                waiting[shard] = None
                if route is not None:
                    route.give_back(connection)

    def _rows_of(self, table: str) -> RowSplitter:
        """The splitter of a declared table's rows, by its kind (``psclient/kinds.py``); a table
        not declared is an embedding table, as before kinds."""
        kind = next((spec.kind for spec in self.tables if spec.name == table), DEFAULT_KIND)
        return by_id(kind)

    def _split_rows(self, embeddings: Mapping[str, RowGrads]) -> list[dict[str, dict[str, np.ndarray]]]:
        """Each shard's part of the row gradients, cut by each table's kind (embedding: the ids
        ``id mod N`` names it, with their rows)."""
        out: list[dict[str, dict[str, np.ndarray]]] = [{} for _ in range(self.num_shards)]
        for table, part in embeddings.items():
            for shard, piece in enumerate(self._rows_of(table).split(part, self.num_shards)):
                if piece is not None:
                    out[shard][table] = piece
        return out

    def pull_embeddings(self, ids: Mapping[str, IdArray], read_only: bool = False) -> PulledRows:
        """The rows of ``ids`` per table, in their order: each shard is asked for the ids it holds
        (embedding: ``id mod N``; the caller passes distinct ids), all shards at once, over their
        bulk channels where they connect. ``read_only`` (evaluation, prediction): the shards make
        no row (an id without one reads its first values)."""
        asked = self._ask_rows(ids, read_only)
        wanted = [request is not None for request in asked.requests]

        def write(shard: int, connection: bulk.BulkConnection) -> None:
            request = asked.requests[shard]
            assert request is not None
            connection.send_rows(request)

        def read(shard: int, connection: bulk.BulkConnection) -> _ShardRows:
            return self._rows_answer(shard, asked, connection.read_pull())

        def slow(shard: int) -> _ShardRows:
            return self._rows_answer(shard, asked, None)

        return asked.joined(self._phased(write, read, slow, wanted))

    def _ask_rows(self, ids: Mapping[str, IdArray], read_only: bool = False) -> _RowsAsked:
        """Each shard's part of a pull of rows (by each table's kind), and what puts the answers together."""
        splitters = {table: self._rows_of(table) for table in ids}
        cut = {table: splitters[table].ask(values, self.num_shards) for table, values in ids.items()}
        mine = [{table: per_shard[shard] for table, per_shard in cut.items() if per_shard[shard].size}
                for shard in range(self.num_shards)]  # fmt: skip
        requests = [ids_request(self.worker, part, read_only) if part else None for part in mine]
        return _RowsAsked(dict(ids), splitters, mine, requests, self.num_shards)

    def _rows_answer(self, shard: int, asked: _RowsAsked, decoded: frames.Decoded | None) -> _ShardRows:
        """One shard's rows: ``decoded`` when its answer came already (behind a push), else asked
        now (over the bulk channel, else gRPC frames, with the client's retries)."""
        request = asked.requests[shard]
        if request is None:
            return -1, -1, {}
        if decoded is None:

            def attempt() -> frames.Decoded:
                over = self._over_bulk(shard, lambda connection: connection.pull_rows(request))
                if over is not None:
                    return over
                return frames.decode(self._stubs[shard].PullEmbeddings(request, timeout=self._timeout_s))

            decoded = self._call(attempt, "PullEmbeddings")
        head = decoded.first.model
        if not head.initialized:
            raise ShardsUninitialized([shard])
        rows = {table: parts[PART_ROWS] for table, parts in decoded.embeddings.items() if PART_ROWS in parts}
        for table, values in asked.mine[shard].items():
            found = rows.get(table)
            if found is None or found.shape[0] != values.size:
                raise ModelMismatch(f"PS shard {shard} answered {None if found is None else found.shape[0]} rows "
                                    f"of table {table!r} for {values.size} ids")
        return head.version, head.incarnation, rows

    def held_rows(self, tables: Sequence[str]) -> dict[str, tuple[IdArray, np.ndarray]]:
        """Every row the shards hold of ``tables``: per table its ids (sorted) and their rows."""

        def pull(shard: int) -> dict[str, dict[str, np.ndarray]]:
            request = all_request(self.worker, list(tables))
            decoded: frames.Decoded = self._call(
                lambda: frames.decode(self._stubs[shard].PullEmbeddings(request, timeout=self._timeout_s)),
                "PullEmbeddings",
            )
            return decoded.embeddings

        parts = self._fan_out(pull)
        out: dict[str, tuple[IdArray, np.ndarray]] = {}
        for table in tables:
            ids = np.concatenate([part[table][PART_IDS] for part in parts])
            rows = np.concatenate([part[table][PART_ROWS] for part in parts])
            order = np.argsort(ids, kind="stable")
            out[table] = (ids[order], rows[order])
        return out

    def close(self) -> None:
        self._push_pool.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        for route in self._routes:
            if route is not None:
                route.close()
        for channel in self._channels:
            channel.close()

    # ---- plumbing ----------------------------------------------------------------------------
    def _describer(self, shard: int) -> Callable[[], int]:
        def describe() -> int:
            state: pb.ShardState = self._stubs[shard].DescribeShard(pb.DescribeRequest(), timeout=CONNECT_S)
            return int(state.bulk_port)

        return describe

    def _over_bulk(
        self, shard: int, call: Callable[[bulk.BulkConnection], T], keep: list[bulk.BulkConnection | None] | None = None
    ) -> T | None:
        """``call`` over the shard's bulk channel; None when it has none that connects, or the
        connection failed: then the caller sends it as gRPC frames. A status the bulk server
        answered is raised as the gRPC call's would be (``bulk.BulkError``). ``keep``: the call
        left an answer on the connection (a pull behind a push): once it succeeded, the connection
        is put in ``keep[shard]`` instead of back in the pool (:meth:`_read_behind` gives it back)."""
        route = self._routes[shard]
        connection = route.take() if route is not None else None
        if route is None or connection is None:
            return None
        kept = False
        try:
            result = call(connection)
            if keep is not None and not connection.broken:
                keep[shard], kept = connection, True
            return result
        except bulk.DeadlineExceeded as err:
            raise bulk.BulkError(grpc.StatusCode.DEADLINE_EXCEEDED, str(err)) from None
        except bulk.BulkError as err:
            if err.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            route.full()  # turned away before anything was read: the call goes as gRPC frames
            return None
        except OSError:  # refused mid-stream (the server answers and closes), reset, closed
            route.lost()
            return None
        finally:
            if not kept:
                route.give_back(connection)

    def _read_behind(self, shard: int, behind: Behind) -> frames.Decoded | None:
        """The answer of the pull sent behind a push to ``shard``; None when there is none or it did
        not come (the connection failed or was dropped, the model changed while sent, a refusal):
        the caller pulls again, as any pull, with its retries."""
        connection = behind.connection(shard)
        if connection is None:
            return None
        try:
            return connection.read_pull()
        except (OSError, grpc.RpcError, bulk.DeadlineExceeded, frames.FrameError):
            return None  # a broken connection is closed by give_back; a torn answer's is fine
        finally:
            route = self._routes[shard]
            if behind.release(shard) and route is not None:
                route.give_back(connection)

    def _call(self, call: Callable[[], T], what: str) -> T:
        return retrying(call, what=what, deadline_s=self._deadline_s)

    def _fan_out(self, call: Callable[[int], T], threads: bool = True) -> list[T]:
        """``call`` for every shard, each in a thread of the client's pool (``threads``, more than
        one shard) or one after another in the caller's; the first error raised once every shard
        answered, shards without a model gathered into one :class:`ShardsUninitialized`."""
        if threads and self.num_shards > 1:
            futures = [self._pool.submit(self._guard, call, shard) for shard in range(self.num_shards)]
            return _gathered([future.result for future in futures])
        return _gathered([functools.partial(self._guard, call, shard) for shard in range(self.num_shards)])

    def _phased(
        self,
        write: Callable[[int, bulk.BulkConnection], None],
        read: Callable[[int, bulk.BulkConnection], T],
        slow: Callable[[int], T],
        wanted: Sequence[bool],
        keep: list[bulk.BulkConnection | None] | None = None,
        kept: Callable[[int], bool] = lambda shard: False,
    ) -> list[T]:
        """A small call to every shard in the caller's thread, no thread per shard: written on
        each wanted shard's bulk connection first, then each answer read, so the shards work at
        once (a thread pool's hand-offs cost more than such a call). A shard without a bulk
        connection, or whose write or read failed short of an answer, gets ``slow`` (the call with
        its retries, over bulk or gRPC frames); one not wanted gets ``slow`` too (which answers
        at once). ``keep``/``kept``: a shard whose connection holds more answers (pulls behind a
        push) keeps it in ``keep[shard]``."""
        written: list[bulk.BulkConnection | None] = [None] * self.num_shards
        for shard in range(self.num_shards):
            route = self._routes[shard]
            connection = route.take() if wanted[shard] and route is not None else None
            if route is None or connection is None:
                continue
            try:
                write(shard, connection)
                written[shard] = connection
            except (OSError, bulk.DeadlineExceeded):
                route.lost()
                route.give_back(connection)  # broken: closed

        def answer(shard: int) -> T:
            connection, route = written[shard], self._routes[shard]
            if connection is None or route is None:
                return slow(shard)
            holding = False
            try:
                result = read(shard, connection)
                if keep is not None and kept(shard) and not connection.broken:
                    keep[shard], holding = connection, True
                return result
            except bulk.BulkError as err:
                if err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    route.full()  # turned away before anything was read
                elif classify(err.code()) is not Failure.TRANSIENT:
                    raise
            except (OSError, bulk.DeadlineExceeded, frames.FrameError):
                route.lost()  # as _over_bulk: the call goes again, its own way
            finally:
                if not holding:
                    route.give_back(connection)
            return slow(shard)

        return self._fan_out(answer, threads=False)

    @staticmethod
    def _guard(call: Callable[[int], T], shard: int) -> T:
        try:
            return call(shard)
        except grpc.RpcError as err:
            if isinstance(err, grpc.Call) and classify(err.code()) is Failure.UNINITIALIZED:
                raise ShardsUninitialized([shard]) from err
            raise
