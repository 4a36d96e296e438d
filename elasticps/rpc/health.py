"""The standard gRPC health service (grpc.health.v1), as PS and worker serve it to the kubelet's probes.

Callers: ``ps/main.py`` (on the PS port, its asyncio server: :func:`add_async_health`, whose
``Watch`` streams wait on the loop and hold no thread) and ``worker/main.py`` (on ``--health_port``,
a thread-pool server: :func:`add_health`). SERVING from the moment the process can do its work until
it begins to stop.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # not in the stubs

from elasticps.rpc.serving import AsyncServer


def add_health(server: grpc.Server) -> health.HealthServicer:
    """Registers the health service on ``server``; call :func:`serving` once the server started."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


def serving(servicer: health.HealthServicer) -> None:
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)


class AsyncHealth:
    """The health service of an :class:`AsyncServer`, set from any thread."""

    def __init__(self, server: AsyncServer) -> None:
        self._server = server
        self._servicer = server.run(_make())
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)

    def serving(self) -> None:
        self._server.run(self._servicer.set("", health_pb2.HealthCheckResponse.SERVING))

    def enter_graceful_shutdown(self) -> None:
        self._server.run(self._servicer.enter_graceful_shutdown())


async def _make() -> Any:  # made on the server's loop, where its conditions live
    return health_aio.HealthServicer()


def add_async_health(server: AsyncServer) -> AsyncHealth:
    """Registers the health service on ``server``; call ``serving()`` once the server started."""
    return AsyncHealth(server)
