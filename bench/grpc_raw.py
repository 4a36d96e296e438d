"""The gRPC floor: the PS's call shapes carrying raw bytes, without protobuf, frames or a store.

A reference between raw TCP and the PS: what grpcio's Python message path costs by itself. Push is a
client stream of ``chunk_bytes`` byte strings (identity serializers) that the server copies into a
buffer it keeps; pull is a server stream of that buffer in ``chunk_bytes`` pieces that the client
copies into its preallocated buffer. Same channel and server options as the PS
(``elasticps.rpc.channels``). Server: ``python -m bench.grpc_raw PORT_FILE``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np

from elasticps.files import write_atomically
from elasticps.rpc.channels import bind, create_channel, create_server
from elasticps.rpc.frames import CHUNK_BYTES

_SERVICE = "bench.RawBytes"


def _identity(data: bytes) -> bytes:
    return data


def _chunks(buffer: np.ndarray, chunk_bytes: int) -> Iterator[bytes]:
    view = buffer.data.cast("B")
    for offset in range(0, len(view), chunk_bytes):
        yield bytes(view[offset : offset + chunk_bytes])


def serve(port_file: str) -> None:
    held = np.empty(0, dtype=np.uint8)
    chunk_bytes = CHUNK_BYTES

    def push(chunks: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        nonlocal held, chunk_bytes
        header = next(chunks)
        size, chunk_bytes = int.from_bytes(header[:8], "little"), int.from_bytes(header[8:16], "little")
        if len(held) != size:
            held = np.empty(size, dtype=np.uint8)
        filled = 0
        for chunk in chunks:
            held[filled : filled + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
            filled += len(chunk)
        return b""

    def pull(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from _chunks(held, chunk_bytes)

    handler = grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            "Push": grpc.stream_unary_rpc_method_handler(push, _identity, _identity),
            "Pull": grpc.unary_stream_rpc_method_handler(pull, _identity, _identity),
        },
    )
    server = create_server(4)
    server.add_generic_rpc_handlers((handler,))
    port = bind(server, "127.0.0.1", 0)
    server.start()
    write_atomically(Path(port_file), f"{port}\n")
    threading.Event().wait()


class RawClient:
    def __init__(self, port: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._channel = create_channel(f"127.0.0.1:{port}")
        self._push = self._channel.stream_unary(f"/{_SERVICE}/Push", _identity, _identity)
        self._pull = self._channel.unary_stream(f"/{_SERVICE}/Pull", _identity, _identity)
        self._chunk_bytes = chunk_bytes
        self._out = np.empty(0, dtype=np.uint8)
        self._in = np.empty(0, dtype=np.uint8)

    def prepare(self, size: int) -> None:
        self._out = np.full(size, 7, dtype=np.uint8)
        self._in = np.zeros(size, dtype=np.uint8)

    def round_trip(self) -> None:
        header = len(self._out).to_bytes(8, "little") + self._chunk_bytes.to_bytes(8, "little")

        def requests() -> Iterator[bytes]:
            yield header
            yield from _chunks(self._out, self._chunk_bytes)

        self._push(requests(), timeout=120)
        filled = 0
        for chunk in self._pull(b"", timeout=120):
            self._in[filled : filled + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
            filled += len(chunk)
        if filled != len(self._out):
            raise RuntimeError(f"pulled {filled} bytes, pushed {len(self._out)}")

    def close(self) -> None:
        self._channel.close()


if __name__ == "__main__":
    serve(sys.argv[1])
