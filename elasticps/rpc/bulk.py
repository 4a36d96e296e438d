"""The bulk channel: a PS's tensor streams over a plain TCP connection, gRPC kept for the rest.

Callers: the PS's bulk server (``ps/bulk.py``) and the PS client (``psclient/client.py``), for
``PushGradients`` and ``PullDense`` (the model's bytes each step); every other call, and these two
whenever the channel cannot be used, stays on gRPC. The bytes are those of the gRPC path's frames
(``rpc/frames.py``), so one set of rules reads them, with a length before each:

* hello: a connection's first bytes, written ahead of its first call and never answered: ``EPB2``,
  method 0, then ``u64 length`` + the member's token (``identity.py``, at most
  ``identity.MAX_TOKEN_BYTES``; empty without one); written again ahead of a later call when the
  member's token changed (rotated keys). A server with the job's key checks the last hello's token
  at every call (the keys it accepts may have changed since): a call whose token names no member
  is answered UNAUTHENTICATED and the connection closed;
* request: ``EPB2``, the method (1 push, 2 pull, 3 join, 4 rows), then frames, each ``u64 length`` +
  the serialized ``Frame`` bytes: a push is its head frame (head and tensor metadata) and payload
  frames, ended by a zero length; a pull is one serialized ``PullRequest``; a pull of rows
  (``PullEmbeddings``, issue 38) one serialized ``EmbeddingRequest``, its ids raw little-endian
  int64s (at most :data:`MAX_ROWS_REQUEST_BYTES`);
* reply: the status (a ``grpc.StatusCode`` value, 0 OK) and ``u64 length`` + bytes: the reply
  message (``PushReply``), an error's message, or a pull's head frame (its tensors' metadata: a
  pull of rows has one ``rows`` tensor per table), then (pull, OK) the tensors' bytes, as many as
  the head declares, and one byte: 1 when the model did not change while its bytes were sent, 0
  when it did (a sync shard sends its variables as they are, and a commit may have run meanwhile:
  :class:`Torn`, the client pulls again; rows are copies, always 1).

A receiver reads the head frame whole (at most :data:`MAX_HEAD_BYTES`, held only as its bytes arrive:
:func:`recv_declared`), has it admitted (sizes and
names against the model, before any buffer: ``ps/intake.py``), then receives a payload-only frame
straight into the stream's buffer (``frames.Assembly.space``), no copy, any other frame through
``frames.Assembly.add``: a frame that does not fit is refused as on gRPC. A receiver that takes
the tensors piece by piece instead (``frames.Chunked``) gets the same checks. Every read is bounded by
a :class:`Deadline` (an idle limit per read and the whole call's). A sender writes the arrays' own
memory (``frames.describe``), no copy.

A connection's requests are answered one after another, in order, so a client may write pulls
right behind a push in one go (``BulkConnection.push`` with ``rows`` and ``pull``, in that order):
each is answered once the push is done, includes it (async; sync, the push is only staged), and
they cost one round trip instead of several.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import numpy as np

from elasticps import identity
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import frames
from elasticps.rpc.embedding_wire import MAX_PULL_IDS

MAGIC = b"EPB2"  # 2: a pull's reply ends with the intact byte
HELLO = 0  # the connection's token, first; no reply
PUSH_GRADIENTS = 1
PULL_DENSE = 2
JOIN_ROUND = 3  # sync: the coordinator's JoinRound, on PS 0 only, behind the worker's push there
PULL_ROWS = 4  # embedding rows by id (PullEmbeddings)
METHODS = {PUSH_GRADIENTS: "PushGradients", PULL_DENSE: "PullDense", JOIN_ROUND: "JoinRound", PULL_ROWS: "PullEmbeddings"}

REQUEST = struct.Struct("<4sB")  # magic, method
LENGTH = struct.Struct("<Q")
REPLY = struct.Struct("<BQ")  # status code value, message bytes
INTACT = struct.Struct("<?")  # after a pull's tensors: whether the model stayed as it was while sent
MAX_HEAD_BYTES = 16 << 20  # a stream's head frame (metadata, and whatever payload it carries)
MAX_MESSAGE_BYTES = 1 << 20  # a PullRequest, a reply message, an error's message
MAX_ROWS_REQUEST_BYTES = 8 * MAX_PULL_IDS + MAX_MESSAGE_BYTES  # an EmbeddingRequest: one table's most ids, and room
_MAX_PREFIX = 11  # a payload frame's tag and varint

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class DeadlineExceeded(Exception):
    """A read or a write waited past its :class:`Deadline`."""


class BulkClosed(ConnectionError):
    """The peer closed the connection (or sent nothing) where bytes were due."""


@dataclass
class Deadline:
    """At most ``idle_s`` per read and write, and nothing past ``until`` (``time.monotonic``)."""

    idle_s: float
    until: float
    what: str = ""

    @classmethod
    def within(cls, idle_s: float, total_s: float, what: str = "") -> Deadline:
        return cls(idle_s, time.monotonic() + total_s, what)

    def timeout(self) -> float:
        left = self.until - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"{self.what}: past its deadline")
        return min(self.idle_s, left)


class BulkError(grpc.RpcError, grpc.Call):
    """A status the bulk server answered, raised as gRPC's call errors are (``rpc/status.py``
    classifies and retries it like one)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> Any:
        return ()

    def trailing_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


