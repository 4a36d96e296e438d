"""An embedding table's admission filter (``admitAfter``, ``api/row_policy.py``): how often each
id not holding a row yet was asked for, in bounded memory. Pure numpy.

A count-min sketch: two rows of ``width`` byte counters, each id counted in one counter of each row
(two independent multiplicative hashes) and its count read as the smaller of the two. Ids sharing
counters in both rows add up, so an id may read a count a little above its own and be admitted
early; never late. Counters stop at 255 (the largest ``admitAfter``). A minibatch's ids are
counted at once; ids of one minibatch that share a counter add one to it, not one each (a count
a little low, rarely: the sketch is approximate either way).

Not checkpointed: a restarted shard counts afresh (its ids not admitted yet need ``admitAfter``
sightings again).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import IdArray

__all__ = ["AdmissionFilter"]

_HASHES = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))


class AdmissionFilter:
    def __init__(self, admit_after: int, width: int) -> None:
        self.admit_after = admit_after
        self._bits = max(10, int(width - 1).bit_length())
        self._counts = np.zeros((len(_HASHES), 1 << self._bits), np.uint8)

    @property
    def nbytes(self) -> int:
        return int(self._counts.nbytes)

    def _slots(self, ids: IdArray) -> list[npt.NDArray[np.int64]]:
        keys = ids.astype(np.uint64)
        shift = np.uint64(64 - self._bits)
        return [((keys * h) >> shift).astype(np.int64) for h in _HASHES]

    def count(self, ids: IdArray) -> npt.NDArray[np.bool_]:
        """Counts one sighting of each id; which of them are now admitted."""
        seen = np.full(ids.size, 255, np.uint8)
        for row, slots in zip(self._counts, self._slots(ids)):
            counts = np.minimum(row[slots], 254) + 1
            row[slots] = counts
            np.minimum(seen, counts.astype(np.uint8), out=seen)
        return seen >= self.admit_after

    def admitted(self, ids: IdArray) -> npt.NDArray[np.bool_]:
        """Which ids were seen often enough (no sighting counted)."""
        seen = np.full(ids.size, 255, np.uint8)
        for row, slots in zip(self._counts, self._slots(ids)):
            np.minimum(seen, row[slots], out=seen)
        return seen >= self.admit_after
