"""The raw-TCP baseline: an echo server process and its client, with preallocated buffers.

One round trip: the client sends an 8-byte length and N bytes (``sendall``); the server reads them
with ``recv_into`` into a buffer it keeps, then sends the N bytes back; the client reads them with
``recv_into``. Nothing is allocated per round trip, so this is the practical limit of two Python
processes on loopback. Server: ``python -m bench.tcp_echo PORT_FILE``.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from pathlib import Path

from elasticps.files import write_atomically

_LENGTH = struct.Struct("<Q")


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def _configure(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def serve(port_file: str) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    write_atomically(Path(port_file), f"{listener.getsockname()[1]}\n")
    conn, _ = listener.accept()
    _configure(conn)
    buffer = bytearray(0)
    header = bytearray(_LENGTH.size)
    while True:
        try:
            _recv_exactly(conn, memoryview(header))
        except ConnectionError:
            return
        (size,) = _LENGTH.unpack(header)
        if size > len(buffer):
            buffer = bytearray(size)
        view = memoryview(buffer)[:size]
        _recv_exactly(conn, view)
        conn.sendall(view)


class EchoClient:
    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        _configure(self._sock)
        self._out = bytearray(0)
        self._in = bytearray(0)

    def prepare(self, size: int) -> None:
        """Allocates (and touches) the send and receive buffers for ``size`` bytes, outside timing."""
        self._out = bytearray(os.urandom(min(size, 1 << 16)) * (size // (1 << 16) + 1))[:size]
        self._in = bytearray(size)

    def round_trip(self) -> None:
        size = len(self._out)
        self._sock.sendall(_LENGTH.pack(size))
        self._sock.sendall(self._out)
        _recv_exactly(self._sock, memoryview(self._in))

    def close(self) -> None:
        self._sock.close()


if __name__ == "__main__":
    serve(sys.argv[1])
