"""Shared fixtures: real in-process gRPC servers on 127.0.0.1, stopped after the test.

Test files do not import this module (tests/e2e has a conftest.py of its own, and both would be
``conftest``): they use the fixtures.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from elasticps.rpc.channels import bind, create_server

# Adds a test's servicers to a server, e.g. lambda s: add_XServicer_to_server(servicer, s).
Register = Callable[[grpc.Server], None]


@pytest.fixture
def grpc_servers() -> Iterator[Callable[..., int]]:
    """``port = grpc_servers(register, port=0)`` starts a server with the project's options on
    127.0.0.1 (port 0: a free one) and returns its port; every server is stopped at teardown.
    Callable from any thread."""
    started: list[grpc.Server] = []
    lock = threading.Lock()

    def start(register: Register, port: int = 0) -> int:
        server = create_server(8)
        register(server)
        bound = bind(server, "127.0.0.1", port)
        server.start()
        with lock:
            started.append(server)
        return bound

    yield start
    with lock:
        servers = list(started)
    for server in servers:
        server.stop(grace=None).wait()
