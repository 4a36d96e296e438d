"""Positions of an embedding table's ids, a whole minibatch's ids at once (issue 38). Pure numpy.

An open-addressing hash table with linear probing, in two arrays of a power-of-two size: the keys
(the ids) and their positions (-1: an empty slot). An id's first slot is its Fibonacci hash (the
id times 2^64 / phi, its top bits). A lookup of n ids is a few vectorised rounds: every id still
unresolved reads its slot; a hit gives its position, an empty slot says the id is not held, any
other key sends the id on to the next slot. An insertion does the same, and where several new
ids want one empty slot in a round one of them takes it, the others probe on. The last few ids
of a long probe sequence are finished one by one, not in rounds of their own.

The table grows (doubles, everything inserted again) before it is more than :data:`MAX_LOAD`
full, so probe sequences stay short: a lookup is one or two rounds for most ids, whatever the
table's size, and reads two entries per id where a sorted index's binary search reads ~log2(n).
Memory: 16 bytes per slot, 1/MAX_LOAD to 2/MAX_LOAD slots per id held.

Removing ids (:meth:`IdIndex.discard`) leaves a tombstone in each one's slot (a lookup probes
on past it, an insertion may take it); :meth:`IdIndex.move` gives held ids new positions in place.
So an eviction costs the index the ids it touches, not a copy of the table. Tombstones count
toward the load: once ids and tombstones together pass :data:`MAX_LOAD`, the table is built again
from the ids held (the old arrays let go of before the new ones are made: the index never holds
two tables at once).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import IdArray

__all__ = ["IdIndex", "MAX_LOAD"]

MAX_LOAD = 0.5  # the most of its slots the table fills before it doubles
STRAGGLERS = 16  # ids still probing after the vectorised rounds, finished one by one
FIRST_BITS = 10
EMPTY, DEAD = -1, -2  # a slot's value: never used, or its id removed (a tombstone)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
Positions = npt.NDArray[np.intp]


class IdIndex:
    def __init__(self, bits: int = FIRST_BITS) -> None:
        self._bits = bits
        self._keys: IdArray = np.zeros(1 << bits, np.int64)
        self._values: Positions = np.full(1 << bits, EMPTY, np.intp)
        self._count = 0
        self._dead = 0  # tombstones

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes + self._values.nbytes)

    def _first_slots(self, ids: IdArray) -> npt.NDArray[np.int64]:
        mixed = ids.astype(np.uint64) * _GOLDEN  # wraps: the multiplicative hash
        return (mixed >> np.uint64(64 - self._bits)).astype(np.int64)

    def find(self, ids: IdArray) -> Positions:
        """Each id's position, -1 for an id not held."""
        slots = self._slots_of(ids)
        out = np.full(ids.size, -1, np.intp)
        found = slots >= 0
        out[found] = self._values[slots[found]]
        return out

    def _slots_of(self, ids: IdArray) -> npt.NDArray[np.int64]:
        """Each id's slot, -1 for an id not held."""
        out = np.full(ids.size, -1, np.int64)
        if not self._count or not ids.size:
            return out
        mask = (1 << self._bits) - 1
        pending = np.arange(ids.size)
        slots = self._first_slots(ids)
        wanted = ids
        while pending.size > STRAGGLERS:
            values = self._values[slots]
            hit = (values >= 0) & (self._keys[slots] == wanted)
            out[pending[hit]] = slots[hit]
            going = (values != EMPTY) & ~hit  # another id's slot, or a tombstone: probe the next
            pending, wanted = pending[going], wanted[going]
            slots = (slots[going] + 1) & mask
        for at, key, slot in zip(pending.tolist(), wanted.tolist(), slots.tolist()):  # the long probes, one by one
            while (value := int(self._values[slot])) != EMPTY:
                if value >= 0 and int(self._keys[slot]) == key:
                    out[at] = slot
                    break
                slot = (slot + 1) & mask
        return out

    def add(self, ids: IdArray, positions: Positions) -> None:
        """New ids (distinct, none held) at these positions."""
        if not ids.size:
            return
        if (self._count + self._dead + ids.size) > MAX_LOAD * self._keys.size:
            bits = self._bits
            while (self._count + ids.size) > MAX_LOAD * (1 << bits):
                bits += 1
            self._rebuild(bits)
        self._insert(ids, positions)

    def discard(self, ids: IdArray) -> None:
        """Removes ``ids`` (distinct, each held)."""
        slots = self._held_slots(ids)
        self._values[slots] = DEAD
        self._count -= slots.size
        self._dead += slots.size

    def move(self, ids: IdArray, positions: Positions) -> None:
        """Held ``ids`` (distinct) now at ``positions``."""
        self._values[self._held_slots(ids)] = positions

    def _held_slots(self, ids: IdArray) -> npt.NDArray[np.int64]:
        slots = self._slots_of(ids)
        if (slots < 0).any():
            raise KeyError(f"id {int(ids[slots < 0][0])} is not held")
        return slots

    def _rebuild(self, bits: int) -> None:
        """The table at ``2**bits`` slots, every id held inserted again, no tombstone left."""
        full = self._values >= 0
        ids, positions = self._keys[full], self._values[full]
        del full
        self._keys, self._values = np.zeros(0, np.int64), np.zeros(0, np.intp)  # the old arrays go first
        self._bits = bits
        self._keys = np.zeros(1 << bits, np.int64)
        self._values = np.full(1 << bits, EMPTY, np.intp)
        self._count = self._dead = 0
        self._insert(ids, positions)

    def _insert(self, ids: IdArray, positions: Positions) -> None:
        mask = (1 << self._bits) - 1
        slots = self._first_slots(ids)
        self._count += ids.size
        while ids.size > STRAGGLERS:
            free = self._values[slots] < 0  # empty, or a tombstone
            # Every id at a free slot writes itself there; where several wanted one slot, the
            # last write stays (numpy assigns repeated indices in order) and the rest probe on.
            taken = slots[free]
            if self._dead:  # tombstones taken again (none in a table that never evicted)
                self._dead -= np.unique(taken[self._values[taken] == DEAD]).size
            self._keys[taken] = ids[free]
            self._values[taken] = positions[free]
            placed = free & (self._keys[slots] == ids)
            left = ~placed
            ids, positions, slots = ids[left], positions[left], (slots[left] + 1) & mask
        for key, position, slot in zip(ids.tolist(), positions.tolist(), slots.tolist()):
            while self._values[slot] >= 0:
                slot = (slot + 1) & mask
            self._dead -= int(self._values[slot] == DEAD)
            self._keys[slot] = key
            self._values[slot] = position
