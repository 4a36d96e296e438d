"""Tensors to and from streams of serialized ``Frame`` messages: raw bytes + dtype + shape, in chunks.

Callers: the PS servicer and the PS client, for every push and pull. The first frame carries the head
and the metadata of all tensors; the raw bytes of all tensors, concatenated in metadata order, follow
as ``payload`` chunks of ``chunk_bytes``. Small tensors share a chunk (a small model is one message),
big ones span several (PERFORMANCE.md: 1-4 MB chunks on a stream move 5x more than one big message).
Decoding checks everything a peer could get wrong and raises :class:`FrameError`, which servers
answer with INVALID_ARGUMENT. A server that receives frame by frame (``rpc/receiving.py``) reads
the first one with :func:`read_head` (what it declares, before any buffer exists: it can be
refused there) and feeds the others to an :class:`Assembly`; :func:`decode` does both at once.

Model *state* (non-trainable variables such as BatchNorm's moving statistics) travels in the same
stream, after the other tensors, its metadata marked ``state`` (see ``TensorMeta`` in the .proto);
:class:`Decoded` hands it back apart from the variables or gradients. A name is unique across both.
Embedding tables' parts (ids, row gradients, pulled rows) come last, their metadata marked with
their ``table``; a part's name is unique within its table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
from google.protobuf.message import DecodeError

from elasticps.proto import elasticps_pb2 as pb

CHUNK_BYTES = 1 << 20

# The service whose tensor streams travel as serialized Frames (its client and servicer register
# its methods by these names, taken from the .proto).
PS_SERVICE = pb.DESCRIPTOR.services_by_name["ParameterServer"]

_TO_WIRE: dict[np.dtype[np.generic], pb.DType.ValueType] = {
    np.dtype("<f4"): pb.DTYPE_FLOAT32,
    np.dtype("<f8"): pb.DTYPE_FLOAT64,
    np.dtype("<f2"): pb.DTYPE_FLOAT16,
    np.dtype("<i4"): pb.DTYPE_INT32,
    np.dtype("<i8"): pb.DTYPE_INT64,
}
_FROM_WIRE = {wire: dtype for dtype, wire in _TO_WIRE.items()}


class FrameError(ValueError):
    """A malformed tensor stream: unknown dtype, bad shape, too few or too many bytes."""


@dataclass(frozen=True)
class Decoded:
    """The first frame (its head fields) and the tensors a stream carried: the variables or
    gradients in ``tensors``, the model state (metadata marked ``state``) in ``state``."""

    first: pb.Frame
    tensors: dict[str, np.ndarray]
    state: dict[str, np.ndarray] = field(default_factory=dict)
    embeddings: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # table -> part -> array


def tensor_bytes(decoded: Decoded) -> int:
    """The bytes of every tensor a stream carried."""
    parts = [*decoded.tensors.values(), *decoded.state.values()]
    parts += [array for table in decoded.embeddings.values() for array in table.values()]
    return sum(int(array.nbytes) for array in parts)


def encode(
    head: pb.Frame,
    tensors: Mapping[str, np.ndarray],
    chunk_bytes: int = CHUNK_BYTES,
    state: Mapping[str, np.ndarray] | None = None,
    embeddings: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> Iterator[bytes]:
    """The serialized ``Frame`` messages of one stream, produced lazily, so the first chunk is on
    the wire while the next is being cut. ``head`` (a Frame with only its head set) becomes the
    first frame, with every tensor's metadata; the ``state`` tensors follow the others, marked.

    Payload frames are written by hand: a ``Frame`` holding only ``payload`` is the tag byte 0x22,
    a varint length and the bytes, so each chunk costs one copy out of the arrays instead of
    protobuf's three. A stock protobuf parser reads them as ordinary Frames.

    The arrays are read as the generator advances: under the async rules the caller may pass live
    arrays and accept a torn read (relaxed consistency, as the design allows).
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    first, views = describe(head, tensors, state, embeddings)
    return _frames(first.SerializeToString(), views, chunk_bytes)


