"""Job identity on gRPC: the servers' interceptor, and the clients' token on every call.

Callers: ``rpc/serving.py`` (every PS, coordinator and peer server takes :class:`Guard` when its
process has the job's key) and ``rpc/channels.py`` (every channel carries the process's token,
:func:`with_token`). What a token proves and who may call what is ``identity.py``'s; this module
only applies it:

* a call to a guarded service without a valid token is UNAUTHENTICATED, a member calling a method
  its kind may not call is PERMISSION_DENIED; either is refused before the request is read, so it
  changes nothing (the health service stays open: the kubelet's probes carry no token);
* a unary request that names a worker (:data:`CLAIMS`) is PERMISSION_DENIED when a worker names
  another; a stream's head names its worker inside the frames, so the servicer asks
  :func:`caller` (the interceptor's contextvar, which gRPC keeps for the handler's call) and
  checks it with ``identity.claim_refusal``.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, NamedTuple

import grpc
from grpc import aio

from elasticps import identity

# The member making the call being served (None: a server without identity, or an open method).
_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("elasticps_caller", default=None)

# Unary methods whose request names the calling worker: the field, and whether it holds an index.
CLAIMS: dict[str, tuple[str, bool]] = {
    "GetTask": ("worker", False),
    "ReportTask": ("worker", False),
    "Heartbeat": ("worker", False),
    "JoinRound": ("worker", False),
    "TakeTokens": ("worker", True),
    "Excuse": ("sender", True),
    "PullModel": ("worker", True),
}


def caller() -> str | None:
    """The member calling the method being served now, as its token named it."""
    return _CALLER.get()


def claimed_worker(value: object, index: bool) -> str:
    return identity.member_name(identity.WORKER, int(value)) if index else str(value)  # type: ignore[call-overload]


def _token(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == identity.METADATA_KEY:
            return value if isinstance(value, str) else bytes(value).decode("ascii", "replace")
    return None


class Guard(aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, verifier: identity.Verifier) -> None:
        self._verifier = verifier

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        service, _, method = details.method.lstrip("/").partition("/")
        if handler is None or service not in identity.GUARDED_SERVICES:
            return handler
        member = self._verifier.member(_token(details.invocation_metadata))
        problem = identity.refusal(member, method)
        if problem is not None:
            code = grpc.StatusCode.UNAUTHENTICATED if member is None else grpc.StatusCode.PERMISSION_DENIED
            return _refusing(handler, code, problem)
        _CALLER.set(member)
        claim = CLAIMS.get(method)
        return handler if claim is None else _claim_checked(handler, member, method, *claim)


class _Handler(NamedTuple):
    """An ``RpcMethodHandler`` (grpc's own is a namedtuple of these fields)."""

    request_streaming: bool
    response_streaming: bool
    request_deserializer: Any
    response_serializer: Any
    unary_unary: Any
    unary_stream: Any
    stream_unary: Any
    stream_stream: Any


def _kind(handler: grpc.RpcMethodHandler[Any, Any]) -> str:
    return f"{'stream' if handler.request_streaming else 'unary'}_{'stream' if handler.response_streaming else 'unary'}"


def _replaced(handler: grpc.RpcMethodHandler[Any, Any], behavior: Any) -> grpc.RpcMethodHandler[Any, Any]:
    fields = {name: getattr(handler, name) for name in _Handler._fields}
    fields[_kind(handler)] = behavior
    return _Handler(**fields)  # type: ignore[return-value]


def _refusing(handler: grpc.RpcMethodHandler[Any, Any], code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler[Any, Any]:
    if handler.response_streaming:
        async def refuse_stream(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            await context.abort(code, message)
            yield  # never reached: makes this an async generator, as a streaming reply's behavior is

        return _replaced(handler, refuse_stream)

    async def refuse(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    return _replaced(handler, refuse)


def _claim_checked(handler: grpc.RpcMethodHandler[Any, Any], member: str | None, method: str, field: str,
                   index: bool) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with its behavior preceded by the check that ``request.<field>`` names the caller."""
    behavior = getattr(handler, _kind(handler))

    def problem(request: Any) -> str | None:
        return identity.claim_refusal(member, claimed_worker(getattr(request, field), index), f"{method}: {field}")

    if inspect.isasyncgenfunction(behavior):
        async def checked_stream(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            if (why := problem(request)) is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
            async for reply in behavior(request, context):
                yield reply

        return _replaced(handler, checked_stream)
    if inspect.iscoroutinefunction(behavior):
        async def checked_async(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            if (why := problem(request)) is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
            return await behavior(request, context)

        return _replaced(handler, checked_async)

    def checked(request: Any, context: Any) -> Any:  # a plain function: run in the server's pool
        if (why := problem(request)) is not None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        return behavior(request, context)

    return _replaced(handler, checked)


# ---- the clients' side ---------------------------------------------------------------------------------
class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _Token(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds the member's token to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._pair = (identity.METADATA_KEY, token)

    def _details(self, details: Any) -> _Details:
        metadata = [*(details.metadata or ()), self._pair]
        return _Details(details.method, details.timeout, metadata, details.credentials,
                        getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Iterator[Any]) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Iterator[Any]) -> Any:
        return continuation(self._details(details), requests)


def with_token(channel: grpc.Channel, token: str) -> grpc.Channel:
    """``channel`` with ``token`` on every call (itself when the token is empty)."""
    return grpc.intercept_channel(channel, _Token(token)) if token else channel
