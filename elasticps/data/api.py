"""What every reader is: the :class:`Reader` protocol, its :class:`ReaderOptions`, and :class:`DataError`.

Callers: the reader modules beside this one (``arrays``, ``tfrecord``, ``csv_reader``, ``parquet``),
the registry (``readers``), and through it PS 0 (record counts) and the workers (records). Plug-in
readers implement the same protocol; see ``readers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from elasticps.api.spec import DataSpec

DEFAULT_INDEX_DIR = Path("~/.cache/elasticps/data-index")

# The labels of a read: an array, one label per record, or None when the data carries none
# (prediction data, or serialized examples that the model's feed parses). Typed Any for now: the
# worker's trainer port still declares ndarray labels.
Labels = Any


class DataError(ValueError):
    """Data that cannot be read; the message names the file (and the record, line or column)."""


@runtime_checkable
class Reader(Protocol):
    """A data source as records numbered ``0 .. num_records - 1``.

    ``num_records`` is all PS 0 needs to cut tasks, so it must be cheap after the first time (an
    index, metadata) and never load every record. ``read(start, end)`` returns the records
    ``[start, end)`` as ``(features, labels)``: features an array with ``end - start`` rows, labels an
    array of as many, or None. Errors are :class:`DataError`.
    """

    @property
    def num_records(self) -> int: ...

    def read(self, start: int, end: int) -> tuple[np.ndarray, Labels]: ...


@dataclass(frozen=True)
class ReaderOptions:
    """The reader settings of ``spec.data`` besides the path, as a reader is given them (a plug-in
    class too: ``Class(path, options)``)."""

    delimiter: str = ""  # csv/tsv; "" is the reader's own default
    header: bool = True  # csv/tsv
    label_column: str = ""  # csv/tsv/parquet; "" means no labels
    feature_columns: tuple[str, ...] = ()  # csv/tsv/parquet; () means every column but the label
    index_dir: Path | None = None  # where offset indexes are cached; None: in memory only

    @classmethod
    def of(cls, data: DataSpec) -> ReaderOptions:
        index_dir = Path(data.index_dir) if data.index_dir else DEFAULT_INDEX_DIR
        return cls(
            delimiter="\t" if data.delimiter == "\\t" else data.delimiter,
            header=data.header,
            label_column=data.label_column.strip(),
            feature_columns=tuple(c.strip() for c in data.feature_columns.split(",") if c.strip()),
            index_dir=index_dir.expanduser(),
        )
