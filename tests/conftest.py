"""Shared fixtures: real in-process gRPC servers on 127.0.0.1, stopped after the test; a real
S3-compatible server (moto's) on loopback, with a new bucket per test.

Test files do not import this module (tests/e2e has a conftest.py of its own, and both would be
``conftest``): they use the fixtures.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elasticps import storage
from elasticps.data import index_cache
from elasticps.identity import Verifier
from elasticps.rpc.channels import bind
from elasticps.rpc.serving import AsyncServer

ROOT = Path(__file__).resolve().parents[1]

# TensorFlow and torch each carry LLVM; in one process the second copy aborts it ("Option ...
# registered more than once"). The torch backend's own tests import torch's internals, so they run
# in a process of their own (tests/backends/test_torch_process.py), never beside the Keras tests.
TORCH_TESTS_ENV = "ELASTICPS_TORCH_TESTS"
collect_ignore = [] if os.environ.get(TORCH_TESTS_ENV) else ["backends/pytorch"]

# Adds a test's servicers to a server, e.g. lambda s: add_to_server(servicer, s).
Register = Callable[[AsyncServer], None]


@pytest.fixture
def grpc_servers() -> Iterator[Callable[..., int]]:
    """``port = grpc_servers(register, port=0, verifier=None)`` starts a server as the PS serves
    (asyncio, the project's options; with ``verifier``, the job's key: only the job's members are
    served) on 127.0.0.1 (port 0: a free one) and returns its port; every server is stopped at
    teardown. Callable from any thread."""
    started: list[AsyncServer] = []
    lock = threading.Lock()

    def start(register: Register, port: int = 0, verifier: Verifier | None = None) -> int:
        server = AsyncServer(8, verifier)
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


# ---- an S3-compatible server -------------------------------------------------------------------------
# moto runs from its own virtual environment (``hack/s3/moto.sh``, built on first use): it needs
# botocore, whose ``python-dateutil<3`` pin clashes with the kubernetes client in the project's one.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of moto's S3 server, a separate process on loopback (skips the test without it)."""
    built = subprocess.run(["bash", str(ROOT / "hack/s3/moto.sh")], capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        pytest.skip(f"no moto server (hack/s3/moto.sh failed: {built.stderr.strip()[-300:]})")
    port = _free_port()
    server = subprocess.Popen([built.stdout.strip(), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("moto server did not start")
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new bucket on the server, and the AWS environment a pod template (or a user's shell before
    ``elasticps run``) would set: processes the test starts inherit it."""
    for name, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    storage._s3.cache_clear()
    index_cache.forget()
    name = request.node.name.replace("_", "-").replace("[", "-").replace("]", "")[:50].strip("-").lower()
    urllib.request.urlopen(urllib.request.Request(f"{s3_endpoint}/{name}", method="PUT"), timeout=10).close()
    yield name
    storage._s3.cache_clear()
