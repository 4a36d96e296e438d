"""What one PS process takes at once, and for how long: the limits that keep a job from starving its PS.

Callers: ``ps/main.py`` (from its flags), the PS servicer and the coordinator servicer. Waiting
calls hold no thread (``rpc/serving.py``), so the limits bound memory and bookkeeping, not threads,
and are sized so that a legitimate job never meets them: a sync job of 128 workers has at most
~2 x 128 push streams (``PushModel`` at start, then one ``PushGradients`` per worker per round)
and 2 x 128 long polls (a pull and a join per worker) on PS 0; an async job of 32, far fewer.
A call past a limit is answered RESOURCE_EXHAUSTED at once, naming the limit and its flag; the
clients retry it with backoff (``rpc/status.py``).

* ``max_push_streams``: ``PushGradients`` and ``PushModel`` streams being received at once.
* ``max_long_polls``: pulls (``PullDense`` with ``wait_ms``) and joins (``JoinRound``) waiting at
  once, per servicer.
* ``stream_idle_s``: a push stream that sends no frame for this long is ended DEADLINE_EXCEEDED,
  its buffer freed and the model unchanged; ``stream_deadline_s`` bounds a whole stream the same
  way (a peer that sends a byte now and then).
* ``max_model_bytes``: the most tensor bytes a ``PushModel`` may declare while the shard holds no
  model; once it holds one, a stream's bytes are bounded by the model's (``ps/intake.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

GIB = 1 << 30


@dataclass(frozen=True)
class ServerLimits:
    max_push_streams: int = 512
    max_long_polls: int = 4096
    stream_idle_s: float = 30.0
    stream_deadline_s: float = 300.0
    max_model_bytes: int = 16 * GIB

    def __post_init__(self) -> None:
        for name in ("max_push_streams", "max_long_polls", "stream_idle_s", "stream_deadline_s", "max_model_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


class Slots:
    """At most ``limit`` calls of one kind at once. Taken and given back on the server's event loop
    only (no lock): :meth:`taking` answers RESOURCE_EXHAUSTED when none is free."""

    def __init__(self, what: str, limit: int, flag: str) -> None:
        self.what = what
        self.limit = limit
        self.flag = flag
        self.in_use = 0

    @contextlib.asynccontextmanager
    async def taking(self, context: aio.ServicerContext[Any, Any], method: str) -> AsyncIterator[None]:
        if self.in_use >= self.limit:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{method}: {self.in_use} {self.what} at once already, the most this PS takes "
                f"({self.flag}={self.limit}); retry later",
            )
        self.in_use += 1
        try:
            yield
        finally:
            self.in_use -= 1
