"""A stream's head, judged against the shard's model before its payload (``ps/intake.py``)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.intake import MIN_HEADROOM_BYTES, admit_model, admit_push, stream_cap
from elasticps.ps.layout import Layout
from elasticps.rpc import frames
from elasticps.rpc.receiving import Refused

MODEL = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
STATE = {"bn/mean": np.zeros(3, np.float32)}
LAYOUT = Layout.of(MODEL, STATE, adopts_state=False)


def head(kind: str, tensors: list[tuple[str, int, list[int], bool]]) -> frames.Head:
    first = pb.Frame(push=pb.PushHead(worker="w")) if kind == "push" else pb.Frame(model=pb.ModelHead(initialized=True))
    for name, dtype, shape, state in tensors:
        first.tensors.add(name=name, dtype=dtype, shape=shape, state=state)  # type: ignore[arg-type]
    return frames.read_head(first.SerializeToString())


F32, F64 = pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT64
GOOD = [("w", F32, [4, 3], False), ("b", F32, [3], False), ("bn/mean", F32, [3], True)]


def refusal(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(Refused) as refused:
        call()  # type: ignore[operator]
    return refused.value.code, refused.value.message


def test_the_cap_is_the_models_bytes_and_headroom() -> None:
    assert LAYOUT.nbytes == 18 * 4
    assert stream_cap(LAYOUT) == 18 * 4 + MIN_HEADROOM_BYTES
    big = Layout({}, {}, False, 1 << 30)
    assert stream_cap(big) == (1 << 30) + (1 << 28)


def test_a_good_push_head_is_admitted() -> None:
    admit_push(head("push", GOOD), LAYOUT, 0)
    admit_push(head("push", GOOD[:2]), LAYOUT, 0)  # state is optional


@pytest.mark.parametrize(
    ("tensors", "code", "words"),
    [
        ([("nope", F32, [1 << 26], False)], grpc.StatusCode.INVALID_ARGUMENT, "'nope' is not a variable of PS shard 3"),
        ([("w", F64, [4, 3], False)], grpc.StatusCode.INVALID_ARGUMENT, "variable 'w' is float64[4, 3] in the push"),
        ([("w", F32, [3, 4], False)], grpc.StatusCode.INVALID_ARGUMENT, "float32[3, 4] in the push, float32[4, 3]"),
        ([("bn/var", F32, [3], True)], grpc.StatusCode.INVALID_ARGUMENT, "'bn/var' is not a state tensor"),
    ],
)
def test_a_push_head_that_cannot_be_taken_is_refused_naming_why(
    tensors: list[tuple[str, int, list[int], bool]], code: grpc.StatusCode, words: str
) -> None:
    got, message = refusal(lambda: admit_push(head("push", tensors), LAYOUT, 3))
    assert got is code and words in message


def test_a_push_to_a_shard_without_a_model_or_without_a_push_head_is_refused() -> None:
    assert refusal(lambda: admit_push(head("push", GOOD), None, 1))[0] is grpc.StatusCode.FAILED_PRECONDITION
    assert refusal(lambda: admit_push(head("model", GOOD), LAYOUT, 1))[0] is grpc.StatusCode.INVALID_ARGUMENT


def test_a_table_that_adopts_state_takes_new_state_within_the_cap() -> None:
    adopting = Layout.of(MODEL, {}, adopts_state=True)
    admit_push(head("push", GOOD), adopting, 0)
    code, message = refusal(lambda: admit_push(head("push", [*GOOD[:2], ("big", F32, [1 << 24], True)]), adopting, 0))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and f"more than the {stream_cap(adopting)}" in message


def test_a_model_head_is_bounded_by_the_flag_then_by_the_held_model() -> None:
    admit_model(head("model", GOOD), None, 0, max_model_bytes=72)
    code, message = refusal(lambda: admit_model(head("model", GOOD), None, 0, max_model_bytes=71))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "--max_model_bytes=71" in message
    admit_model(head("model", [("other", F32, [1000], False)]), LAYOUT, 0, max_model_bytes=1)  # the store compares
    code, _ = refusal(lambda: admit_model(head("model", [("x", F32, [1 << 24], False)]), LAYOUT, 0, max_model_bytes=1))
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert refusal(lambda: admit_model(head("push", GOOD), None, 0, 1 << 30))[0] is grpc.StatusCode.INVALID_ARGUMENT
