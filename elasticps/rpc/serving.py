"""The PS process's gRPC server: asyncio underneath, so a waiting call holds no thread.

Callers: ``ps/main.py`` (one per PS process, PS and coordinator services and health on it) and the
tests' ``grpc_servers`` fixture. The server runs ``grpc.aio`` on an event loop of its own thread
and offers the blocking surface of ``grpc.Server`` (add handlers, bind, start, stop) to code that
is not async. Handlers are coroutines where they wait (long polls, streams being received) and
hand CPU-bound work (updates, encodings, the coordinator's decisions) to a pool of ``work_threads``
threads, the loop's default executor (``asyncio.to_thread``); a handler that is a plain function
runs in that pool too. A long poll or a half-sent stream is a coroutine, so hundreds of them cost
no thread and starve nothing; their number is bounded by ``rpc/limits.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent import futures
from typing import Any, TypeAlias, TypeVar

import grpc
from grpc import aio

from elasticps import identity
from elasticps.rpc import guard
from elasticps.rpc.channels import server_options

T = TypeVar("T")
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

WORK_THREADS = 32


class AsyncServer:
    def __init__(self, work_threads: int = WORK_THREADS, verifier: identity.Verifier | None = None) -> None:
        """``verifier``: the job's key; every call to the job's services must then carry a token it
        made (``rpc/guard.py``). None: every caller is taken."""
        if work_threads < 1:
            raise ValueError(f"work_threads must be >= 1, got {work_threads}")
        self._verifier = verifier
        self._pool = futures.ThreadPoolExecutor(max_workers=work_threads, thread_name_prefix="rpc-work")
        self._loop = asyncio.new_event_loop()
        self._loop.set_default_executor(self._pool)
        self._thread = threading.Thread(target=self._run, name="rpc-loop", daemon=True)
        self._thread.start()
        self._server = self._on_loop(self._create)
        self._started = False
        self._stopping: threading.Event | None = None
        self._stop_lock = threading.Lock()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _create(self) -> aio.Server:
        return aio.server(migration_thread_pool=self._pool, options=server_options())

    def _on_loop(self, call: Callable[[], T]) -> T:
        async def run() -> T:
            return call()

        return self.run(run())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs ``coroutine`` on the server's loop and returns its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler[Any, Any]]) -> None:
        self._on_loop(lambda: self._server.add_generic_rpc_handlers(handlers))

    def add_service(self, service: str, handlers: dict[str, Handler]) -> None:
        """The methods of ``service`` (its full name), each behind the job's identity check when the
        server has the job's key (``rpc/guard.py``)."""
        guarded = guard.guarded(service, handlers, self._verifier)
        self.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, guarded),))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        register = self._server.add_registered_method_handlers  # type: ignore[attr-defined]  # not in the stubs
        self._on_loop(lambda: register(service, handlers))

    def add_insecure_port(self, address: str) -> int:
        return self._on_loop(lambda: self._server.add_insecure_port(address))

    def start(self) -> None:
        self.run(self._server.start())
        self._started = True

    def stop(self, grace: float | None) -> threading.Event:
        """Stops serving: new calls are refused at once, calls in flight get ``grace`` seconds
        (None: none) and are cancelled after. The event is set once the server, its loop and its
        threads are gone."""
        with self._stop_lock:
            if self._stopping is not None:
                return self._stopping
            stopped = self._stopping = threading.Event()

        async def stop() -> None:
            if self._started:
                await self._server.stop(grace)

        def finished() -> None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._pool.shutdown(wait=False, cancel_futures=True)
            stopped.set()

        done = asyncio.run_coroutine_threadsafe(stop(), self._loop)
        done.add_done_callback(lambda _: threading.Thread(target=finished, name="rpc-stop", daemon=True).start())
        return stopped
