"""Tensors to and from streams of ``Frame`` messages: raw bytes + dtype + shape, in chunks.

Callers: the PS servicer and the PS client, for every push and pull. The first frame carries the head
and the metadata of all tensors; the raw bytes of all tensors, concatenated in metadata order, follow
as ``payload`` chunks of ``chunk_bytes``. Small tensors share a chunk (a small model is one message),
big ones span several (PERFORMANCE.md: 1-4 MB chunks on a stream move 5x more than one big message).
Decoding checks everything a peer could get wrong and raises :class:`FrameError`, which servers
answer with INVALID_ARGUMENT.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from elasticps.proto import elasticps_pb2 as pb

CHUNK_BYTES = 1 << 20

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
    """The first frame (its head fields) and the tensors a stream carried."""

    first: pb.Frame
    tensors: dict[str, np.ndarray]


def encode(
    head: pb.Frame, tensors: Mapping[str, np.ndarray], chunk_bytes: int = CHUNK_BYTES
) -> list[pb.Frame]:
    """The frames of one stream; ``head`` (a Frame with only its head set) becomes the first frame.

    The bytes of the arrays are read as they are at this call: under the async rules the caller may
    pass live arrays and accept a torn read (relaxed consistency, as the design allows).
    """
    first = pb.Frame()
    first.CopyFrom(head)
    views: list[memoryview] = []
    for name, array in tensors.items():
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        wire = _TO_WIRE.get(np.dtype(dtype))
        if wire is None:
            raise FrameError(f"tensor {name!r}: dtype {array.dtype} cannot travel")
        first.tensors.add(name=name, dtype=wire, shape=array.shape)
        contiguous = np.ascontiguousarray(array, dtype=dtype)
        views.append(contiguous.reshape(-1).view(np.uint8).data)
    frames = [first]
    pending: list[bytes] = []
    pending_bytes = 0
    current = first
    for view in views:
        offset = 0
        while offset < len(view):
            take = min(chunk_bytes - pending_bytes, len(view) - offset)
            pending.append(bytes(view[offset : offset + take]))
            pending_bytes += take
            offset += take
            if pending_bytes == chunk_bytes:
                current.payload = pending[0] if len(pending) == 1 else b"".join(pending)
                current = pb.Frame()
                frames.append(current)
                pending, pending_bytes = [], 0
    if pending:
        current.payload = pending[0] if len(pending) == 1 else b"".join(pending)
    elif current is not first:
        frames.pop()
    return frames


def decode(frames: Iterable[pb.Frame]) -> Decoded:
    """Reassembles the tensors of a stream; raises FrameError on any inconsistency."""
    stream = iter(frames)
    try:
        first = next(stream)
    except StopIteration:
        raise FrameError("empty stream: no head frame") from None
    layout = _layout(first.tensors)
    total = sum(nbytes for _, _, _, nbytes in layout)
    try:
        buffer = np.empty(total, dtype=np.uint8)
    except (MemoryError, ValueError):
        raise FrameError(f"the tensors claim {total} bytes, more than this process can hold") from None
    filled = _fill(buffer, first.payload, 0)
    for frame in stream:
        if frame.HasField("push") or frame.HasField("model") or len(frame.tensors):
            raise FrameError("a head or tensor metadata after the first frame")
        filled = _fill(buffer, frame.payload, filled)
    if filled != total:
        raise FrameError(f"stream carried {filled} bytes, the tensors need {total}")
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype, shape, nbytes in layout:
        try:
            tensors[name] = buffer[offset : offset + nbytes].view(dtype).reshape(shape)
        except ValueError:  # an empty tensor with absurd other dimensions
            raise FrameError(f"tensor {name!r}: shape {shape} cannot be held") from None
        offset += nbytes
    head = pb.Frame()
    head.CopyFrom(first)
    head.ClearField("payload")
    return Decoded(head, tensors)


def _layout(
    metas: Iterable[pb.TensorMeta],
) -> list[tuple[str, np.dtype[np.generic], tuple[int, ...], int]]:
    layout = []
    seen: set[str] = set()
    for meta in metas:
        if not meta.name:
            raise FrameError("a tensor without a name")
        if meta.name in seen:
            raise FrameError(f"tensor {meta.name!r} appears twice")
        seen.add(meta.name)
        dtype = _FROM_WIRE.get(meta.dtype)
        if dtype is None:
            raise FrameError(f"tensor {meta.name!r}: unknown dtype {meta.dtype}")
        shape = tuple(int(d) for d in meta.shape)
        if any(d < 0 for d in shape):
            raise FrameError(f"tensor {meta.name!r}: negative dimension in shape {shape}")
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: a huge claimed shape cannot wrap
        layout.append((meta.name, dtype, shape, nbytes))
    return layout


def _fill(buffer: np.ndarray, payload: bytes, filled: int) -> int:
    end = filled + len(payload)
    if end > len(buffer):
        raise FrameError(f"stream carried more than the {len(buffer)} bytes its tensors need")
    if payload:
        buffer[filled:end] = np.frombuffer(payload, dtype=np.uint8)
    return end