def describe(
    head: pb.Frame,
    tensors: Mapping[str, np.ndarray],
    state: Mapping[str, np.ndarray] | None = None,
    embeddings: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> tuple[pb.Frame, list[memoryview]]:
    """The first frame of a stream (``head`` with every tensor's metadata, no payload) and the
    tensors' bytes in metadata order, as views of the arrays (a copy only of a non-contiguous or
    big-endian one): what :func:`encode` cuts into frames and the bulk channel (``rpc/bulk.py``)
    sends as they are."""
    first = pb.Frame()
    first.CopyFrom(head)
    views: list[memoryview] = []
    marked = [(tensors, False, ""), (state or {}, True, "")]
    marked += [(parts, False, table) for table, parts in (embeddings or {}).items()]
    for group, is_state, table in marked:
        for name, array in group.items():
            dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
            wire = _TO_WIRE.get(np.dtype(dtype))
            if wire is None:
                raise FrameError(f"tensor {name!r}: dtype {array.dtype} cannot travel")
            first.tensors.add(name=name, dtype=wire, shape=array.shape, state=is_state, table=table)
            contiguous = np.ascontiguousarray(array, dtype=dtype)
            views.append(contiguous.reshape(-1).view(np.uint8).data)
    return first, views


def _frames(first: bytes, views: list[memoryview], chunk_bytes: int) -> Iterator[bytes]:
    pending: list[memoryview] = []
    pending_bytes = 0
    prefix = first  # the head and metadata ride in the first message, with the first chunk
    sent = False
    for view in views:
        offset = 0
        while offset < len(view):
            take = min(chunk_bytes - pending_bytes, len(view) - offset)
            pending.append(view[offset : offset + take])
            pending_bytes += take
            offset += take
            if pending_bytes == chunk_bytes:
                yield _payload_message(prefix, pending, pending_bytes)
                prefix, pending, pending_bytes, sent = b"", [], 0, True
    if pending or not sent:
        yield _payload_message(prefix, pending, pending_bytes)


def _payload_message(prefix: bytes, parts: list[memoryview], size: int) -> bytes:
    if not parts:
        return prefix
    return b"".join([prefix, _PAYLOAD_TAG, _varint(size), *parts])


_PAYLOAD_TAG = bytes([(4 << 3) | 2])  # field 4 (payload), wire type 2 (length-delimited)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def payload_header(prefix: bytes, length: int) -> int | None:
    """How many bytes of a ``length``-byte frame starting with ``prefix`` (its first 11 bytes or
    all of it) come before its payload, when it is a payload-only frame (what :func:`encode`
    writes: the tag, a varint, the bytes); None for any other frame."""
    if prefix[:1] != _PAYLOAD_TAG:
        return None
    size, position, shift = 0, 1, 0
    while position < len(prefix) and position < 11:
        byte = prefix[position]
        size |= (byte & 0x7F) << shift
        position += 1
        shift += 7
        if not byte & 0x80:
            return position if position + size == length else None
    return None


def payload_frame_header(size: int) -> bytes:
    """The bytes before a ``size``-byte payload in a payload-only frame."""
    return _PAYLOAD_TAG + _varint(size)


def _payload_of(message: bytes) -> bytes | memoryview:
    """The payload of a frame after the first: parsed by hand when it is a payload-only frame
    (what :func:`encode` writes), by protobuf otherwise (any other valid encoding)."""
    start = payload_header(message, len(message))
    if start is not None:
        return memoryview(message)[start:]
    frame = _parse(message)
    if frame.HasField("push") or frame.HasField("model") or len(frame.tensors):
        raise FrameError("a head or tensor metadata after the first frame")
    return frame.payload


def _parse(message: bytes) -> pb.Frame:
    try:
        return pb.Frame.FromString(message)
    except DecodeError as err:
        raise FrameError(f"not a Frame message: {err}") from None


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as a stream's head declares it (checked: a name, a known dtype, no negative dimension)."""

    name: str
    dtype: np.dtype[np.generic]
    shape: tuple[int, ...]
    nbytes: int
    state: bool
    table: str = ""  # an embedding table's part (see TensorMeta.table)


@dataclass(frozen=True)
class Head:
    """A stream's first frame, parsed: its head fields, the tensors it declares and the payload
    bytes they need (``total``), before any buffer is allocated (a receiver can refuse it first)."""

    first: pb.Frame
    tensors: tuple[TensorSpec, ...]
    total: int


def read_head(message: bytes) -> Head:
    """The first frame of a stream; raises FrameError when it is not a valid head."""
    first = _parse(message)
    tensors = _layout(first.tensors)
    return Head(first, tensors, sum(t.nbytes for t in tensors))


class Assembly:
    """The tensors of one stream being received: a buffer of the size its head declared, filled
    frame by frame (:meth:`add`, FrameError as soon as a frame does not fit), then cut into arrays
    (:meth:`finish`). Used by :func:`decode` and by servers that receive frames one at a time."""

    def __init__(self, head: Head, buffer: np.ndarray | None = None) -> None:
        """``buffer``: uint8 memory of at least ``head.total`` bytes to receive into (a receiver's
        preallocated one); otherwise one is allocated."""
        self.head = head
        if buffer is not None and buffer.dtype == np.uint8 and buffer.ndim == 1 and len(buffer) >= head.total:
            self._buffer = buffer[: head.total]
        else:
            try:
                self._buffer = np.empty(head.total, dtype=np.uint8)
            except (MemoryError, ValueError):
                raise FrameError(f"the tensors claim {head.total} bytes, more than this process can hold") from None
        self._filled = _fill(self._buffer, head.first.payload, 0)

    def space(self, size: int) -> memoryview:
        """The next ``size`` bytes of the buffer, to be received into directly (then :meth:`advance`);
        FrameError when they are more than the tensors need."""
        end = self._filled + size
        if end > len(self._buffer):
            raise FrameError(f"stream carried more than the {len(self._buffer)} bytes its tensors need")
        return self._buffer[self._filled : end].data.cast("B")

    def advance(self, size: int) -> None:
        """``size`` bytes were received into :meth:`space`."""
        self._filled += size

    @property
    def received(self) -> int:
        """Payload bytes received so far."""
        return self._filled

    def add(self, message: bytes) -> None:
        """One more frame of the stream (a payload)."""
        self._filled = _fill(self._buffer, _payload_of(message), self._filled)

    def finish(self) -> Decoded:
        total = self.head.total
        if self._filled != total:
            raise FrameError(f"stream carried {self._filled} bytes, the tensors need {total}")
        tensors: dict[str, np.ndarray] = {}
        state: dict[str, np.ndarray] = {}
        embeddings: dict[str, dict[str, np.ndarray]] = {}
        offset = 0
        for spec in self.head.tensors:
            try:
                value = self._buffer[offset : offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)
            except ValueError:  # an empty tensor with absurd other dimensions
                raise FrameError(f"tensor {spec.name!r}: shape {spec.shape} cannot be held") from None
            if spec.table:
                embeddings.setdefault(spec.table, {})[spec.name] = value
            else:
                (state if spec.state else tensors)[spec.name] = value
            offset += spec.nbytes
        head = pb.Frame()
        head.CopyFrom(self.head.first)
        head.ClearField("payload")
        return Decoded(head, tensors, state, embeddings)


class Chunked:
    """A stream's tensors handed on in pieces as they arrive, never held whole: the receiving
    side of :class:`Assembly` for a receiver that consumes each piece at once (a sync shard adds
    a push into its round's sum as it arrives, ``ps/arrivals.py``).

    Bytes go into one buffer of ``chunk_bytes``; each piece is at most that, within one tensor,
    starting at a multiple of ``chunk_bytes`` into it, and goes to ``take(spec, start, values)``
    (``start``: the element the piece begins at, ``values``: a flat view of the buffer, valid
    during the call). :meth:`space` may offer fewer bytes than asked (the rest of the piece);
    FrameError as :class:`Assembly` for more bytes than the tensors need, and at :meth:`finish`
    for fewer."""

    def __init__(
        self,
        head: Head,
        take: Callable[[TensorSpec, int, np.ndarray], None],
        buffer: np.ndarray | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        """``buffer``: uint8 memory of at least ``chunk_bytes`` to reuse; otherwise one is made."""
        if chunk_bytes < 8 or chunk_bytes % 8:
            raise ValueError(f"chunk_bytes must be a positive multiple of 8, got {chunk_bytes}")
        self.head = head
        self._take = take
        if buffer is None or buffer.dtype != np.uint8 or buffer.ndim != 1 or len(buffer) < chunk_bytes:
            buffer = np.empty(chunk_bytes, dtype=np.uint8)
        self._buffer = buffer[:chunk_bytes]
        self._chunk = chunk_bytes
        self._index = 0  # the tensor being received
        self._done = 0  # its bytes handed on
        self._filled = 0  # bytes of the current piece in the buffer
        self._received = 0
        self._skip_empty()
        self._put(head.first.payload)

    def _skip_empty(self) -> None:
        tensors = self.head.tensors
        while self._index < len(tensors) and self._done == tensors[self._index].nbytes:
            self._index += 1
            self._done = 0

    def _piece(self) -> int:
        if self._index >= len(self.head.tensors):
            raise FrameError(f"stream carried more than the {self.head.total} bytes its tensors need")
        return min(self._chunk, self.head.tensors[self._index].nbytes - self._done)

    def space(self, size: int) -> memoryview:
        """Room for up to ``size`` more bytes (at least one), to be received into (then :meth:`advance`)."""
        piece = self._piece()
        end = self._filled + min(size, piece - self._filled)
        return self._buffer[self._filled : end].data.cast("B")

    def advance(self, size: int) -> None:
        self._filled += size
        self._received += size
        if self._filled == self._piece():
            spec = self.head.tensors[self._index]
            values = self._buffer[: self._filled].view(spec.dtype)
            self._take(spec, self._done // spec.dtype.itemsize, values)
            self._done += self._filled
            self._filled = 0
            self._skip_empty()

    def _put(self, data: bytes | memoryview) -> None:
        data = memoryview(data).cast("B")
        while len(data):
            view = self.space(len(data))
            view[:] = data[: len(view)]
            self.advance(len(view))
            data = data[len(view) :]

    @property
    def received(self) -> int:
        return self._received

    def add(self, message: bytes) -> None:
        """One more frame of the stream (a payload)."""
        self._put(_payload_of(message))

    def finish(self) -> None:
        if self._received != self.head.total:
            raise FrameError(f"stream carried {self._received} bytes, the tensors need {self.head.total}")


def decode(messages: Iterable[bytes]) -> Decoded:
    """Reassembles the tensors of a stream of serialized Frames; raises FrameError on any
    inconsistency."""
    stream = iter(messages)
    try:
        first = next(stream)
    except StopIteration:
        raise FrameError("empty stream: no head frame") from None
    assembly = Assembly(read_head(first))
    for message in stream:
        assembly.add(message)
    return assembly.finish()


def _layout(metas: Iterable[pb.TensorMeta]) -> tuple[TensorSpec, ...]:
    layout = []
    seen: set[tuple[str, str]] = set()
    for meta in metas:
        if not meta.name:
            raise FrameError("a tensor without a name")
        if (meta.table, meta.name) in seen:
            where = f" of embedding table {meta.table!r}" if meta.table else ""
            raise FrameError(f"tensor {meta.name!r}{where} appears twice")
        if meta.table and meta.state:
            raise FrameError(f"tensor {meta.name!r} of embedding table {meta.table!r} is marked state")
        seen.add((meta.table, meta.name))
        dtype = _FROM_WIRE.get(meta.dtype)
        if dtype is None:
            raise FrameError(f"tensor {meta.name!r}: unknown dtype {meta.dtype}")
        shape = tuple(int(d) for d in meta.shape)
        if any(d < 0 for d in shape):
            raise FrameError(f"tensor {meta.name!r}: negative dimension in shape {shape}")
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: a huge claimed shape cannot wrap
        layout.append(TensorSpec(meta.name, dtype, shape, nbytes, meta.state, meta.table))
    return tuple(layout)


def _fill(buffer: np.ndarray, payload: bytes | memoryview, filled: int) -> int:
    end = filled + len(payload)
    if end > len(buffer):
        raise FrameError(f"stream carried more than the {len(buffer)} bytes its tensors need")
    if payload:
        buffer[filled:end] = np.frombuffer(payload, dtype=np.uint8)
    return end
