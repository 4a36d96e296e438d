"""Sum on arrival (``ps/arrivals.py``): a sync shard adds a push into its round's sum piece by piece.

Each test drives the store as the bulk server does: a push's head opens a stream
(``ParameterStore.open_stream``), the payload's bytes go through ``frames.Chunked`` in small
pieces, then the stream finishes or is cut. What is counted is compared bit for bit with the
staging path (whole pushes, ``ParameterStore.push``) on a twin store, and every way the sum can
hold what a round does not count must abort that round (RoundError) and lose no other round.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.arrivals import FIRST_PAUSE, Pause, Stream
from elasticps.ps.errors import GradientError
from elasticps.ps.rules import RoundAveraging
from elasticps.ps.store import ParameterStore, PushOutcome, RoundError, StoreSettings
from elasticps.rpc import frames

MOMENTUM = OptimizerConfig("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": 0.0})
PIECE = 64  # bytes per piece: every tensor below arrives in several


def initial() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "kernel": rng.standard_normal((12, 7)).astype(np.float32),
        "bias": rng.standard_normal(5),  # float64: pieces of another item size
        "empty": np.zeros((0, 3), np.float32),
    }


def gradient(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(value.shape).astype(value.dtype) for name, value in initial().items()}


def make_store(tolerance: int = 0, rule: UpdateRule = UpdateRule.SYNC, state: bool = False) -> ParameterStore:
    store = ParameterStore(StoreSettings(mode=TrainingMode(rule=rule), sync_version_tolerance=tolerance))
    assert store.initialize(initial(), MOMENTUM, state={"bn/mean": np.zeros(3, np.float32)} if state else {})
    return store


def head_of(values: dict[str, np.ndarray], version: int = 0) -> tuple[frames.Head, bytes]:
    first, views = frames.describe(pb.Frame(push=pb.PushHead(version=version)), values)
    return frames.read_head(first.SerializeToString()), b"".join(bytes(v) for v in views)


def open_stream(store: ParameterStore, worker: str, minibatch: str, version: int = 0) -> Stream | None:
    head, _ = head_of(initial(), version)
    return store.open_stream(head.tensors, version, 0.0, worker, minibatch)


def stream_push(
    store: ParameterStore, worker: str, values: dict[str, np.ndarray], minibatch: str = "", version: int = 0
) -> PushOutcome:
    """One push through a stream, as the bulk server sends it: pieces, then finish."""
    stream = open_stream(store, worker, minibatch or f"{worker}-mb", version)
    assert stream is not None, "the push was not summed on arrival"
    head, payload = head_of(values, version)
    pieces = frames.Chunked(head, stream.take, chunk_bytes=PIECE)
    pieces.add(frames.payload_frame_header(len(payload)) + payload)
    pieces.finish()
    return stream.finish()


def variables(store: ParameterStore) -> dict[str, np.ndarray]:
    with store.reading() as (_, _, held):
        return {name: value.copy() for name, value in held.items()}


def assert_same(left: ParameterStore, right: ParameterStore) -> None:
    a, b = variables(left), variables(right)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert left.version == right.version


def rule(store: ParameterStore) -> RoundAveraging:
    found = store.rule
    assert isinstance(found, RoundAveraging)
    return found


# ---- the pieces ------------------------------------------------------------------------------


def test_chunked_hands_on_every_byte_once_in_pieces_within_one_tensor() -> None:
    values = initial()
    head, payload = head_of(values)
    got: dict[str, list[tuple[int, np.ndarray]]] = {}
    pieces = frames.Chunked(
        head, lambda spec, start, piece: got.setdefault(spec.name, []).append((start, piece.copy())), chunk_bytes=PIECE
    )
    for at in range(0, len(payload), 37):  # frames that cut pieces anywhere
        pieces.add(frames.payload_frame_header(len(payload[at : at + 37])) + payload[at : at + 37])
    pieces.finish()
    assert sorted(got) == ["bias", "kernel"]  # the empty tensor has no piece
    for name, parts in got.items():
        flat = np.concatenate([piece for _, piece in parts])
        np.testing.assert_array_equal(flat, values[name].reshape(-1))
        assert [start for start, _ in parts] == list(range(0, values[name].size, PIECE // values[name].itemsize))
        assert all(piece.nbytes <= PIECE for _, piece in parts)


def test_chunked_refuses_bytes_beyond_the_tensors_and_a_stream_that_ends_short() -> None:
    head, payload = head_of(initial())
    over = frames.Chunked(head, lambda *_: None, chunk_bytes=PIECE)
    with pytest.raises(frames.FrameError, match="more than"):
        over.add(frames.payload_frame_header(len(payload) + 1) + payload + b"x")
    short = frames.Chunked(head, lambda *_: None, chunk_bytes=PIECE)
    short.add(frames.payload_frame_header(len(payload) - 4) + payload[:-4])
    with pytest.raises(frames.FrameError, match="the tensors need"):
        short.finish()


# ---- counted as the staging path counts --------------------------------------------------------


@pytest.mark.parametrize("streamed", [("a", "b"), ("a",), ("b",)])
def test_a_round_summed_on_arrival_applies_what_staging_applies_bit_for_bit(streamed: tuple[str, ...]) -> None:
    summed, staged = make_store(), make_store()
    for round_ in range(3):
        for worker, seed in (("a", 1 + round_), ("b", 11 + round_)):
            values = gradient(seed)
            assert staged.push(values, round_, worker=worker, minibatch=f"{worker}{round_}").accepted
            if worker in streamed:
                assert stream_push(summed, worker, values, f"{worker}{round_}", round_).accepted
            else:  # a push over gRPC frames: staged whole beside the sum
                assert summed.push(values, round_, worker=worker, minibatch=f"{worker}{round_}").accepted
        assert summed.commit(round_, ["a", "b"], dry_run=True).applied == ()
        assert summed.commit(round_, ["a", "b"]).applied == (f"a{round_}", f"b{round_}")
        staged.commit(round_, ["a", "b"])
        assert_same(summed, staged)
    assert summed.version == 3 and rule(summed).staged == 0


def test_a_retried_push_of_the_same_minibatch_is_accepted_and_counted_once() -> None:
    summed, staged = make_store(), make_store()
    assert stream_push(summed, "a", gradient(1), "mb-1").accepted
    assert stream_push(summed, "a", gradient(1), "mb-1").accepted  # the reply was lost: sent again
    staged.push(gradient(1), 0, worker="a", minibatch="mb-1")
    summed.commit(0, ["a"])
    staged.commit(0, ["a"])
    assert_same(summed, staged)


def test_pushes_that_cannot_be_summed_on_arrival_are_left_to_the_whole_path() -> None:
    assert open_stream(make_store(tolerance=1), "a", "m") is None  # may be counted in a later round
    assert open_stream(make_store(rule=UpdateRule.ASYNC), "a", "m") is None
    store = make_store(state=True)
    head, _ = head_of({**initial()})
    first = pb.Frame(push=pb.PushHead(version=0))
    with_state, _ = frames.describe(first, initial(), {"bn/mean": np.zeros(3, np.float32)})
    assert store.open_stream(frames.read_head(with_state.SerializeToString()).tensors, 0, worker="a") is None
    assert store.open_stream(head.tensors[:1], 0, worker="a") is None  # a variable missing
    assert store.open_stream(head.tensors, 1, worker="a") is None  # another version
    assert store.open_stream(head.tensors, 0, worker="a", incarnation=4) is None
    with pytest.raises(GradientError, match="learning rate"):
        store.open_stream(head.tensors, 0, learning_rate=float("nan"), worker="a")
    assert store.open_stream(head.tensors, 0, worker="a") is not None  # pushes without state do stream


def test_a_push_arriving_while_a_dry_run_holds_the_round_is_staged_whole() -> None:
    store = make_store()
    stream_push(store, "a", gradient(1))
    store.commit(0, ["a"], dry_run=True)
    assert open_stream(store, "b", "b-mb") is None
    assert store.push(gradient(2), 0, worker="b").accepted
    assert store.commit(0, ["a"]).applied == ("a-mb",)
    assert rule(store).staged == 0  # b's gradient was of version 0: dropped when the round moved on


# ---- what a round cannot count aborts it, and loses nothing else ----------------------------------


def test_a_round_that_leaves_out_a_summed_push_is_aborted_and_sum_on_arrival_pauses() -> None:
    store = make_store()
    stream_push(store, "a", gradient(1))
    stream_push(store, "b", gradient(2))
    before = variables(store)
    with pytest.raises(RoundError, match=r"\['b'\] were summed as they arrived"):
        store.commit(0, ["a"], dry_run=True)
    for name, value in variables(store).items():
        np.testing.assert_array_equal(value, before[name])
    assert rule(store).staged == 0  # both must push again
    with pytest.raises(RoundError, match="no staged gradient"):
        store.commit(0, ["a"])
    # Paused: the pushes of the next rounds are staged whole, and a round of one of them commits.
    assert open_stream(store, "a", "again") is None
    assert store.push(gradient(1), 0, worker="a").accepted
    assert store.push(gradient(2), 0, worker="b").accepted
    assert store.commit(0, ["a"]).version == 1
    for round_ in range(1, FIRST_PAUSE + 1):
        assert open_stream(store, "a", "x", round_) is None
        store.push(gradient(round_), round_, worker="a")
        store.commit(round_, ["a"])
    assert open_stream(store, "a", "x", FIRST_PAUSE + 1) is not None


def test_pauses_double_up_to_the_longest() -> None:
    pause = Pause()
    lengths = []
    for version in range(0, 5000, 500):
        pause.mismatched(version)
        lengths.append(pause.length)
        assert not pause.allows(version + pause.length) and pause.allows(version + pause.length + 1)
    assert lengths[:4] == [FIRST_PAUSE, 2 * FIRST_PAUSE, 4 * FIRST_PAUSE, 8 * FIRST_PAUSE]
    assert max(lengths) == lengths[-1] == 256


def test_a_push_refused_at_its_first_piece_leaves_the_sum_sound() -> None:
    summed, staged = make_store(), make_store()
    stream_push(summed, "a", gradient(1))
    bad = gradient(2)
    bad["kernel"][0, 0] = np.nan  # the very first piece
    with pytest.raises(GradientError, match="NaN"):
        stream_push(summed, "b", bad)
    staged.push(gradient(1), 0, worker="a")
    summed.commit(0, ["a"])
    staged.commit(0, ["a"])
    assert_same(summed, staged)


@pytest.mark.parametrize("how", ["nan in a later piece", "cut off"])
def test_a_push_that_fails_after_part_of_it_was_summed_aborts_the_round(how: str) -> None:
    store = make_store()
    stream_push(store, "a", gradient(1))
    before = variables(store)
    stream = open_stream(store, "b", "b-mb")
    assert stream is not None
    values = gradient(2)
    if how == "nan in a later piece":
        values["bias"][-1] = np.inf
    head, payload = head_of(values)
    pieces = frames.Chunked(head, stream.take, chunk_bytes=PIECE)
    if how == "cut off":
        pieces.add(frames.payload_frame_header(len(payload) // 2) + payload[: len(payload) // 2])
        stream.cut()
    else:
        with pytest.raises(GradientError, match="'bias' holds NaN or infinity"):
            pieces.add(frames.payload_frame_header(len(payload)) + payload)
    with pytest.raises(RoundError, match="after part of it was summed"):
        store.commit(0, ["a"], dry_run=True)
    for name, value in variables(store).items():
        np.testing.assert_array_equal(value, before[name])
    # Not a mismatch: no pause. The members push again and the round commits.
    assert stream_push(store, "a", gradient(1)).accepted
    assert store.commit(0, ["a"]).version == 1


def test_a_round_that_closes_while_a_push_arrives_is_aborted_and_that_push_is_refused_as_stale() -> None:
    store = make_store()
    stream_push(store, "a", gradient(1))
    late = open_stream(store, "c", "c-mb")  # a worker started after the round opened
    assert late is not None
    head, payload = head_of(gradient(3))
    pieces = frames.Chunked(head, late.take, chunk_bytes=PIECE)
    pieces.add(frames.payload_frame_header(PIECE * 2) + payload[: PIECE * 2])
    with pytest.raises(RoundError, match=r"pushes of \['c'\] were arriving"):
        store.commit(0, ["a"], dry_run=True)
    pieces.add(frames.payload_frame_header(len(payload) - PIECE * 2) + payload[PIECE * 2 :])
    pieces.finish()
    assert late.finish().accepted is False  # counted nowhere: the worker trains it again
    assert store.version == 0


def test_a_second_minibatch_from_a_summed_worker_aborts_the_round() -> None:
    store = make_store()
    stream_push(store, "a", gradient(1), "first")
    assert open_stream(store, "a", "second") is None  # received whole, and the sum is spoiled
    assert store.push(gradient(4), 0, worker="a", minibatch="second").accepted
    with pytest.raises(RoundError, match="pushed again"):
        store.commit(0, ["a"])


def test_a_dry_run_aborted_elsewhere_is_reused_for_the_same_round_and_refused_for_another() -> None:
    summed, staged = make_store(), make_store()
    for worker, seed in (("a", 1), ("b", 2)):
        stream_push(summed, worker, gradient(seed))
        staged.push(gradient(seed), 0, worker=worker)
    summed.commit(0, ["a", "b"], dry_run=True)  # another shard refused: the coordinator aborts
    summed.commit(0, ["a", "b"], dry_run=True)  # and the same round comes again
    summed.commit(0, ["a", "b"])
    staged.commit(0, ["a", "b"])
    assert_same(summed, staged)

    for worker, seed in (("a", 3), ("b", 4)):
        stream_push(summed, worker, gradient(seed), version=1)
    summed.commit(1, ["a", "b"], dry_run=True)
    with pytest.raises(RoundError, match="no staged gradient"):  # their gradients hold the sum: spent
        summed.commit(1, ["a"], dry_run=True)
    assert open_stream(summed, "a", "a-again", 1) is not None  # not a mismatch: no pause


def test_a_restored_model_forgets_the_sum_and_refuses_the_pushes_still_arriving() -> None:
    store = make_store()
    stream = open_stream(store, "a", "m")
    assert stream is not None
    head, payload = head_of(gradient(1))
    pieces = frames.Chunked(head, stream.take, chunk_bytes=PIECE)
    pieces.add(frames.payload_frame_header(PIECE) + payload[:PIECE])
    rule(store).reset(store._require_model())  # what a restore or rollback does under the guard
    pieces.add(frames.payload_frame_header(len(payload) - PIECE) + payload[PIECE:])
    pieces.finish()
    assert stream.finish().accepted is False
    assert stream_push(store, "b", gradient(2)).accepted
    assert store.commit(0, ["b"]).version == 1


# ---- memory -------------------------------------------------------------------------------------


def test_pushes_summed_on_arrival_hold_no_whole_gradient() -> None:
    """Two workers' pushes of an 8 MiB model, round after round: the staging path holds each whole
    until the commit (two model sizes a round); on arrival, the sum (made once, kept between rounds)
    and a piece at a time."""
    model = {"kernel": np.zeros((2048, 1024), np.float32)}
    nbytes = model["kernel"].nbytes
    store = ParameterStore(StoreSettings())
    store.initialize(model, MOMENTUM)
    values = {"kernel": np.ones((2048, 1024), np.float32)}
    head, payload = head_of(values)
    framed = frames.payload_frame_header(len(payload)) + payload
    tracemalloc.start()
    try:
        for round_ in range(3):
            for worker in ("a", "b"):
                stream = store.open_stream(head.tensors, round_, worker=worker, minibatch=f"{worker}{round_}")
                assert stream is not None
                pieces = frames.Chunked(head, stream.take)
                pieces.add(framed)
                pieces.finish()
                assert stream.finish().accepted
            store.commit(round_, ["a", "b"])
            if round_ == 0:  # the sum's arrays are made once, in the first round
                tracemalloc.reset_peak()
                start, _ = tracemalloc.get_traced_memory()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - start < nbytes // 2, f"two rounds of two pushes took {peak - start} bytes for a {nbytes}-byte model"
    v1 = -0.1
    v2 = 0.9 * v1 - 0.1
    np.testing.assert_allclose(variables(store)["kernel"], v1 + v2 + (0.9 * v2 - 0.1), rtol=1e-5)
