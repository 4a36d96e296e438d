"""The embedding tables' id index (``ps/id_index.py``) against a dict: lookups and insertions of
whole arrays, through growth, long probe sequences and removal."""

from __future__ import annotations

import numpy as np
import pytest

from elasticps.ps.id_index import MAX_LOAD, IdIndex


def check(index: IdIndex, reference: dict[int, int], ids: np.ndarray) -> None:
    expected = np.array([reference.get(int(i), -1) for i in ids], np.intp)
    np.testing.assert_array_equal(index.find(ids), expected)


def test_lookups_and_insertions_of_whole_arrays_agree_with_a_dict_through_growth() -> None:
    rng = np.random.default_rng(0)
    index, reference, held = IdIndex(), {}, 0
    extremes = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, -1], np.int64)
    for step in range(120):
        if step % 3 == 0:
            ids = rng.integers(-(2**62), 2**62, 700)
        elif step % 3 == 1:
            ids = rng.integers(0, 4000, 700)  # dense small ids: many already held
        else:
            ids = np.concatenate([extremes, rng.integers(-50, 50, 60)])
        ids = np.unique(ids.astype(np.int64))
        check(index, reference, ids)
        new = ids[index.find(ids) < 0]
        index.add(new, np.arange(held, held + new.size, dtype=np.intp))
        reference.update({int(key): held + k for k, key in enumerate(new)})
        held += new.size
        assert len(index) == len(reference) == held
        assert len(index) <= MAX_LOAD * index.nbytes / 16  # 16 bytes a slot, never fuller than MAX_LOAD
    check(index, reference, np.array(list(reference), np.int64))
    check(index, reference, rng.integers(-(2**62), 2**62, 5000).astype(np.int64))  # almost all absent


def test_a_small_table_full_of_collisions_finds_every_id() -> None:
    index = IdIndex(bits=4)  # 16 slots to start: every round of insertions collides and probes on
    ids = np.arange(0, 2000, 7, dtype=np.int64)
    for start in range(0, ids.size, 50):
        part = ids[start:start + 50]
        index.add(part, np.arange(start, start + part.size, dtype=np.intp))
    np.testing.assert_array_equal(index.find(ids), np.arange(ids.size))
    np.testing.assert_array_equal(index.find(ids + 1), np.full(ids.size, -1))  # none of these


def test_removal_keeps_the_ids_asked_at_their_new_positions() -> None:
    index = IdIndex()
    ids = np.random.default_rng(1).permutation(np.arange(-5000, 5000, dtype=np.int64))
    index.add(ids, np.arange(ids.size, dtype=np.intp))
    gone, moved = ids[::3], ids[1::3]
    index.discard(gone)
    index.move(moved, np.arange(moved.size, dtype=np.intp) + 20_000)
    assert len(index) == ids.size - gone.size
    np.testing.assert_array_equal(index.find(moved), np.arange(moved.size) + 20_000)
    np.testing.assert_array_equal(index.find(ids[2::3]), np.arange(ids.size)[2::3])  # untouched
    np.testing.assert_array_equal(index.find(gone), np.full(gone.size, -1))
    with pytest.raises(KeyError, match="not held"):
        index.discard(gone[:1])


def test_ids_removed_and_made_again_through_tombstones_agree_with_a_dict() -> None:
    """A capped table's life: rows made, evicted, ids made again, chains of probes running
    through tombstones, rebuilt when ids and tombstones together fill it."""
    rng = np.random.default_rng(7)
    index, reference = IdIndex(bits=6), {}  # type: IdIndex, dict[int, int]
    position = 0
    for step in range(300):
        fresh = np.unique(rng.integers(0, 3000, 40).astype(np.int64))  # small ids: many come back after going
        fresh = fresh[index.find(fresh) < 0]
        index.add(fresh, np.arange(position, position + fresh.size, dtype=np.intp))
        reference.update({int(key): position + k for k, key in enumerate(fresh)})
        position += fresh.size
        held = np.array(sorted(reference), np.int64)
        if held.size > 500:  # over the "cap": some go, some move
            gone = rng.choice(held, held.size - 400, replace=False)
            index.discard(gone)
            for key in gone.tolist():
                del reference[key]
            stay = np.array(sorted(reference), np.int64)
            moved = rng.choice(stay, min(50, stay.size), replace=False)
            index.move(moved, np.arange(moved.size, dtype=np.intp) + 10**6 + step * 100)
            reference.update({int(key): 10**6 + step * 100 + k for k, key in enumerate(moved)})
        assert len(index) == len(reference)
        check(index, reference, np.arange(-10, 3010, dtype=np.int64))
        assert len(index) + index._dead <= MAX_LOAD * index.nbytes / 16  # tombstones count to the load
