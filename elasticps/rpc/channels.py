"""gRPC channels and servers with the project's message limits and keep-alives, in one place.

Callers: the PS server (``server_options``, through ``rpc/serving.py``), a worker's health server
(``create_server``), the PS client and the coordinator client (``create_channel``). Tensors travel
in ~1 MB frames; a client takes replies of up to 256 MiB so a big unary reply never fails with
RESOURCE_EXHAUSTED at gRPC's 4 MiB default, a server requests of up to :data:`MAX_REQUEST_BYTES`.
"""

from __future__ import annotations

from concurrent import futures
from typing import Protocol

import grpc

from elasticps import identity
from elasticps.rpc import guard

MAX_MESSAGE_BYTES = 256 * 1024 * 1024

_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A dead peer is noticed within ~30 s even when no call is in flight.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]


def create_channel(address: str, token: str | None = None) -> grpc.Channel:
    """A channel whose every call carries ``token`` (None: this process's as it is at each call,
    ``identity.token_source``; "": none), the proof that the caller belongs to the job
    (``rpc/guard.py``)."""
    source = identity.token_source() if token is None else token
    return guard.with_token(grpc.insecure_channel(address, options=_OPTIONS), source)


# The most a server takes in one message. What a call legitimately carries is far less: a stream's
# frames hold a chunk (1 MiB by default) or a head (tensor metadata), an embedding pull its ids,
# every other request a few kilobytes. gRPC refuses a longer message from its length prefix, before
# buffering it, so a stranger's 200 MB garbage call costs the server nothing (256 MiB let eight such
# calls leave a PS at 1.9 GB).
MAX_REQUEST_BYTES = 32 * 1024 * 1024


def server_options() -> list[tuple[str, int]]:
    """The options of every server: the keep-alives above, requests of at most
    :data:`MAX_REQUEST_BYTES`, and no shared port."""
    return [option for option in _OPTIONS if option[0] != "grpc.max_receive_message_length"] + [
        ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        # Two PS processes must never share a port by accident (gRPC's default allows it).
        ("grpc.so_reuseport", 0),
        # A fixed receive window of 4 MiB a stream. gRPC's default grows it by probing the link
        # (BDP), and bytes a refused message's sender had in flight then pile up in the server:
        # eight 200 MB calls refused while 512 bulk connections were open left a PS 40-90 MB
        # larger, 0-4 MB with the fixed window. Requests of 1-64 MB move as fast either way.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 4 * 1024 * 1024),
    ]


def create_server(max_workers: int) -> grpc.Server:
    """A thread-pool server without a port yet (a worker's health port; the PS serves from
    ``rpc/serving.py``'s asyncio server): the caller adds services, then binds (port 0 in tests)."""
    return grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=server_options())


class Bindable(Protocol):
    def add_insecure_port(self, address: str) -> int: ...


def bind(server: Bindable, host: str, port: int) -> int:
    """Binds ``host:port`` (port 0 picks a free one) and returns the bound port."""
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    return bound