class Torn(BulkError):
    """A pull whose model changed while it was sent (a commit ran meanwhile): UNAVAILABLE, which the
    client's retry asks again; the connection is fine."""

    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, "PullDense: the model changed while it was sent")


# ---- reading and writing, bounded ----------------------------------------------------------------
def recv_into(sock: socket.socket, view: memoryview, deadline: Deadline) -> None:
    got = 0
    while got < len(view):
        sock.settimeout(deadline.timeout())
        try:
            n = sock.recv_into(view[got:])
        except TimeoutError:
            raise DeadlineExceeded(f"{deadline.what}: no bytes for {deadline.idle_s:g} s") from None
        if n == 0:
            raise BulkClosed(f"{deadline.what}: the peer closed the connection")
        got += n


def recv_bytes(sock: socket.socket, size: int, deadline: Deadline) -> bytes:
    buffer = bytearray(size)
    recv_into(sock, memoryview(buffer), deadline)
    return bytes(buffer)


GROW_BYTES = 64 << 10  # what a peer's declared length costs at most before its bytes arrive


def recv_declared(sock: socket.socket, size: int, deadline: Deadline) -> bytes:
    """``size`` bytes a peer declared, held only as they arrive: the wait for each piece holds no
    buffer (``poll``, then ``recv`` of what came, at most :data:`GROW_BYTES`), so a peer that
    declares 16 MiB and sends nothing costs nothing."""
    received = bytearray()
    poller = select.poll()  # not select(): a PS with many connections has descriptors past 1024
    poller.register(sock, select.POLLIN)
    while len(received) < size:
        wait = deadline.timeout()
        if not poller.poll(wait * 1000):
            raise DeadlineExceeded(f"{deadline.what}: no bytes for {deadline.idle_s:g} s")
        piece = sock.recv(min(GROW_BYTES, size - len(received)))
        if not piece:
            raise BulkClosed(f"{deadline.what}: the peer closed the connection")
        received += piece
    return bytes(received)


def recv_length(sock: socket.socket, deadline: Deadline) -> int:
    (length,) = LENGTH.unpack(recv_bytes(sock, LENGTH.size, deadline))
    return int(length)


_IOV_MAX = 64  # buffers per sendmsg call (Linux takes 1024)


def send(sock: socket.socket, parts: Sequence[bytes | memoryview], deadline: Deadline) -> None:
    """Writes ``parts`` in order, gathered into as few system calls as the kernel takes
    (``sendmsg``): no copy of the arrays' memory, one TCP segment for the small parts."""
    views = [memoryview(part).cast("B") for part in parts if len(part)]
    while views:
        sock.settimeout(deadline.timeout())
        try:
            sent = sock.sendmsg(views[:_IOV_MAX])
        except TimeoutError:
            raise DeadlineExceeded(f"{deadline.what}: the peer took no bytes for {deadline.idle_s:g} s") from None
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def reply_parts(code: grpc.StatusCode, message: bytes) -> list[bytes]:
    return [REPLY.pack(code.value[0], len(message)), message]


def read_reply(sock: socket.socket, deadline: Deadline) -> tuple[grpc.StatusCode, bytes]:
    value, length = REPLY.unpack(recv_bytes(sock, REPLY.size, deadline))
    if length > MAX_MESSAGE_BYTES:
        raise BulkClosed(f"{deadline.what}: a reply of {length} bytes")
    return _CODES.get(value, grpc.StatusCode.UNKNOWN), recv_bytes(sock, length, deadline)


# ---- a tensor stream, received ---------------------------------------------------------------------
class Receiving(Protocol):
    """Where a stream's payload goes: ``frames.Assembly`` (whole) or ``frames.Chunked`` (in pieces)."""

    @property
    def received(self) -> int: ...

    def space(self, size: int) -> memoryview: ...

    def advance(self, size: int) -> None: ...

    def add(self, message: bytes) -> None: ...


def receive_head(sock: socket.socket, deadline: Deadline) -> frames.Head:
    """A stream's head frame (after its method byte); FrameError when it is not one."""
    length = recv_length(sock, deadline)
    if length == 0:
        raise frames.FrameError("empty stream: no head frame")
    if length > MAX_HEAD_BYTES:
        raise frames.FrameError(f"a head frame of {length} bytes, more than the {MAX_HEAD_BYTES} taken")
    return frames.read_head(recv_declared(sock, length, deadline))


