"""How a caller reacts to a failed gRPC call, decided by status code alone (never by message text).

Callers: the PS client and the coordinator client. ``classify`` is the one table; ``retrying``
retries the transient failures with capped exponential backoff until a deadline, which is also how
a worker that starts before its PS waits for it instead of failing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from enum import Enum
from typing import TypeVar

import grpc

T = TypeVar("T")

log = logging.getLogger(__name__)


class Failure(str, Enum):
    TRANSIENT = "transient"  # the peer is starting, restarting or overloaded: retry
    UNINITIALIZED = "uninitialized"  # the PS lost its model (restarted without checkpoint): re-push it
    PERMANENT = "permanent"  # the request is wrong or the peer is broken: retrying cannot help


_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.CANCELLED,
}


def classify(code: grpc.StatusCode) -> Failure:
    if code in _TRANSIENT:
        return Failure.TRANSIENT
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return Failure.UNINITIALIZED
    return Failure.PERMANENT


def backoff_delays(initial: float = 0.1, maximum: float = 2.0, factor: float = 2.0) -> Iterator[float]:
    delay = initial
    while True:
        yield delay
        delay = min(maximum, delay * factor)


def retrying(
    call: Callable[[], T],
    *,
    what: str,
    deadline_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Runs ``call``, retrying transient gRPC failures until ``deadline_s`` seconds have passed.

    Other failures, and the last transient one past the deadline, propagate as ``grpc.RpcError``.
    """
    give_up_at = clock() + deadline_s
    delays = backoff_delays()
    attempt = 0
    while True:
        try:
            return call()
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
            if classify(code) is not Failure.TRANSIENT or clock() >= give_up_at:
                raise
            attempt += 1
            delay = min(next(delays), max(0.0, give_up_at - clock()))
            # A peer still starting (the PS while the workers come up) is routine: said only once it
            # lasts (every tenth attempt: 11 s on, then every 20 s), so a healthy job's log carries no noise.
            level = logging.INFO if attempt % 10 == 0 else logging.DEBUG
            log.log(level, "%s: %s, retrying (attempt %d)", what, code.name, attempt)
            sleep(delay)
