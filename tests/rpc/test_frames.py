"""Tensors to frames and back: raw bytes + dtype + shape in chunks; malformed streams -> FrameError."""

from __future__ import annotations

import numpy as np
import pytest

from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import frames
from elasticps.rpc.frames import FrameError
from elasticps.rpc.frames import decode as decode_bytes
from elasticps.rpc.frames import encode as encode_bytes

CHUNK = 1000


def encode_frames(head: pb.Frame, tensors: dict[str, np.ndarray], chunk_bytes: int = frames.CHUNK_BYTES) -> list[pb.Frame]:
    """encode()'s messages as parsed by stock protobuf: proves the hand-written frames are valid."""
    return [pb.Frame.FromString(message) for message in encode_bytes(head, tensors, chunk_bytes)]


def decode_frames(stream: object) -> frames.Decoded:
    assert isinstance(stream, (list, type(iter([]))))
    return decode_bytes(frame.SerializeToString() for frame in stream)  # type: ignore[attr-defined]


def push_head(version: int = 3) -> pb.Frame:
    return pb.Frame(push=pb.PushHead(worker="worker-0", version=version, learning_rate=0.5))


def assert_tensors_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == np.dtype(value.dtype).newbyteorder("<"), name
        assert got[name].shape == value.shape, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def round_trip(tensors: dict[str, np.ndarray], chunk_bytes: int = CHUNK) -> tuple[list[pb.Frame], frames.Decoded]:
    encoded = encode_frames(push_head(), tensors, chunk_bytes)
    for frame in encoded:
        assert len(frame.payload) <= chunk_bytes
    # Only the first frame has a head and the metadata.
    assert encoded[0].HasField("push")
    assert all(not f.HasField("push") and not f.HasField("model") and not len(f.tensors) for f in encoded[1:])
    # No empty trailing frames.
    assert all(len(f.payload) > 0 for f in encoded[1:])
    return encoded, decode_frames(iter(encoded))


def mixed() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "i32": np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
        "i64": np.array([2**40, -(2**40), 7], dtype=np.int64),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 7), dtype=np.float32),
        "empty1d": np.zeros(0, dtype=np.int64),
    }


def test_round_trip_dtypes_and_shapes() -> None:
    tensors = mixed()
    encoded, decoded = round_trip(tensors)
    assert_tensors_equal(decoded.tensors, tensors)
    assert decoded.tensors["scalar"].shape == ()
    assert float(decoded.tensors["scalar"]) == 2.5
    assert decoded.first.push.worker == "worker-0"
    assert decoded.first.push.version == 3
    assert decoded.first.push.learning_rate == 0.5
    assert decoded.first.payload == b""
    total = sum(t.nbytes for t in tensors.values())
    assert sum(len(f.payload) for f in encoded) == total
    assert [m.name for m in encoded[0].tensors] == list(tensors)
    assert [list(m.shape) for m in encoded[0].tensors] == [list(t.shape) for t in tensors.values()]


def test_many_small_tensors_share_one_frame() -> None:
    tensors = {f"bias_{i}": np.full(10, i, dtype=np.float32) for i in range(20)}  # 20 x 40 bytes
    encoded, decoded = round_trip(tensors)
    assert len(encoded) == 1
    assert len(encoded[0].payload) == 800
    assert_tensors_equal(decoded.tensors, tensors)


def test_small_tensors_pack_chunks_full() -> None:
    tensors = {f"t{i}": np.full(60, i, dtype=np.float64) for i in range(10)}  # 10 x 480 = 4800 bytes
    encoded, decoded = round_trip(tensors)
    assert [len(f.payload) for f in encoded] == [1000, 1000, 1000, 1000, 800]
    assert_tensors_equal(decoded.tensors, tensors)


