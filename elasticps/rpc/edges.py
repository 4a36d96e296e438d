"""Requests whose bytes do not parse: answered INVALID_ARGUMENT, logged as one rate-limited line.

Callers: the PS servicer's and the coordinator servicer's ``add_to_server``, for every method whose
request is a protobuf message. gRPC's own deserialization logs a full traceback for every request
that fails to parse ("Exception deserializing message!") and answers INTERNAL; a peer sending
garbage in a loop would fill the log. :func:`lenient` wraps the message's parser: a request that
does not parse becomes an :class:`Undecodable` instead of an exception (gRPC logs nothing), and
:func:`refusing` wraps the method so that such a request is answered INVALID_ARGUMENT before the
method sees it. The log line is written at most once per :data:`LOG_EVERY_S` per method, with the
number of undecodable requests left unlogged since the previous line.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class Undecodable:
    """What a request that did not parse becomes (instead of gRPC's traceback)."""

    method: str
    error: str


class RateLimitedLog:
    """One warning per ``every_s`` seconds per key; the lines held back are counted in the next."""

    def __init__(self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, key: str, message: str) -> bool:
        """Logs ``message`` unless ``key`` was logged within ``every_s``; True when logged."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._every_s:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
        suffix = f" ({held} more since the last such line)" if held else ""
        log.warning("%s%s", message, suffix)
        return True


UNDECODABLE_LOG = RateLimitedLog()


def lenient(parse: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    """``parse`` (a message's ``FromString``), returning :class:`Undecodable` when the bytes do not parse."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as err:
            return Undecodable(method, str(err) or type(err).__name__)

    return deserialize


def refusing(behaviour: Callable[[Any, Any], Any], method: str) -> Callable[[Any, Any], Any]:
    """``behaviour`` behind a check: an :class:`Undecodable` request is answered INVALID_ARGUMENT.

    ``behaviour`` may be a plain function, a coroutine function or an async generator function
    (an asyncio server's handlers); the guard is of the same kind, as gRPC tells them apart."""
    if inspect.isasyncgenfunction(behaviour):

        async def guarded_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _refuse(method, request))
            async for reply in behaviour(request, context):
                yield reply

        return guarded_stream
    if inspect.iscoroutinefunction(behaviour):

        async def guarded_async(request: Any, context: Any) -> Any:
            if isinstance(request, Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _refuse(method, request))
            return await behaviour(request, context)

        return guarded_async

    def guarded(request: Any, context: Any) -> Any:
        if isinstance(request, Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _refuse(method, request))
        return behaviour(request, context)

    return guarded


def _refuse(method: str, request: Undecodable) -> str:
    UNDECODABLE_LOG.warn(method, f"{method}: a request that is not a valid message ({request.error})")
    return f"{method}: the request is not a valid message"


def unary_unary(
    behaviour: Callable[[Any, Any], Any], method: str, parse: Callable[[bytes], Any],
    serialize: Callable[[Any], bytes] | None,
) -> grpc.RpcMethodHandler[Any, Any]:  # fmt: skip
    return grpc.unary_unary_rpc_method_handler(
        refusing(behaviour, method), request_deserializer=lenient(parse, method), response_serializer=serialize
    )


def unary_stream(
    behaviour: Callable[[Any, Any], Any], method: str, parse: Callable[[bytes], Any],
    serialize: Callable[[Any], bytes] | None,
) -> grpc.RpcMethodHandler[Any, Any]:  # fmt: skip
    return grpc.unary_stream_rpc_method_handler(
        refusing(behaviour, method), request_deserializer=lenient(parse, method), response_serializer=serialize
    )
