"""A PS shard's bulk server: ``PushGradients``, ``PullDense`` and ``PullEmbeddings`` over plain TCP
(``rpc/bulk.py``).

Started by ``ps/main.py`` beside the gRPC server (``--bulk_port``; its port is told to clients by
``DescribeShard``), on the same store, with the same rules as the servicer (``ps/servicer.py``):

* a push's head is admitted by ``intake.admit_push`` before its payload is buffered; frames that do
  not fit are refused (INVALID_ARGUMENT) and the store's checks decide the rest, so a refused or cut
  off push changes nothing; the payload is received straight into a buffer that the connection
  keeps and reuses while nothing else holds it (a sync round's staged gradient does);
* a sync push of the dense variables is not buffered whole: the store opens a stream for it
  (``ParameterStore.open_stream``) and its pieces (``frames.Chunked``, the connection's buffer
  holds one) are checked and added to the round's sum as they arrive (``arrivals.py``: a push
  refused or cut off after part of it was summed makes its round abort on every shard);
* ``ServerLimits``: at most ``max_push_streams`` connections at once (one thread each; the next is
  answered RESOURCE_EXHAUSTED and closed), each read and write bounded by ``stream_idle_s`` and each
  call by ``stream_deadline_s`` (DEADLINE_EXCEEDED, then the connection is closed), a connection
  idle between calls (or before its first) for ``stream_idle_s`` closed; a declared length costs
  memory only as its bytes arrive (``bulk.recv_declared``);
* a pull sends the variables' own memory, no copy, and holds no lock while it sends (a slow puller
  holds no commit back): async, the live arrays as they are (a torn read, as on gRPC); sync, the
  version it read under the store's guard, and after the bytes the intact byte: whether that
  version is still the shard's (a commit that ran meanwhile changed the arrays under the send:
  the client pulls again, ``rpc.bulk.Torn``); ``wait_ms`` long-polls in the connection's thread,
  at most ``servicer.MAX_WAIT_MS``;
* ``PullEmbeddings`` (issue 38): the rows of the ids asked, per table, as the gRPC call answers
  them (``ParameterStore.pull_embeddings``: the request checked by ``embedding_wire.ids_of``, rows
  made for ids not held yet), their bytes sent from the copies read, no encoding;
* ``JoinRound`` (PS 0 of a sync job, which hosts the coordinator: ``joiner``): the worker writes
  it behind its push here, so it is taken once that push is staged, and waits for the round in the
  connection's thread; a pull written behind it is answered as soon as the round is committed. The
  coordinator's answer is the same as over gRPC (``coordinator/bulk.py``, ``BulkJoins``); waiting
  joins are bounded by the connections (``max_push_streams``); another PS answers UNIMPLEMENTED;
* job identity (``identity.py``): with the job's key, a connection's calls are served only while
  its last hello's token names a member allowed them (checked at each call), and a push or join only when it names that member's own
  worker (UNAUTHENTICATED or PERMISSION_DENIED, then the connection is closed);
* after any refusal the reply is sent and the connection closed (the client falls back to gRPC
  frames, where the same call gets the same answer).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import numpy as np

from elasticps import identity
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps import intake
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.servicer import MAX_WAIT_MS
from elasticps.api.embedding import EmbeddingError
from elasticps.ps.store import GradientError, ParameterStore, PushOutcome, UninitializedError
from elasticps.rpc import bulk, frames
from elasticps.rpc.embedding_wire import ids_of
from elasticps.rpc.limits import ServerLimits
from elasticps.rpc.receiving import Refused

log = logging.getLogger(__name__)

Joiner = Callable[[pb.JoinRequest], pb.JoinReply]  # the coordinator's JoinRound, waited for; raises Refused


class BulkServer:
    def __init__(
        self, store: ParameterStore, metrics: PSMetrics, limits: ServerLimits, host: str, port: int,
        joiner: Joiner | None = None, verifier: identity.Verifier | None = None,
    ) -> None:  # fmt: skip
        self._store = store
        self._verifier = verifier
        self._joiner = joiner
        self._metrics = metrics
        self._limits = limits
        self._listener = socket.create_server((host, port), backlog=128)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="bulk-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:  # a connection accepted from now on is closed by the accept loop itself
            self._closed = True
            open_now = list(self._connections)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept (Linux)
        except OSError:
            pass
        self._listener.close()
        for conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def connections(self) -> int:
        with self._lock:
            return len(self._connections)

    # ---- connections ------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:  # accepted while stop() ran: it would never be shut down
                    conn.close()
                    return
                full = len(self._connections) >= self._limits.max_push_streams
                if not full:
                    self._connections.add(conn)
            if full:
                threading.Thread(target=self._turn_away, args=(conn,), daemon=True).start()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="bulk-conn", daemon=True).start()

    def _turn_away(self, conn: socket.socket) -> None:
        message = (
            f"bulk: {self._limits.max_push_streams} connections at once already, the most this PS takes "
            "(--max_push_streams); retry later"
        )
        try:
            bulk.send(conn, bulk.reply_parts(grpc.StatusCode.RESOURCE_EXHAUSTED, message.encode()), self._deadline("bulk"))
        except (OSError, bulk.DeadlineExceeded):
            pass
        finally:
            conn.close()

    def _deadline(self, what: str) -> bulk.Deadline:
        return bulk.Deadline.within(self._limits.stream_idle_s, self._limits.stream_deadline_s, what)

    def _serve(self, conn: socket.socket) -> None:
        buffer = [np.empty(0, dtype=np.uint8)]  # the connection's receive buffer, reused while free
        token: str | None = None  # the connection's hello's: checked at each call (the keys may rotate)
        try:
            while True:
                idle = self._limits.stream_idle_s  # a client keeps a few connections, each busy every step
                between = bulk.Deadline.within(idle, idle, "bulk")
                try:
                    magic, method = bulk.REQUEST.unpack(bulk.recv_bytes(conn, bulk.REQUEST.size, between))
                except (bulk.BulkClosed, bulk.DeadlineExceeded, OSError):
                    return  # closed or idle between calls: nothing was under way
                if magic == bulk.MAGIC and method == bulk.HELLO:
                    token = self._hello(conn)
                    continue
                if magic != bulk.MAGIC or method not in bulk.METHODS:
                    self._refuse(conn, grpc.StatusCode.INVALID_ARGUMENT, "bulk: not a bulk request")
                    return
                what = bulk.METHODS[method]
                deadline = self._deadline(what)
                member = self._verifier.member(token) if self._verifier is not None else None
                if self._verifier is not None and (problem := identity.refusal(member, what)) is not None:
                    code = grpc.StatusCode.UNAUTHENTICATED if member is None else grpc.StatusCode.PERMISSION_DENIED
                    self._refuse(conn, code, f"bulk: {problem}")
                    return
                try:
                    if method == bulk.PUSH_GRADIENTS:
                        self._push(conn, deadline, buffer, member)
                    elif method == bulk.JOIN_ROUND:
                        self._join(conn, deadline, member)
                    elif method == bulk.PULL_ROWS:
                        self._pull_rows(conn, deadline)
                    else:
                        self._pull(conn, deadline)
                except bulk.DeadlineExceeded as err:
                    self._refuse(conn, grpc.StatusCode.DEADLINE_EXCEEDED, f"{err}; nothing was applied")
                    return
                except frames.FrameError as err:
                    self._refuse(conn, grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {err}")
                    return
                except Refused as err:
                    self._refuse(conn, err.code, err.message)
                    return
        except (OSError, bulk.BulkClosed, bulk.DeadlineExceeded):
            return
        except Exception:  # a bug: never let it kill the PS
            log.exception("bulk connection failed")
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _hello(self, conn: socket.socket) -> str | None:
        """The token of the connection's hello (None: not ASCII)."""
        deadline = bulk.Deadline.within(self._limits.stream_idle_s, self._limits.stream_idle_s, "hello")
        length = bulk.recv_length(conn, deadline)
        if length > identity.MAX_TOKEN_BYTES:
            raise bulk.BulkClosed(f"hello: a token of {length} bytes")
        token = bulk.recv_bytes(conn, length, deadline)
        try:
            return token.decode("ascii")
        except UnicodeDecodeError:
            return None

    def _refuse(self, conn: socket.socket, code: grpc.StatusCode, message: str) -> None:
        try:
            bulk.send(conn, bulk.reply_parts(code, message.encode()), bulk.Deadline.within(1.0, 1.0, "refusal"))
        except (OSError, bulk.DeadlineExceeded):
            pass

    # ---- calls --------------------------------------------------------------------------------------
    def _push(self, conn: socket.socket, deadline: bulk.Deadline, buffer: list[np.ndarray], member: str | None) -> None:
        """One push. ``buffer[0]``: the connection's receive buffer, replaced when too small or
        when the store keeps views of it (a sync round's staged gradient)."""
        store = self._store
        head = bulk.receive_head(conn, deadline)
        self._admit_push(head)
        push = head.first.push
        if (problem := identity.claim_refusal(member, push.worker, "PushGradients: worker")) is not None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, problem)
        with self._refusals():
            stream = store.open_stream(head.tensors, push.version, push.learning_rate, push.worker, push.minibatch,
                                       push.incarnation)  # fmt: skip
        if stream is not None:
            # Summed piece by piece as it arrives (ps/arrivals.py): the connection's buffer holds one piece.
            if len(buffer[0]) < frames.CHUNK_BYTES:
                buffer[0] = np.empty(frames.CHUNK_BYTES, dtype=np.uint8)
            pieces = frames.Chunked(head, stream.take, buffer[0])
            started = time.perf_counter()  # its checks and sums run as the pieces arrive: timed with them
            with self._refusals():
                try:
                    bulk.receive_payload(conn, deadline, head, pieces)
                    pieces.finish()
                except BaseException:
                    stream.cut()
                    raise
                outcome = stream.finish()
            self._metrics.bytes_received.inc(head.total)
            self._reply(conn, deadline, outcome, started)
            return
        if len(buffer[0]) < head.total:
            buffer[0] = np.empty(head.total, dtype=np.uint8)
        assembly = frames.Assembly(head, buffer[0])
        bulk.receive_payload(conn, deadline, head, assembly)
        decoded = assembly.finish()
        self._metrics.bytes_received.inc(frames.tensor_bytes(decoded))
        started = time.perf_counter()
        with self._refusals():
            outcome = store.push(
                decoded.tensors, push.version, push.learning_rate, push.worker, push.minibatch,
                push.incarnation, state=decoded.state, embeddings=decoded.embeddings, received=True,
            )  # fmt: skip
        self._reply(conn, deadline, outcome, started)
        del decoded, assembly
        # The buffer is kept for the next push unless the store holds views of it (a staged
        # gradient): then the next push gets a new one. Two references: the list's and the argument.
        if sys.getrefcount(buffer[0]) > 2:
            buffer[0] = np.empty(0, dtype=np.uint8)

    @contextlib.contextmanager
    def _refusals(self) -> Iterator[None]:
        """The store's refusals of a push as the bulk channel's (counted, then answered)."""
        try:
            yield
        except UninitializedError as err:
            self._metrics.pushed("uninitialized")
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
        except GradientError as err:
            self._metrics.pushed("invalid")
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None

    def _reply(self, conn: socket.socket, deadline: bulk.Deadline, outcome: PushOutcome, started: float) -> None:
        self._metrics.push_seconds.observe(time.perf_counter() - started)
        self._metrics.answered(outcome)
        reply = pb.PushReply(accepted=outcome.accepted, version=outcome.version).SerializeToString()
        bulk.send(conn, bulk.reply_parts(grpc.StatusCode.OK, reply), deadline)

    def _admit_push(self, head: frames.Head) -> None:
        try:
            intake.admit_push(head, self._store.layout, self._store.settings.shard)
        except Refused as refused:
            self._metrics.pushed("uninitialized" if refused.code is grpc.StatusCode.FAILED_PRECONDITION else "invalid")
            raise

    def _join(self, conn: socket.socket, deadline: bulk.Deadline, member: str | None) -> None:
        request = _message(conn, deadline, pb.JoinRequest(), "JoinRound")
        if (problem := identity.claim_refusal(member, request.worker, "JoinRound: worker")) is not None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, problem)
        if self._joiner is None:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "JoinRound: only PS 0 takes joins (it hosts the coordinator)")
        reply = self._joiner(request)  # waits for the round, up to request.wait_ms
        self._metrics.joined(reply)
        bulk.send(conn, bulk.reply_parts(grpc.StatusCode.OK, reply.SerializeToString()), self._deadline("JoinRound"))

    def _pull(self, conn: socket.socket, deadline: bulk.Deadline) -> None:
        request = _message(conn, deadline, pb.PullRequest(), "PullDense")
        store = self._store
        if not store.initialized:
            self._metrics.pulled("uninitialized")
            self._send_head(conn, pb.Frame(model=pb.ModelHead(initialized=False, version=0)), deadline)
            return
        held = (request.incarnation, request.version)
        if held == (store.incarnation, store.version) and request.wait_ms > 0:
            store.wait_newer(request.version, min(request.wait_ms, MAX_WAIT_MS) / 1000)
        if held == (store.incarnation, store.version):
            self._metrics.pulled("current")
            head = pb.ModelHead(initialized=True, version=request.version, incarnation=request.incarnation)
            self._send_head(conn, pb.Frame(model=head), deadline)
            return
        self._metrics.pulled("full")
        with store.reading_model() as found:
            read = (found.incarnation, found.version)
            live = pb.Frame(model=pb.ModelHead(initialized=True, version=found.version, incarnation=found.incarnation))
            first, views = frames.describe(live, found.variables, found.state)
        head_bytes = first.SerializeToString()
        reply: list[bytes | memoryview] = [*bulk.reply_parts(grpc.StatusCode.OK, head_bytes), *views]
        if not store.consistent_reads:  # async: live arrays, torn reads taken as they come
            bulk.send(conn, [*reply, bulk.INTACT.pack(True)], deadline)
        else:
            bulk.send(conn, reply, deadline)
            with store.reading_model() as after:  # after any commit running now
                intact = (after.incarnation, after.version) == read
            if not intact:
                self._metrics.pulled("torn")
            bulk.send(conn, [bulk.INTACT.pack(intact)], deadline)
        self._metrics.bytes_sent.inc(len(head_bytes) + sum(len(v) for v in views))

    def _pull_rows(self, conn: socket.socket, deadline: bulk.Deadline) -> None:
        request = _message(conn, deadline, pb.EmbeddingRequest(), "PullEmbeddings", bulk.MAX_ROWS_REQUEST_BYTES)
        try:
            incarnation, version, parts = self._store.pull_embeddings(ids_of(request), make=not request.read_only)
        except UninitializedError as err:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
        except (GradientError, EmbeddingError) as err:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"PullEmbeddings: {err}") from None
        head = pb.Frame(model=pb.ModelHead(initialized=True, version=version, incarnation=incarnation))
        first, views = frames.describe(head, {}, {}, parts)
        head_bytes = first.SerializeToString()
        bulk.send(conn, [*bulk.reply_parts(grpc.StatusCode.OK, head_bytes), *views, bulk.INTACT.pack(True)], deadline)
        self._metrics.bytes_sent.inc(len(head_bytes) + sum(len(v) for v in views))

    def _send_head(self, conn: socket.socket, head: pb.Frame, deadline: bulk.Deadline) -> None:
        """A pull's reply without tensors (no model, or nothing newer)."""
        bulk.send(conn, [*bulk.reply_parts(grpc.StatusCode.OK, head.SerializeToString()), bulk.INTACT.pack(True)], deadline)


M = TypeVar("M", pb.PullRequest, pb.JoinRequest, pb.EmbeddingRequest)


def _message(conn: socket.socket, deadline: bulk.Deadline, into: M, what: str, limit: int = bulk.MAX_MESSAGE_BYTES) -> M:
    """A request's message: its length checked against ``limit`` before it is read, then parsed
    into ``into``."""
    length = bulk.recv_length(conn, deadline)
    if length > limit:
        raise frames.FrameError(f"a request of {length} bytes")
    body = bulk.recv_declared(conn, length, deadline)
    try:
        into.ParseFromString(body)
    except Exception:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: the request is not a valid message") from None
    return into
