"""Which rows of an embedding table go when its shard is over its cap, or which are past their
TTL (``api/row_policy.py``). Pure numpy, on the table's arrays.

Rows are compared by when they were last used (the table's update count when last made, pulled
to train or updated: ``updated``) and their update count (``steps``): LRU evicts the least
recently used, LFU the least often updated, the least recent first among equals. Rows a request
asks for are never chosen.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from elasticps.api.row_policy import Eviction

__all__ = ["expired", "victims"]

Positions = npt.NDArray[np.intp]


def victims(updated: npt.NDArray[np.int64], steps: npt.NDArray[np.int64], rule: Eviction, count: int,
            protected: Positions) -> Positions:  # fmt: skip
    """The positions of ``count`` rows to evict (of ``updated.size`` held), none of ``protected``."""
    if count <= 0:
        return np.empty(0, np.intp)
    key: npt.NDArray[np.int64] | npt.NDArray[np.float64]
    if rule is Eviction.LFU:
        recency = updated.astype(np.float64)
        span = float(recency.max() - recency.min()) + 1.0
        key = steps.astype(np.float64) + (recency - recency.min()) / span  # in [steps, steps + 1)
        del recency
        never: float = np.inf
    else:  # LRU: the last uses themselves, one copy (at a table's cap this is most of its memory to spare)
        key = updated.copy()
        never = np.iinfo(np.int64).max
    key[protected] = never
    if count >= key.size:
        return np.flatnonzero(key != never).astype(np.intp)
    chosen: Positions = np.argpartition(key, count - 1)[:count].astype(np.intp)
    kept: Positions = chosen[key[chosen] != never]
    return kept


def expired(updated: npt.NDArray[np.int64], clock: int, ttl: int) -> Positions:
    """The positions of the rows not used in the last ``ttl`` updates of the table."""
    return np.flatnonzero(clock - updated > ttl).astype(np.intp)
