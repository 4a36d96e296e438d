"""The standard gRPC health service (grpc.health.v1), as PS and worker serve it to the kubelet's probes.

Callers: ``ps/main.py`` (on the PS port) and ``worker/main.py`` (on ``--health_port``). SERVING from
the moment the process can do its work until it begins to stop.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def add_health(server: grpc.Server) -> health.HealthServicer:
    """Registers the health service on ``server``; call :func:`serving` once the server started."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


def serving(servicer: health.HealthServicer) -> None:
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
