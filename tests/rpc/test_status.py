"""Failure classification by status code, and retrying transient failures until a deadline."""

from __future__ import annotations

import logging

import grpc
import pytest

from elasticps.rpc.status import Failure, backoff_delays, classify, retrying


class FakeRpcError(grpc.RpcError, grpc.Call):
    """A failed call as gRPC raises it: an RpcError that is also a Call (a test double for a value)."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> None:
        return None

    def trailing_metadata(self) -> None:
        return None

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


C = grpc.StatusCode
TABLE = {
    C.UNAVAILABLE: Failure.TRANSIENT,
    C.DEADLINE_EXCEEDED: Failure.TRANSIENT,
    C.RESOURCE_EXHAUSTED: Failure.TRANSIENT,
    C.ABORTED: Failure.TRANSIENT,
    C.CANCELLED: Failure.TRANSIENT,
    C.FAILED_PRECONDITION: Failure.UNINITIALIZED,
    C.INVALID_ARGUMENT: Failure.PERMANENT,
    C.NOT_FOUND: Failure.PERMANENT,
    C.ALREADY_EXISTS: Failure.PERMANENT,
    C.PERMISSION_DENIED: Failure.PERMANENT,
    C.UNAUTHENTICATED: Failure.PERMANENT,
    C.UNIMPLEMENTED: Failure.PERMANENT,
    C.INTERNAL: Failure.PERMANENT,
    C.UNKNOWN: Failure.PERMANENT,
    C.DATA_LOSS: Failure.PERMANENT,
    C.OUT_OF_RANGE: Failure.PERMANENT,
    C.OK: Failure.PERMANENT,
}


def test_table_covers_every_status_code() -> None:
    assert set(TABLE) == set(grpc.StatusCode)


@pytest.mark.parametrize("code", list(TABLE), ids=lambda c: c.name)
def test_classify(code: grpc.StatusCode) -> None:
    assert classify(code) is TABLE[code]


def test_backoff_delays_double_up_to_the_cap() -> None:
    delays = backoff_delays(initial=0.1, maximum=1.0, factor=2.0)
    got = [next(delays) for _ in range(7)]
    assert got == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_retries_unavailable_then_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    time = FakeTime()
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= 3:
            raise FakeRpcError(C.UNAVAILABLE, "connection refused")
        return "ok"

    with caplog.at_level(logging.DEBUG, logger="elasticps.rpc.status"):
        assert retrying(call, what="PullDense", deadline_s=60.0, sleep=time.sleep, clock=time.clock) == "ok"
    assert len(calls) == 4
    assert time.sleeps == pytest.approx([0.1, 0.2, 0.4])
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    # A peer still starting is routine: at debug level only, so a healthy job's log stays quiet.
    assert said == [(logging.DEBUG, f"PullDense: UNAVAILABLE, retrying (attempt {n})") for n in (1, 2, 3)]


def test_a_retry_that_lasts_is_said_at_info_every_tenth_attempt(caplog: pytest.LogCaptureFixture) -> None:
    time = FakeTime()
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= 25:
            raise FakeRpcError(C.UNAVAILABLE, "connection refused")
        return "ok"

    with caplog.at_level(logging.INFO, logger="elasticps.rpc.status"):
        assert retrying(call, what="PullDense", deadline_s=600.0, sleep=time.sleep, clock=time.clock) == "ok"
    assert [r.getMessage() for r in caplog.records] == [
        "PullDense: UNAVAILABLE, retrying (attempt 10)", "PullDense: UNAVAILABLE, retrying (attempt 20)"
    ]


def test_retries_every_transient_code() -> None:
    time = FakeTime()
    codes = [C.DEADLINE_EXCEEDED, C.RESOURCE_EXHAUSTED, C.ABORTED, C.CANCELLED, C.UNAVAILABLE]
    remaining = list(codes)

    def call() -> int:
        if remaining:
            raise FakeRpcError(remaining.pop(0))
        return 42

    assert retrying(call, what="x", deadline_s=60.0, sleep=time.sleep, clock=time.clock) == 42
    assert len(time.sleeps) == len(codes)


def test_gives_up_after_the_deadline_re_raising_the_last_error() -> None:
    time = FakeTime()
    start = time.now
    errors: list[FakeRpcError] = []

    def call() -> None:
        errors.append(FakeRpcError(C.UNAVAILABLE, f"attempt {len(errors)}"))
        raise errors[-1]

    with pytest.raises(FakeRpcError) as raised:
        retrying(call, what="PushGradients", deadline_s=5.0, sleep=time.sleep, clock=time.clock)
    assert raised.value is errors[-1]
    assert raised.value.code() is C.UNAVAILABLE
    # It slept until the deadline (the last sleep cut short to end exactly there), then one last try.
    assert time.now == pytest.approx(start + 5.0)
    assert sum(time.sleeps) == pytest.approx(5.0)
    assert max(time.sleeps) <= 2.0  # backoff is capped
    assert time.sleeps[:5] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert len(errors) == len(time.sleeps) + 1


def test_zero_deadline_tries_once() -> None:
    time = FakeTime()
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise FakeRpcError(C.UNAVAILABLE)

    with pytest.raises(FakeRpcError):
        retrying(call, what="x", deadline_s=0.0, sleep=time.sleep, clock=time.clock)
    assert calls == [1]
    assert time.sleeps == []


@pytest.mark.parametrize("code", [C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.INTERNAL, C.UNKNOWN])
def test_does_not_retry_non_transient_codes(code: grpc.StatusCode) -> None:
    time = FakeTime()
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise FakeRpcError(code, "bad tensor")

    with pytest.raises(FakeRpcError) as raised:
        retrying(call, what="x", deadline_s=60.0, sleep=time.sleep, clock=time.clock)
    assert raised.value.code() is code
    assert calls == [1]
    assert time.sleeps == []


def test_an_rpc_error_that_is_not_a_call_is_not_retried() -> None:
    time = FakeTime()
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise grpc.RpcError("no status code")

    with pytest.raises(grpc.RpcError):
        retrying(call, what="x", deadline_s=60.0, sleep=time.sleep, clock=time.clock)
    assert calls == [1]


def test_other_exceptions_propagate_at_once() -> None:
    time = FakeTime()

    def call() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        retrying(call, what="x", deadline_s=60.0, sleep=time.sleep, clock=time.clock)
    assert time.sleeps == []
