"""The PS's ceiling: raw loopback TCP moving a push and a pull, with the PS's SGD applied between.

One round trip: the client sends a 16-byte header (payload bytes, number of variables) and the
gradient bytes; the server reads them with ``recv_into`` into a buffer it keeps, views it as the
model's float32 variables (equal parts, as ``bench/run.py``'s model: no copy), applies
``w -= lr * g`` to its own variables in place as the PS does (a block of ``BLOCK_ELEMENTS`` at a
time: ``np.multiply`` into a preallocated block-sized temporary, then ``np.subtract`` with ``out=``;
nothing allocated per round trip, the temporary stays in the cache), and sends the whole model back
(the pull); the client reads it with ``recv_into``. What a PS push + pull costs at the least in two
Python processes: the bytes each way and the arithmetic, no framing, no checks.
Server: ``python -m bench.tcp_apply PORT_FILE``.
"""

from __future__ import annotations

import socket
import struct
import sys
from pathlib import Path

import numpy as np

from bench.tcp_echo import _configure, _recv_exactly
from elasticps.files import write_atomically
from elasticps.ps.optimizers import BLOCK_ELEMENTS

_HEADER = struct.Struct("<QQ")  # payload bytes, variables
LEARNING_RATE = 0.01
INITIAL = 0.5


class Receiver:
    """The server's model and buffers, reallocated only when the size or the layout changes."""

    def __init__(self) -> None:
        self.layout = (0, 0)
        self.gradients = np.empty(0, dtype=np.uint8)
        self.model = np.empty(0, dtype=np.float32)
        self.temporary = np.empty(0, dtype=np.float32)
        self.variables: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def prepare(self, size: int, count: int) -> None:
        if (size, count) == self.layout:
            return
        if count < 1 or size % (4 * count):
            raise ValueError(f"{size} bytes do not split into {count} float32 variables")
        self.layout = (size, count)
        self.gradients = np.empty(size, dtype=np.uint8)
        self.model = np.full(size // 4, INITIAL, dtype=np.float32)
        self.temporary = np.empty(min(size // 4 // count, BLOCK_ELEMENTS), dtype=np.float32)
        part = size // 4 // count
        grads = self.gradients.view(np.float32)
        self.variables = [
            (self.model[i * part : (i + 1) * part], grads[i * part : (i + 1) * part], self.temporary)
            for i in range(count)
        ]

    def apply(self) -> None:
        lr = np.float32(LEARNING_RATE)
        for weights, gradient, temporary in self.variables:
            for start in range(0, len(weights), BLOCK_ELEMENTS):
                w, g = weights[start : start + BLOCK_ELEMENTS], gradient[start : start + BLOCK_ELEMENTS]
                scaled = temporary[: len(w)]
                np.multiply(g, lr, out=scaled)
                np.subtract(w, scaled, out=w)


def serve(port_file: str) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    write_atomically(Path(port_file), f"{listener.getsockname()[1]}\n")
    conn, _ = listener.accept()
    _configure(conn)
    receiver = Receiver()
    header = bytearray(_HEADER.size)
    while True:
        try:
            _recv_exactly(conn, memoryview(header))
        except ConnectionError:
            return
        size, count = _HEADER.unpack(header)
        receiver.prepare(size, count)
        _recv_exactly(conn, memoryview(receiver.gradients).cast("B"))
        receiver.apply()
        conn.sendall(memoryview(receiver.model).cast("B"))


class ApplyClient:
    """Pushes float32 gradients of ``GRADIENT`` (set by :meth:`prepare`) and pulls the model back."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        _configure(self._sock)
        self._header = b""
        self._out = np.empty(0, dtype=np.float32)
        self._in = np.empty(0, dtype=np.float32)

    def prepare(self, size: int, count: int, gradient: float) -> None:
        """Allocates (and touches) the gradient and model buffers for ``size`` bytes, outside timing."""
        self._header = _HEADER.pack(size, count)
        self._out = np.full(size // 4, gradient, dtype=np.float32)
        self._in = np.zeros(size // 4, dtype=np.float32)

    def round_trip(self) -> None:
        self._sock.sendall(self._header)
        self._sock.sendall(memoryview(self._out).cast("B"))
        _recv_exactly(self._sock, memoryview(self._in).cast("B"))

    @property
    def model(self) -> np.ndarray:
        """The model pulled last."""
        return self._in

    def close(self) -> None:
        self._sock.close()


if __name__ == "__main__":
    serve(sys.argv[1])
