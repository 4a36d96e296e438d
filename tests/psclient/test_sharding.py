"""place: tensors by size onto the least-loaded shard, big ones cut into row slices over all shards;
Placement.split (views of the caller's arrays) and Joined (slices back into one buffer per tensor)."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from bench.shard_bytes import MLP
from elasticps.api.spec import TrainingSpec
from elasticps.psclient.sharding import (
    DEFAULT_SPLIT_BYTES,
    Joined,
    Misplaced,
    Placement,
    TensorInfo,
    parse_slice,
    place,
    slice_name,
    tensor_infos,
)

F32 = np.dtype(np.float32)



def pieces_cover_each_tensor_once(placement: Placement, tensors: list[TensorInfo]) -> None:
    assert sorted(placement.tensors) == sorted(t.name for t in tensors)
    held = [name for shard in range(placement.num_shards) for name in placement.held_on(shard)]
    assert len(held) == len(set(held))  # no name held twice
    for tensor in tensors:
        entry = placement.tensors[tensor.name]
        if not entry.split:
            assert [p.held for p in entry.pieces] == [tensor.name]
            continue
        rows = [r for p in entry.pieces for r in range(p.start or 0, p.stop or 0)]
        assert rows == list(range(tensor.shape[0]))  # every row once, in order
        assert [p.shard for p in entry.pieces] == sorted({p.shard for p in entry.pieces})
    assert sum(placement.shard_bytes()) == sum(t.nbytes for t in tensors)


def test_the_default_threshold_is_the_spec_default_and_four_mib() -> None:
    assert DEFAULT_SPLIT_BYTES == TrainingSpec().split_bytes == 4 << 20


@pytest.mark.parametrize("num_shards", [2, 3, 4])
def test_the_23m_model_is_balanced_within_10_percent(num_shards: int) -> None:
    placement = place(MLP, num_shards)
    loads = placement.shard_bytes()
    assert max(loads) <= 1.10 * min(loads), loads
    pieces_cover_each_tensor_once(placement, MLP)
    # Both big kernels are split over every shard; the small tensors are whole.
    for name in ("mlp/dense/kernel", "mlp/dense_1/kernel"):
        assert placement.shards_of(name) == tuple(range(num_shards))
    assert all(len(placement.shards_of(t.name)) == 1 for t in MLP if "bias" in t.name)


def test_the_23m_model_at_two_shards_exactly() -> None:
    placement = place(MLP, 2)
    assert placement.held_on(0) == ["mlp/dense_1/kernel#rows0:4096", "mlp/dense/kernel#rows0:392", "mlp/dense_2/kernel"]
    assert placement.held_on(1) == [
        "mlp/dense_1/kernel#rows4096:8192",
        "mlp/dense/kernel#rows392:784",
        "mlp/dense/bias",
        "mlp/dense_1/bias",
        "mlp/dense_2/bias",
    ]
    assert placement.shard_bytes() == [46_481_408, 46_440_488]


def test_without_splitting_the_23m_model_cannot_be_balanced() -> None:
    loads = place(MLP, 2, split_bytes=0).shard_bytes()
    assert max(loads) > 2 * min(loads)  # the 67 MB kernel alone on one shard: what splitting fixes


def test_the_caller_order_does_not_matter_and_processes_agree() -> None:
    shuffled = MLP[:]
    random.Random(3).shuffle(shuffled)
    first, again = place(MLP, 3), place(shuffled, 3)
    assert [first.held_on(s) for s in range(3)] == [again.held_on(s) for s in range(3)]
    code = (
        "import numpy as np; from elasticps.psclient.sharding import TensorInfo, place; "
        "t = [TensorInfo(f'v{i}', (i + 1, 300), np.dtype('f4')) for i in range(40)]; "
        "p = place(t, 3, split_bytes=20000); print([p.held_on(s) for s in range(3)])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": seed, "PATH": ""}
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


def test_greedy_largest_first_onto_the_least_loaded_shard_ties_by_index() -> None:
    tensors = [TensorInfo(n, (size,), F32) for n, size in [("a", 10), ("b", 7), ("c", 5), ("d", 3), ("e", 3)]]
    placement = place(tensors, 2)
    # a(40) -> 0; b(28) -> 1; c(20) -> 1 (48); d(12) -> 0 (52); e(12) -> 1 (60).
    assert [placement.shards_of(n) for n in "abcde"] == [(0,), (1,), (1,), (0,), (1,)]
    assert placement.shard_bytes() == [52, 60]
    # Equal sizes go by name; every shard gets one before any gets two.
    same = place([TensorInfo(f"t{i}", (4,), F32) for i in range(6)], 3)
    assert [same.shards_of(f"t{i}") for i in range(6)] == [(0,), (1,), (2,), (0,), (1,), (2,)]


def test_tiny_models_and_edge_cases() -> None:
    empty = place([], 3)
    assert empty.shard_bytes() == [0, 0, 0] and empty.split({}) == [{}, {}, {}]
    one = place([TensorInfo("w", (2, 2), F32)], 3)
    assert one.shards_of("w") == (0,) and one.held_on(1) == []
    # One shard: nothing is split, whatever its size.
    assert not place(MLP, 1).tensors["mlp/dense_1/kernel"].split
    # Above the threshold but not splittable: a scalar, a single row.
    odd = place([TensorInfo("s", (), F32), TensorInfo("row", (1, 100), F32)], 2, split_bytes=1)
    assert not odd.tensors["s"].split and not odd.tensors["row"].split
    # Fewer rows than shards: one row on each of the least-loaded shards.
    few = place([TensorInfo("big", (100,), F32), TensorInfo("m", (2, 50), F32)], 3, split_bytes=100)
    assert few.shards_of("big") == (0, 1, 2)  # 100 rows of 4 bytes, split 34/33/33
    assert few.shards_of("m") == (1, 2)  # shard 0 holds the extra row of "big"
    pieces_cover_each_tensor_once(few, [TensorInfo("big", (100,), F32), TensorInfo("m", (2, 50), F32)])
    # At the threshold exactly: not above it, whole.
    assert not place([TensorInfo("w", (4, 4), F32)], 2, split_bytes=64).tensors["w"].split
    assert place([TensorInfo("w", (4, 4), F32)], 2, split_bytes=63).tensors["w"].split


def test_bad_arguments_and_names_holding_the_slice_mark_are_refused() -> None:
    with pytest.raises(ValueError, match="num_shards"):
        place(MLP, 0)
    with pytest.raises(ValueError, match="split_bytes"):
        place(MLP, 2, split_bytes=-1)
    with pytest.raises(ValueError, match="#rows"):
        place([TensorInfo("w#rows0:1", (2,), F32)], 2)
    with pytest.raises(ValueError, match="placed twice"):
        place([TensorInfo("w", (2,), F32), TensorInfo("w", (3,), F32)], 2)


def test_slice_names_round_trip() -> None:
    assert slice_name("mlp/dense/kernel", 392, 784) == "mlp/dense/kernel#rows392:784"
    assert parse_slice("mlp/dense/kernel#rows392:784") == ("mlp/dense/kernel", 392, 784)
    assert parse_slice("mlp/dense/kernel") is None
    assert parse_slice("a#rowsx:1") is None


# ---- split and join -----------------------------------------------------------------------------


def model(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    variables = {
        "big": rng.standard_normal((37, 5)).astype(np.float32),
        "wide": rng.standard_normal((9, 3, 2)),  # float64
        "small": rng.standard_normal(3).astype(np.float32),
        "scalar": np.array(2.5, np.float32),
    }
    return variables, {"stat": rng.standard_normal((11, 2)).astype(np.float32)}


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5])
def test_split_then_join_gives_the_model_back(num_shards: int) -> None:
    variables, state = model(np.random.default_rng(0))
    placement = place(tensor_infos(variables, state), num_shards, split_bytes=100)
    assert placement.tensors["big"].split == (num_shards > 1)
    parts, state_parts = placement.split(variables), placement.split(state)
    for shard, part in enumerate(parts):
        for held, value in part.items():
            found = placement.locate(held)
            assert found is not None and found[0].pieces[found[1]].shard == shard
            if found[0].split:
                assert np.shares_memory(value, variables[found[0].tensor.name])  # a view, no copy
    joined = Joined(placement)
    got: dict[str, np.ndarray] = {}
    got_state: dict[str, np.ndarray] = {}
    touched: set[str] = set()
    for shard in range(num_shards):
        whole, whole_state, names = joined.take(shard, parts[shard], state_parts[shard])
        got.update(whole)
        got_state.update(whole_state)
        touched |= names
    more, more_state = joined.whole(touched)
    got.update(more)
    got_state.update(more_state)
    assert sorted(got) == sorted(variables) and sorted(got_state) == sorted(state)
    for name, value in {**variables, **state}.items():
        out = got.get(name, got_state.get(name))
        assert out is not None and out.dtype == value.dtype
        np.testing.assert_array_equal(out, value)


def test_joined_buffers_are_allocated_once_and_refilled() -> None:
    variables, state = model(np.random.default_rng(1))
    placement = place(tensor_infos(variables, state), 2, split_bytes=100)
    joined = Joined(placement)
    first = joined.take(0, placement.split(variables)[0], {})
    first_1 = joined.take(1, placement.split(variables)[1], placement.split(state)[1])
    buffers = joined.whole(first[2] | first_1[2])[0]
    newer = {name: value + 1 for name, value in variables.items()}
    _, _, names = joined.take(0, placement.split(newer)[0], {})
    again, _ = joined.whole(names)
    assert again["big"] is buffers["big"]  # the same buffer: no allocation per pull
    # Only shard 0 answered: its rows are new, shard 1's rows are those it answered last.
    rows = placement.tensors["big"].pieces[0].stop
    np.testing.assert_array_equal(again["big"][:rows], newer["big"][:rows])
    np.testing.assert_array_equal(again["big"][rows:], variables["big"][rows:])


def test_a_split_tensor_is_held_back_until_every_slice_arrived() -> None:
    variables, _ = model(np.random.default_rng(2))
    placement = place(tensor_infos(variables), 2, split_bytes=100)
    joined = Joined(placement)
    _, _, names = joined.take(0, placement.split(variables)[0], {})
    assert "big" in names
    assert "big" not in joined.whole(names)[0]


def test_a_shard_holding_what_the_placement_puts_elsewhere_is_refused() -> None:
    variables, state = model(np.random.default_rng(3))
    placement = place(tensor_infos(variables, state), 2, split_bytes=100)
    other = place(tensor_infos(variables, state), 2, split_bytes=0)  # another threshold
    joined = Joined(placement)
    with pytest.raises(Misplaced, match="another rule"):
        for shard in range(2):
            joined.take(shard, other.split(variables)[shard], other.split(state)[shard])
    # A variable missing from a shard's model is refused too; a missing state tensor is not.
    parts = placement.split(variables)
    held = next(iter(parts[1]))
    with pytest.raises(Misplaced, match="lacks"):
        joined.take(1, {n: v for n, v in parts[1].items() if n != held}, {})
    joined.take(1, parts[1], {})
    # A slice of another shape than its rows is refused, not copied.
    bad = dict(parts[0])
    name = next(n for n in bad if parse_slice(n))
    bad[name] = np.zeros((1, 5), np.float32)
    with pytest.raises(Misplaced):
        joined.take(0, bad, {})


def test_split_refuses_unknown_tensors_and_wrong_shapes_of_split_ones() -> None:
    variables, _ = model(np.random.default_rng(4))
    placement = place(tensor_infos(variables), 2, split_bytes=100)
    with pytest.raises(ValueError, match="not in the model"):
        placement.split({"other": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="shape"):
        placement.split({"big": np.zeros((36, 5), np.float32)})
