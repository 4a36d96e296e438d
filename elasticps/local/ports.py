"""Free ports on the loopback, for processes started on one machine (the local runner's
decentralized workers, tests, the peer benchmark). Imports nothing else of elasticps."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """``count`` ports free now on the loopback (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()