def test_tensor_bigger_than_a_chunk_spans_frames() -> None:
    big = np.arange(2600, dtype=np.float32).reshape(26, 100)  # 10400 bytes
    tensors: dict[str, np.ndarray] = {"small": np.ones(3, dtype=np.float64), "big": big, "tail": np.array([7], dtype=np.int32)}
    encoded, decoded = round_trip(tensors)
    total = 24 + 10400 + 4
    assert [len(f.payload) for f in encoded] == [1000] * (total // 1000) + [total % 1000]
    assert_tensors_equal(decoded.tensors, tensors)


def test_exact_multiple_of_the_chunk_has_no_empty_frame() -> None:
    tensors = {"a": np.ones(500, dtype=np.float32)}  # 2000 bytes
    encoded, decoded = round_trip(tensors)
    assert [len(f.payload) for f in encoded] == [1000, 1000]
    assert_tensors_equal(decoded.tensors, tensors)


def test_no_tensors_is_one_head_frame() -> None:
    encoded, decoded = round_trip({})
    assert len(encoded) == 1
    assert decoded.tensors == {}
    assert decoded.first.push.version == 3


def test_default_chunk_size() -> None:
    big = np.zeros(frames.CHUNK_BYTES // 4 + 10, dtype=np.float32)
    encoded = encode_frames(push_head(), {"big": big})
    assert [len(f.payload) for f in encoded] == [frames.CHUNK_BYTES, 40]


def test_non_contiguous_and_big_endian_arrays() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    tensors = {"transposed": base.T, "strided": base[:, ::2], "big_endian": np.arange(5, dtype=">f4")}
    _, decoded = round_trip(tensors)
    np.testing.assert_array_equal(decoded.tensors["transposed"], base.T)
    np.testing.assert_array_equal(decoded.tensors["strided"], base[:, ::2])
    assert decoded.tensors["big_endian"].dtype == np.dtype("<f4")
    np.testing.assert_array_equal(decoded.tensors["big_endian"], np.arange(5, dtype=np.float32))


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.complex64, np.int16, np.object_])
def test_dtypes_that_cannot_travel(dtype: type) -> None:
    with pytest.raises(FrameError, match="cannot travel"):
        encode_frames(push_head(), {"x": np.zeros(3, dtype=dtype)})


def test_encode_reads_the_arrays_at_the_call() -> None:
    value = np.ones(4, dtype=np.float32)
    encoded = encode_frames(push_head(), {"v": value})
    value[:] = 5
    np.testing.assert_array_equal(decode_frames(encoded).tensors["v"], np.ones(4, dtype=np.float32))


# ---- malformed streams -------------------------------------------------------------------------


def head_with(*metas: tuple[str, int, list[int]], payload: bytes = b"") -> pb.Frame:
    frame = pb.Frame(push=pb.PushHead(version=1), payload=payload)
    for name, dtype, shape in metas:
        frame.tensors.add(name=name, dtype=dtype, shape=shape)
    return frame


def test_no_frames() -> None:
    with pytest.raises(FrameError, match="empty stream"):
        decode_frames(iter([]))


def test_too_few_bytes() -> None:
    first = head_with(("a", pb.DTYPE_FLOAT32, [4]), payload=b"\x00" * 8)
    with pytest.raises(FrameError, match="carried 8 bytes, the tensors need 16"):
        decode_frames([first])


def test_too_few_bytes_over_several_frames() -> None:
    frames_ = encode_frames(push_head(), {"a": np.ones(600, dtype=np.float32)}, CHUNK)
    with pytest.raises(FrameError, match="carried 2399 bytes, the tensors need 2400"):
        decode_frames(frames_[:-1] + [pb.Frame(payload=frames_[-1].payload[:-1])])


def test_too_many_bytes() -> None:
    first = head_with(("a", pb.DTYPE_FLOAT32, [2]), payload=b"\x00" * 8)
    with pytest.raises(FrameError, match="more than the 8 bytes"):
        decode_frames([first, pb.Frame(payload=b"\x01")])


def test_payload_without_tensors() -> None:
    with pytest.raises(FrameError, match="more than the 0 bytes"):
        decode_frames([head_with(payload=b"abc")])


def test_duplicate_names() -> None:
    first = head_with(("a", pb.DTYPE_FLOAT32, [1]), ("a", pb.DTYPE_FLOAT32, [1]), payload=b"\x00" * 8)
    with pytest.raises(FrameError, match="'a' appears twice"):
        decode_frames([first])


def test_tensor_without_a_name() -> None:
    with pytest.raises(FrameError, match="without a name"):
        decode_frames([head_with(("", pb.DTYPE_FLOAT32, [1]), payload=b"\x00" * 4)])


@pytest.mark.parametrize("dtype", [pb.DTYPE_UNSPECIFIED, 99])
def test_unknown_dtype(dtype: int) -> None:
    with pytest.raises(FrameError, match="unknown dtype"):
        decode_frames([head_with(("a", dtype, [1]), payload=b"\x00" * 4)])


def test_negative_dimension() -> None:
    with pytest.raises(FrameError, match="negative dimension"):
        decode_frames([head_with(("a", pb.DTYPE_FLOAT32, [2, -1]))])


