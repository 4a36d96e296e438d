"""Receiving a tensor stream on an asyncio server: frame by frame, refused as early as it can be.

Callers: the PS servicer's ``PushGradients`` and ``PushModel``. The stream's head is parsed from its
first frame and handed to the caller's ``admit`` (names, sizes, the cap derived from the model;
``ps/intake.py``), which raises :class:`Refused` to end the call before a buffer is allocated;
each later frame is copied into the buffer as it arrives and a frame that does not fit ends the call
at once (INVALID_ARGUMENT, ``frames.FrameError``). A peer that stops sending is cut off: no frame
for ``stream_idle_s``, or a stream still open ``stream_deadline_s`` after it began, ends the call
DEADLINE_EXCEEDED (``rpc/limits.py``). A refused or cut-off stream leaves nothing behind: its
buffer goes with the call, and nothing of it reached the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable
from typing import Any

import grpc
import numpy as np
from grpc import aio

from elasticps.rpc import frames
from elasticps.rpc.limits import ServerLimits

Piece = Callable[[frames.TensorSpec, int, np.ndarray], None]  # see frames.Chunked


class Refused(Exception):
    """A stream's head is not taken: the call ends with ``code`` and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def receive(
    requests: AsyncIterable[bytes],
    context: aio.ServicerContext[Any, Any],
    method: str,
    limits: ServerLimits,
    admit: Callable[[frames.Head], None],
    drain: Callable[[frames.Head], Piece | None] = lambda _: None,
) -> frames.Decoded:
    """The stream's tensors, whole. ``drain(head)`` (asked once ``admit`` took the head) not None:
    the caller needs the head alone; the payload is received a piece at a time, checked for size
    as any other, shown to the function ``drain`` returned (which raises :class:`Refused` to end
    the call) and dropped, and the tensors come back empty."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + limits.stream_deadline_s
    reader = aiter(requests)

    async def next_frame() -> bytes | None:
        wait = min(limits.stream_idle_s, give_up_at - loop.time())
        try:
            async with asyncio.timeout(max(wait, 0.0)):  # no task per frame, unlike wait_for
                return await anext(reader)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            if wait < limits.stream_idle_s:
                why = f"the stream was still open after {limits.stream_deadline_s:g} s (--stream_deadline_seconds)"
            else:
                why = f"no frame for {limits.stream_idle_s:g} s (--stream_idle_seconds)"
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: {why}; nothing was applied")

    first = await next_frame()
    if first is None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: empty stream: no head frame")
    try:
        head = frames.read_head(first)
        admit(head)
        look = drain(head)
        if look is not None:
            pieces = frames.Chunked(head, look)
            while (message := await next_frame()) is not None:
                pieces.add(message)
            pieces.finish()
            return frames.Decoded(head.first, {})
        assembly = frames.Assembly(head)
        while (message := await next_frame()) is not None:
            assembly.add(message)
        return assembly.finish()
    except frames.FrameError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {err}")
    except Refused as err:
        await context.abort(err.code, err.message)