def receive_payload(sock: socket.socket, deadline: Deadline, head: frames.Head, into: Receiving) -> None:
    """The frames after ``head``, up to the stream's end, into ``into`` (a payload-only frame
    straight into its space, no copy); FrameError for what a gRPC stream would be refused.
    The caller then calls ``into.finish()``."""
    while (length := recv_length(sock, deadline)) != 0:
        left = head.total - into.received
        prefix = recv_bytes(sock, min(length, _MAX_PREFIX), deadline)
        start = frames.payload_header(prefix, length)
        if start is not None:
            size = length - start
            if size > left:  # before reading it
                raise frames.FrameError(f"stream carried more than the {head.total} bytes its tensors need")
            early = memoryview(prefix)[start:]
            while size:
                view = into.space(size)
                taken = min(len(early), len(view))
                view[:taken] = early[:taken]
                early = early[taken:]
                recv_into(sock, view[taken:], deadline)
                into.advance(len(view))
                size -= len(view)
            continue
        if length > left + MAX_HEAD_BYTES:  # any other encoding of a payload, with room for its fields
            raise frames.FrameError(f"a frame of {length} bytes, more than the {left} bytes left can be")
        into.add(prefix + recv_bytes(sock, length - len(prefix), deadline))


# ---- the client's side -------------------------------------------------------------------------------
def _message(method: int, request: pb.PullRequest | pb.JoinRequest | pb.EmbeddingRequest) -> list[bytes | memoryview]:
    body = request.SerializeToString()
    return [REQUEST.pack(MAGIC, method), LENGTH.pack(len(body)), body]


def hello(token: str) -> list[bytes | memoryview]:
    body = token.encode("ascii")
    return [REQUEST.pack(MAGIC, HELLO), LENGTH.pack(len(body)), body]