@pytest.mark.parametrize(
    "later",
    [
        pb.Frame(push=pb.PushHead(version=2)),
        pb.Frame(model=pb.ModelHead(initialized=True)),
        pb.Frame(tensors=[pb.TensorMeta(name="b", dtype=pb.DTYPE_FLOAT32, shape=[1])]),
    ],
    ids=["push-head", "model-head", "tensor-metadata"],
)
def test_head_or_metadata_in_a_later_frame(later: pb.Frame) -> None:
    first = head_with(("a", pb.DTYPE_FLOAT32, [2]), payload=b"\x00" * 4)
    later.payload = b"\x00" * 4
    with pytest.raises(FrameError, match="after the first frame"):
        decode_frames([first, later])


@pytest.mark.parametrize(
    "shape",
    [[2**40], [2**62, 4], [2**31, 2**31, 4], [2**63 - 1, 2**63 - 1], [0, 2**62], [2**62, 2**62, 0]],
    ids=["4TiB", "overflows-int64-to-0", "overflows-int64-to-0-3d", "max-int64", "empty-huge", "huge-empty"],
)
@pytest.mark.parametrize("payload", [b"", b"\x00" * 16], ids=["no-payload", "16-bytes"])
def test_shape_claiming_more_than_can_be_held(shape: list[int], payload: bytes) -> None:
    """A peer's claim of an impossible size is a malformed stream (INVALID_ARGUMENT), not a crash."""
    with pytest.raises(FrameError):
        decode_frames([head_with(("a", pb.DTYPE_FLOAT32, shape), payload=payload)])


def test_payload_frames_are_byte_identical_to_protobufs() -> None:
    tensors = {"a": np.arange(700, dtype=np.float32), "b": np.ones(3, dtype=np.float64)}
    messages = list(encode_bytes(push_head(), tensors, 1000))
    assert len(messages) == 3
    for message in messages[1:]:
        assert message == pb.Frame(payload=pb.Frame.FromString(message).payload).SerializeToString()
    first = pb.Frame.FromString(messages[0])
    assert len(first.payload) == 1000 and first.HasField("push")
    assert_tensors_equal(decode_bytes(iter(messages)).tensors, tensors)


def test_payload_frames_with_other_valid_encodings_still_decode() -> None:
    # A peer may write the payload field with a non-minimal varint length: protobuf parses it.
    tensors = {"a": np.arange(4, dtype=np.float32)}
    messages = list(encode_bytes(push_head(), tensors, 8))
    body = pb.Frame.FromString(messages[1]).payload
    padded = bytes([0x22, 0x88, 0x80, 0x00]) + body  # length 8 as a 3-byte varint
    assert pb.Frame.FromString(padded).payload == body
    assert_tensors_equal(decode_bytes(iter([messages[0], padded])).tensors, tensors)


def test_garbage_message_is_a_frame_error() -> None:
    messages = list(encode_bytes(push_head(), {"a": np.arange(4, dtype=np.float32)}, 8))
    with pytest.raises(FrameError):
        decode_bytes(iter([messages[0], b"\xff\xff\xff"]))


# ---- model state: the tensors marked ``state`` ----------------------------------------------------
def test_state_travels_after_the_tensors_marked_and_comes_back_apart() -> None:
    tensors = {"dense/kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}
    state = {"bn/moving_mean": np.array([0.5, 1.5], np.float32), "bn/moving_variance": np.ones(2, np.float64)}
    encoded = [pb.Frame.FromString(m) for m in encode_bytes(push_head(), tensors, 16, state)]
    assert [(m.name, m.state) for m in encoded[0].tensors] == [
        ("dense/kernel", False), ("bn/moving_mean", True), ("bn/moving_variance", True)
    ]
    decoded = decode_frames(encoded)
    assert_tensors_equal(decoded.tensors, tensors)
    assert_tensors_equal(decoded.state, state)


def test_a_stream_without_state_decodes_to_no_state() -> None:
    _, decoded = round_trip({"w": np.ones(3, np.float32)})
    assert decoded.state == {}


def test_a_name_both_a_tensor_and_state_is_refused() -> None:
    head = push_head()
    head.tensors.add(name="w", dtype=pb.DTYPE_FLOAT32, shape=[1])
    head.tensors.add(name="w", dtype=pb.DTYPE_FLOAT32, shape=[1], state=True)
    head.payload = b"\x00" * 8
    with pytest.raises(FrameError, match="appears twice"):
        decode_frames([head])
