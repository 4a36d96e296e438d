"""A dataset of several files: a path or a glob resolved to sorted files, records numbered across them.

Callers: the tfrecord, csv and parquet readers. ``train-*.tfrecord`` is one dataset whose record
``k`` is the ``k``-th record of the concatenation of its files in sorted order; tasks stay record
ranges ``[start, end)`` and :meth:`Files.split` maps one onto the files that hold it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from elasticps import storage
from elasticps.data.api import DataError


def resolve(path: str) -> list[str]:
    """The files of ``path``: the sorted matches of a glob, or the one file. Refuses an empty glob
    and a missing file with a :class:`DataError` that names the path."""
    if storage.is_pattern(path):
        try:
            files = storage.glob(path)
        except OSError as err:
            raise DataError(f"{path}: cannot list: {err}") from None
        if not files:
            raise DataError(f"{path}: no file matches")
        return files
    try:
        found = storage.exists(path)
    except OSError as err:
        raise DataError(f"{path}: cannot read: {err}") from None
    if not found:
        raise DataError(f"{path}: no such file")
    return [path]


@dataclass(frozen=True)
class Piece:
    """The part of one task in one file: records ``[start, end)`` of file ``file``."""

    file: int
    start: int
    end: int


class Files:
    """Record counts per file, and the mapping of a global record range onto them."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.bounds = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])

    @property
    def total(self) -> int:
        return int(self.bounds[-1])

    def split(self, start: int, end: int) -> Iterator[Piece]:
        """The pieces of records ``[start, end)``, file by file (empty files skipped)."""
        if not 0 <= start <= end <= self.total:
            raise DataError(f"records [{start}, {end}) are outside [0, {self.total})")
        if start == end:
            return
        first = int(np.searchsorted(self.bounds, start, side="right")) - 1
        for file in range(first, len(self.bounds) - 1):
            low, high = int(self.bounds[file]), int(self.bounds[file + 1])
            if low >= end:
                break
            if high > start:
                yield Piece(file, max(start, low) - low, min(end, high) - low)