class BulkConnection:
    """One connection to a PS's bulk server: one call at a time (the client keeps a few)."""

    def __init__(self, host: str, port: int, connect_timeout_s: float, timeout_s: float,
                 token: str | None = None) -> None:
        """``token``: the member's (None: this process's as it is at each call,
        ``identity.own_token``), sent in a hello ahead of the connection's first call and again
        ahead of the first call after it changed (a rotated token file)."""
        self._sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timeout_s = timeout_s
        self._token: Callable[[], str] = identity.own_token if token is None else (lambda: token)
        self._sent: str | None = None  # the token of the last hello
        self.broken = False

    def _send(self, parts: Sequence[bytes | memoryview], deadline: Deadline) -> None:
        """Writes a call, a hello ahead of it when the token is not the one the server has."""
        token = self._token()
        if token != self._sent:
            parts, self._sent = [*hello(token), *parts], token
        send(self._sock, parts, deadline)

    def _deadline(self, what: str) -> Deadline:
        return Deadline.within(self._timeout_s, self._timeout_s, what)

    def push(self, head: pb.Frame, tensors: dict[str, np.ndarray], state: dict[str, np.ndarray],
             embeddings: Mapping[str, Mapping[str, np.ndarray]] | None = None,
             pull: pb.PullRequest | None = None, rows: pb.EmbeddingRequest | None = None) -> pb.PushReply:
        """Sends one push stream; its reply, or BulkError with the status the server answered.

        ``pull``: a pull request sent right behind the push, in the same write: the server takes it
        once the push is done, so its answer includes the push. ``rows``: a pull of rows sent the
        same way, ahead of ``pull``. Their answers are left on the connection for :meth:`read_pull`,
        in that order: until then the connection carries nothing else (a refused push gets no
        answer to them: the server closes the connection)."""
        deadline = self._deadline("PushGradients")
        self.send_push(head, tensors, state, embeddings, pull, rows, deadline)
        return self.read_push(deadline)

    def send_push(self, head: pb.Frame, tensors: dict[str, np.ndarray], state: dict[str, np.ndarray],
                  embeddings: Mapping[str, Mapping[str, np.ndarray]] | None = None,
                  pull: pb.PullRequest | None = None, rows: pb.EmbeddingRequest | None = None,
                  deadline: Deadline | None = None) -> None:
        """:meth:`push`'s write alone; :meth:`read_push` reads its reply (a client writes to every
        shard first, then reads every reply)."""
        first, views = frames.describe(head, tensors, state, embeddings)
        head_bytes = first.SerializeToString()
        total = sum(len(v) for v in views)
        parts: list[bytes | memoryview] = [REQUEST.pack(MAGIC, PUSH_GRADIENTS), LENGTH.pack(len(head_bytes)), head_bytes]
        if total:
            header = frames.payload_frame_header(total)
            parts += [LENGTH.pack(len(header) + total), header, *views]
        parts.append(LENGTH.pack(0))
        if rows is not None:
            parts += _message(PULL_ROWS, rows)
        if pull is not None:
            parts += _message(PULL_DENSE, pull)
        self._write(parts, deadline or self._deadline("PushGradients"))

    def read_push(self, deadline: Deadline | None = None) -> pb.PushReply:
        """The reply of the push :meth:`send_push` wrote, or BulkError with the status the server answered."""
        code, message = self._reply(deadline or self._deadline("PushGradients"))
        if code is not grpc.StatusCode.OK:
            raise BulkError(code, message.decode(errors="replace"))
        return pb.PushReply.FromString(message)

    def pull(self, request: pb.PullRequest) -> frames.Decoded:
        deadline = self._deadline("PullDense")
        code, message = self._exchange(_message(PULL_DENSE, request), deadline)
        return self._pulled(code, message, deadline)

    def pull_rows(self, request: pb.EmbeddingRequest) -> frames.Decoded:
        """The rows of the request's ids, per table (``Decoded.embeddings``: ``{"rows": ...}``)."""
        self.send_rows(request)
        return self.read_pull()

    def send_rows(self, request: pb.EmbeddingRequest) -> None:
        """:meth:`pull_rows`'s write alone; :meth:`read_pull` reads its answer."""
        self._write(_message(PULL_ROWS, request), self._deadline("PullEmbeddings"))

    def join(self, request: pb.JoinRequest, pull: pb.PullRequest | None = None) -> pb.JoinReply:
        """Sync, on PS 0: joins the round with the gradient pushed on this connection (the server
        takes the join once that push is done); waits up to ``request.wait_ms`` for the answer.
        ``pull``: as for :meth:`push`, sent behind the join and left for :meth:`read_pull`."""
        parts = _message(JOIN_ROUND, request)
        if pull is not None:
            parts += _message(PULL_DENSE, pull)
        waits_s = self._timeout_s + request.wait_ms / 1000
        deadline = Deadline.within(waits_s, waits_s, "JoinRound")
        code, message = self._exchange(parts, deadline)
        if code is not grpc.StatusCode.OK:
            raise BulkError(code, message.decode(errors="replace"))
        try:
            return pb.JoinReply.FromString(message)
        except Exception:
            self.broken = True
            raise BulkError(grpc.StatusCode.INTERNAL, "JoinRound: the reply is not a valid message") from None

    def send_pull(self, request: pb.PullRequest) -> None:
        """Sends a pull without reading its answer (:meth:`read_pull` does); a failed send leaves
        the connection broken, and the read then fails at once."""
        try:
            self._send(_message(PULL_DENSE, request), self._deadline("PullDense"))
        except (OSError, DeadlineExceeded):
            self.broken = True

    def read_pull(self) -> frames.Decoded:
        """The answer to the next pull left on the connection: sent behind the last push (``rows``,
        then ``pull``) or join, or by :meth:`send_pull`."""
        if self.broken:
            raise BulkClosed("the connection broke before the pull's answer")
        deadline = self._deadline("PullDense")
        code, message = self._reply(deadline)
        return self._pulled(code, message, deadline)

    def _pulled(self, code: grpc.StatusCode, message: bytes, deadline: Deadline) -> frames.Decoded:
        """A pull's answer, after its status and head: the tensors, then the intact byte."""
        if code is not grpc.StatusCode.OK:
            raise BulkError(code, message.decode(errors="replace"))
        try:
            head = frames.read_head(message)
            assembly = frames.Assembly(head)
            size = head.total - assembly.received
            recv_into(self._sock, assembly.space(size), deadline)
            assembly.advance(size)
            (intact,) = INTACT.unpack(recv_bytes(self._sock, INTACT.size, deadline))
            decoded = assembly.finish()
        except BaseException:
            self.broken = True
            raise
        if not intact:
            raise Torn()
        return decoded

    def _exchange(self, parts: Sequence[bytes | memoryview], deadline: Deadline) -> tuple[grpc.StatusCode, bytes]:
        self._write(parts, deadline)
        return self._reply(deadline)

    def _write(self, parts: Sequence[bytes | memoryview], deadline: Deadline) -> None:
        try:
            self._send(parts, deadline)
        except BaseException:
            self.broken = True
            raise

    def _reply(self, deadline: Deadline) -> tuple[grpc.StatusCode, bytes]:
        try:
            code, message = read_reply(self._sock, deadline)
        except BaseException:
            self.broken = True
            raise
        if code is not grpc.StatusCode.OK:
            self.broken = True  # the server ends the connection after a refusal
        return code, message

    def close(self) -> None:
        self.broken = True
        self._sock.close()

    def abort(self) -> None:
        """Closes the connection from any thread: a read blocked on it ends at once (``OSError``)."""
        self.broken = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
