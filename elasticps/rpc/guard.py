"""Job identity on gRPC: the servers' check of every call, and the clients' token on every call.

Callers: ``rpc/serving.py`` (``AsyncServer.add_service`` puts every method of the PS, coordinator
and peer services behind :func:`guarded` when the process has the job's key) and
``rpc/channels.py`` (every channel carries the process's token, :func:`with_token`). What a token
proves and who may call what is ``identity.py``'s; this module only applies it:

* a call to a guarded service without a valid token is UNAUTHENTICATED, a member calling a method
  its kind may not call is PERMISSION_DENIED; either is refused before the servicer sees it, so it
  changes nothing (the health service stays open: the kubelet's probes carry no token);
* a unary request that names a worker (:data:`CLAIMS`) is PERMISSION_DENIED when a worker names
  another; a stream's head names its worker inside the frames, so the servicer asks
  :func:`caller` (set for the call's task) and checks it with ``identity.claim_refusal``.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple, TypeAlias

import grpc
from grpc import aio

from elasticps import identity

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

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


def guarded(service: str, handlers: dict[str, Handler], verifier: identity.Verifier | None) -> dict[str, Handler]:
    """``handlers`` of ``service`` (its full name), each behind the job's identity check; as they
    are without a key or for a service that is not the job's (health)."""
    if verifier is None or service not in identity.GUARDED_SERVICES:
        return handlers
    return {method: _guarded(handler, verifier, method) for method, handler in handlers.items()}


def _guarded(handler: Handler, verifier: identity.Verifier, method: str) -> Handler:
    """``handler`` with its behavior preceded by the checks of the module doc. A behavior, not an
    ``aio.ServerInterceptor``: grpc's interceptor chain alone costs a unary call ~70 us here, the
    check a few."""
    behavior = getattr(handler, _kind(handler))
    claim = None if handler.request_streaming else CLAIMS.get(method)

    def refusal(request: Any, context: Any) -> tuple[str | None, tuple[grpc.StatusCode, str] | None]:
        member = verifier.member(_token(context.invocation_metadata()))
        problem = identity.refusal(member, method)
        if problem is not None:
            return member, (grpc.StatusCode.UNAUTHENTICATED if member is None else grpc.StatusCode.PERMISSION_DENIED, problem)
        if claim is not None:
            field, index = claim
            why = identity.claim_refusal(member, claimed_worker(getattr(request, field), index), f"{method}: {field}")
            if why is not None:
                return member, (grpc.StatusCode.PERMISSION_DENIED, why)
        return member, None

    if inspect.isasyncgenfunction(behavior):
        async def checked_stream(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            member, refused = refusal(request, context)
            if refused is not None:
                await context.abort(*refused)
            _CALLER.set(member)  # each call runs in a task, and so a context, of its own
            async for reply in behavior(request, context):
                yield reply

        return _replaced(handler, checked_stream)
    if inspect.iscoroutinefunction(behavior):
        async def checked_async(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            member, refused = refusal(request, context)
            if refused is not None:
                await context.abort(*refused)
            _CALLER.set(member)
            return await behavior(request, context)

        return _replaced(handler, checked_async)

    def checked(request: Any, context: Any) -> Any:  # a plain function: run in the server's pool
        member, refused = refusal(request, context)
        if refused is not None:
            context.abort(*refused)
        reset = _CALLER.set(member)  # the pool's thread keeps its context: put it back after
        try:
            return behavior(request, context)
        finally:
            _CALLER.reset(reset)

    return _replaced(handler, checked)


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


def _kind(handler: Handler) -> str:
    return f"{'stream' if handler.request_streaming else 'unary'}_{'stream' if handler.response_streaming else 'unary'}"


def _replaced(handler: Handler, behavior: Any) -> Handler:
    fields = {name: getattr(handler, name) for name in _Handler._fields}
    fields[_kind(handler)] = behavior
    return _Handler(**fields)  # type: ignore[return-value]


# ---- the clients' side ---------------------------------------------------------------------------------
Token: TypeAlias = "str | Callable[[], str]"  # a fixed token, or one asked for on every call (rotated)


class _WithToken:
    """A multi-callable whose every call carries the token in its metadata."""

    def __init__(self, inner: Any, token: Token) -> None:
        self._inner = inner
        self._token = token

    def _metadata(self, metadata: Any) -> tuple[tuple[str, str], ...]:
        token = self._token if isinstance(self._token, str) else self._token()
        return (*(metadata or ()), (identity.METADATA_KEY, token))

    def __call__(self, request: Any, timeout: float | None = None, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner(request, timeout=timeout, metadata=self._metadata(metadata), **kwargs)

    def with_call(self, request: Any, timeout: float | None = None, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner.with_call(request, timeout=timeout, metadata=self._metadata(metadata), **kwargs)

    def future(self, request: Any, timeout: float | None = None, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner.future(request, timeout=timeout, metadata=self._metadata(metadata), **kwargs)


class _TokenChannel(grpc.Channel):
    """A channel whose calls carry the member's token: a thin wrapper of its multi-callables (a
    client interceptor, grpc's own way, costs several times more per call)."""

    def __init__(self, channel: grpc.Channel, token: Token) -> None:
        self._channel = channel
        self._token = token

    def unary_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                    _registered_method: bool = False) -> Any:  # fmt: skip
        return _WithToken(self._channel.unary_unary(method, request_serializer, response_deserializer,
                                                    _registered_method=_registered_method), self._token)  # type: ignore[call-arg]

    def unary_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     _registered_method: bool = False) -> Any:  # fmt: skip
        return _WithToken(self._channel.unary_stream(method, request_serializer, response_deserializer,
                                                     _registered_method=_registered_method), self._token)  # type: ignore[call-arg]

    def stream_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     _registered_method: bool = False) -> Any:  # fmt: skip
        return _WithToken(self._channel.stream_unary(method, request_serializer, response_deserializer,
                                                     _registered_method=_registered_method), self._token)  # type: ignore[call-arg]

    def stream_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                      _registered_method: bool = False) -> Any:  # fmt: skip
        return _WithToken(self._channel.stream_stream(method, request_serializer, response_deserializer,
                                                      _registered_method=_registered_method), self._token)  # type: ignore[call-arg]

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self._channel.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        self._channel.unsubscribe(callback)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> _TokenChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def with_token(channel: grpc.Channel, token: Token) -> grpc.Channel:
    """``channel`` with ``token`` on every call (itself when the token is empty); a callable is
    asked on every call (a token file the operator rotates, ``identity.token_source``)."""
    return _TokenChannel(channel, token) if token else channel
