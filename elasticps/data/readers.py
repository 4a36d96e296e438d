"""Record readers by name: the built-in ones and plug-ins, opened as one :class:`Reader` protocol.

Callers: PS 0 (``ps.main``), which opens the job's data at start to count its records (so a bad
path or a malformed file fails there, before any worker starts, with one :class:`DataError` line
naming the file), the worker (``worker.main``), which reads the records of its tasks, and
``elasticps run``, which opens them once before it starts any process. Everything here is numpy
(and pyarrow): no TensorFlow.

Built-in readers (``spec.data.reader``): ``idx`` and ``npz`` (``arrays``), ``tfrecord``
(``tfrecord``), ``csv`` and ``tsv`` (``csv_reader``), ``parquet`` (``parquet``). Paths of the last
four may be object-store URIs (``s3://bucket/train-*.tfrecord``, see ``elasticps.storage``) and globs.
A local path of any reader may start with ``~`` (the home of the process that opens it). Any path
may end in a record range ``[START:END]`` (either end may be left out, as a Python slice with
whole numbers): the records ``START .. END - 1`` of the data, numbered from 0 again, so one file
can give a job its training and its validation records (``criteo.txt[0:8000]``,
``criteo.txt[8000:]``).

A plug-in reader is named ``package.module:ClassName`` (e.g. ``my_readers.avro:AvroReader``); the
module must be importable in the PS and worker images. The class is called as
``ClassName(path, options)`` with the data path (training or validation) and a
:class:`~elasticps.data.api.ReaderOptions` (``spec.data``'s delimiter, header, label and feature
columns, index folder), and the object it returns must satisfy the :class:`Reader` protocol:

* ``num_records`` (a property or attribute): the number of records, numbered ``0 .. n - 1``;
  PS 0 only asks this, so it must not read every record;
* ``read(start, end) -> (features, labels)``: records ``[start, end)``: ``features`` a numpy
  array of ``end - start`` rows (what the model's ``feed`` receives), ``labels`` a numpy array of
  as many labels or None when the data has none;
* optionally ``column_names``: the feature columns' names, in order, for tabular data (the csv
  and parquet readers have it; the worker hands it to the model's ``dataset_fn`` as metadata);
* errors are :class:`DataError` with a message that names the file; any other exception the
  constructor raises is reported as one (with its type) and is a user error too.

The syntax of the name is checked when the TrainingJob is parsed (``spec.reader_problem``); the
import when a process opens the data, with an error naming the module.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from elasticps import storage
from elasticps.api.spec import DataReader, DataSpec, reader_problem
from elasticps.data.api import DataError, Labels, Reader, ReaderOptions
from elasticps.data.arrays import IdxReader, NpzReader
from elasticps.data.criteo import CriteoReader
from elasticps.data.csv_reader import CsvReader, TsvReader
from elasticps.data.tfrecord import TFRecordReader

__all__ = [
    "DataError", "IdxReader", "Labels", "NpzReader", "Reader", "ReaderOptions", "count_records", "open_reader", "reader_class"
]

Factory = Callable[[str, ReaderOptions], Any]


def _parquet(path: str, options: ReaderOptions) -> Any:
    """Parquet's reader, imported when a process opens Parquet data: pyarrow adds about 27 MB to
    the resident memory of every PS, coordinator and worker that imports it."""
    from elasticps.data.parquet import ParquetReader

    return ParquetReader(path, options)


BUILTIN: dict[str, Factory] = {
    DataReader.IDX.value: IdxReader,
    DataReader.NPZ.value: NpzReader,
    DataReader.TFRECORD.value: TFRecordReader,
    DataReader.CSV.value: CsvReader,
    DataReader.TSV.value: TsvReader,
    DataReader.PARQUET.value: _parquet,
    DataReader.CRITEO.value: CriteoReader,
}


def reader_class(name: str) -> Factory:
    """The class of reader ``name``: a built-in one, or a plug-in's, imported now."""
    if name in BUILTIN:
        return BUILTIN[name]
    problem = reader_problem(name)
    if problem is not None:
        raise DataError(f"reader: {problem}")
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # a plug-in's import may fail in any way: one line, not a traceback
        raise DataError(f"reader {name}: cannot import module {module_name!r}: {type(err).__name__}: {err}") from None
    factory = getattr(module, class_name, None)
    if not callable(factory):
        raise DataError(f"reader {name}: module {module_name!r} has no class {class_name!r}")
    return factory  # type: ignore[no-any-return]


def open_reader(kind: str, path: str, options: ReaderOptions = ReaderOptions()) -> Reader:
    """Opens ``path`` with reader ``kind`` (a built-in name or ``package.module:ClassName``).
    A local path starting with ``~`` is expanded first (``~/data/train-*.tfrecord``)."""
    name = str(getattr(kind, "value", kind))  # DataReader members too
    ranged = _RANGE.match(path)
    if ranged is not None:
        inner = open_reader(kind, ranged["path"], options)
        return RecordRange.of(inner, ranged["start"], ranged["end"], path)
    path = storage.expand_user(path)
    factory = reader_class(name)
    if name in BUILTIN:
        reader: object = factory(path, options)
    else:
        try:
            reader = factory(path, options)
        except DataError:
            raise
        except Exception as err:
            raise DataError(f"{path}: reader {name}: {type(err).__name__}: {err}") from None
    if not isinstance(reader, Reader):
        raise DataError(f"reader {name}: {type(reader).__name__} has no num_records and read(start, end) (the Reader protocol)")
    return reader


_RANGE = re.compile(r"^(?P<path>.+)\[(?P<start>\d*):(?P<end>\d*)\]$")


class RecordRange:
    """Records ``start .. end - 1`` of another reader, numbered from 0 (a path's ``[START:END]``)."""

    def __init__(self, inner: Reader, start: int, end: int) -> None:
        self._inner, self._start, self._end = inner, start, end
        columns = getattr(inner, "column_names", None)
        if columns is not None:
            self.column_names = columns

    @classmethod
    def of(cls, inner: Reader, start: str, end: str, path: str) -> RecordRange:
        total = inner.num_records
        first = int(start) if start else 0
        last = int(end) if end else total
        if not first < last <= total:
            raise DataError(f"{path}: the range [{start}:{end}] must hold at least one of the {total} records "
                            "(START < END <= records)")
        return cls(inner, first, last)

    @property
    def num_records(self) -> int:
        return self._end - self._start

    def read(self, start: int, end: int) -> tuple[Any, Labels]:
        if not 0 <= start <= end <= self.num_records:
            raise DataError(f"records [{start}, {end}) are outside this range's {self.num_records}")
        return self._inner.read(self._start + start, self._start + end)


def count_records(data: DataSpec) -> tuple[int, int]:
    """The records of a job's training and validation data (0 without validation data), opened as
    PS 0 opens them; a :class:`DataError` names the field (``spec.data.training: <file>: <why>``).
    ``elasticps run`` calls it before it starts any process."""
    options = ReaderOptions.of(data)
    counts = [0, 0]
    for k, (field, path) in enumerate((("training", data.training), ("validation", data.validation))):
        if path:
            try:
                counts[k] = open_reader(data.reader, path, options).num_records
            except DataError as err:
                raise DataError(f"spec.data.{field}: {err}") from None
    return counts[0], counts[1]
