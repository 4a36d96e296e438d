"""``parquet``: Parquet files (a path or a glob), read a row group at a time with pyarrow.

Callers: the registry (``readers``). Records are rows numbered across the row groups of the files
in order; the counts come from the files' footers, so opening reads no data. A read maps its range
to the row groups that hold it and reads only those groups and only the label and feature columns
(the last group read is kept: consecutive tasks usually fall in one group). Column roles as csv
(``columns``): features must be numeric (integer, floating point or boolean) and become float32
``(n, k)``; an integer label column gives int64 labels, a floating one float32; null cells are errors.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from elasticps import storage
from elasticps.data.api import DataError, Labels, ReaderOptions
from elasticps.data.columns import Columns, roles
from elasticps.data.sources import Files, resolve


def _numeric(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind))


class ParquetReader:
    def __init__(self, path: str, options: ReaderOptions = ReaderOptions()) -> None:
        self._paths = resolve(path)
        self._metadata: list[pq.FileMetaData] = []
        schemas: list[pa.Schema] = []
        groups: list[tuple[int, int]] = []  # (file, row group) in record order
        counts: list[int] = []
        for file, file_path in enumerate(self._paths):
            parquet = self._open(file_path)
            self._metadata.append(parquet.metadata)
            schemas.append(parquet.schema_arrow)
            if schemas[-1].names != schemas[0].names:
                raise DataError(f"{file_path}: its columns differ from {self._paths[0]}'s: {schemas[-1].names} vs {schemas[0].names}")
            for group in range(parquet.metadata.num_row_groups):
                groups.append((file, group))
                counts.append(parquet.metadata.row_group(group).num_rows)
        self._groups = groups
        self._files = Files(counts)
        names = schemas[0].names
        self._columns: Columns = roles(names, len(names), options, self._paths[0])
        label = self._columns.label
        wanted = (*self._columns.features, *([] if label is None else [label]))
        for file, schema in enumerate(schemas):
            if self._metadata[file].num_rows == 0:
                continue  # an empty file's columns may have no type (null)
            for j in wanted:
                if not _numeric(schema.field(j).type):
                    raise DataError(f"{self._paths[file]}: column {self._columns.name(j)} is {schema.field(j).type}, not a number")
        typed = [s for f, s in enumerate(schemas) if self._metadata[f].num_rows] or schemas
        self._integer_labels = label is not None and not pa.types.is_floating(typed[0].field(label).type)
        self._wanted = [names[j] for j in wanted]
        self._open_file: tuple[int, pq.ParquetFile] | None = None
        self._last: tuple[int, pa.Table] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _open(path: str, metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
        try:
            source: Any = path if not storage.is_remote(path) else storage.open_input(path)
            return pq.ParquetFile(source, metadata=metadata)
        except (OSError, pa.ArrowException) as err:
            raise DataError(f"{path}: not a readable Parquet file: {err}") from None

    @property
    def num_records(self) -> int:
        return self._files.total

    @property
    def column_names(self) -> tuple[str, ...]:
        """The feature columns' names, in feature order."""
        return tuple(self._columns.names[j] for j in self._columns.features)

    def read(self, start: int, end: int) -> tuple[np.ndarray, Labels]:
        columns = self._columns
        features: list[np.ndarray] = [np.empty((0, len(columns.features)), dtype=np.float32)]
        labels: list[np.ndarray] = [np.empty(0, dtype=np.int64 if self._integer_labels else np.float32)]
        with self._lock:
            for piece in self._files.split(start, end):
                table = self._group(piece.file).slice(piece.start, piece.end - piece.start)
                where = f"{self._paths[self._groups[piece.file][0]]}: row group {self._groups[piece.file][1]}"
                features.append(np.column_stack([self._column(table, j, where) for j in columns.features]).astype(np.float32))
                if columns.label is not None:
                    labels.append(self._column(table, columns.label, where).astype(labels[0].dtype))
        return np.concatenate(features), (np.concatenate(labels) if columns.label is not None else None)

    def _column(self, table: pa.Table, j: int, where: str) -> np.ndarray:
        column = table.column(self._columns.names[j])
        if column.null_count:
            raise DataError(f"{where}: column {self._columns.name(j)} has {column.null_count} null cells")
        return np.asarray(column.to_numpy())

    def _group(self, index: int) -> pa.Table:
        if self._last is not None and self._last[0] == index:
            return self._last[1]
        file, group = self._groups[index]
        path = self._paths[file]
        if self._open_file is None or self._open_file[0] != file:
            self._open_file = (file, self._open(path, self._metadata[file]))
        try:
            table = self._open_file[1].read_row_group(group, columns=self._wanted)
        except (OSError, pa.ArrowException) as err:
            raise DataError(f"{path}: row group {group}: cannot read: {err}") from None
        self._last = (index, table)
        return table
