"""``csv`` and ``tsv``: delimited text, one record per line, numbers in every feature and label cell.

Callers: the registry (``readers``). Options (``spec.data``): ``delimiter`` (default ``,`` for csv, a
tab for tsv), ``header`` (the first line of each file names the columns; the files of a glob must
agree), ``labelColumn`` and ``featureColumns`` (see ``columns``). ``read`` returns float32 features
``(n, k)`` and int64 labels when the first records' labels are integers, float32 otherwise, or None
without a label column.

Records are found without loading a file: one pass (8 MiB at a time) indexes the byte offset of
every non-blank line (``index_cache`` keeps it), and a task reads only its byte range. The same pass
counts each line's fields, so ragged rows fail when the data is opened (on PS 0, before any worker
starts), except on lines with quotes, whose delimiters may be quoted and which are checked when read.
Opening also parses the first records, so a header read as data, a wrong delimiter or a text
column fails at once; a bad cell further on fails the read (the worker) naming the record. Quoted
fields may hold delimiters but not line breaks. Blank lines are skipped.
"""

from __future__ import annotations

import csv
import re
import threading
from typing import IO

import numpy as np

from elasticps import storage
from elasticps.data import index_cache
from elasticps.data.api import DataError, Labels, ReaderOptions
from elasticps.data.columns import Columns, roles
from elasticps.data.sources import Files, resolve

SCAN_CHUNK = 8 << 20
HEAD_LIMIT = 16 << 20  # a first line longer than this is not a CSV header
SAMPLE = 100  # records parsed when the data is opened
_INTEGER = re.compile(r"\s*[+-]?\d+\s*")
_NEWLINE, _RETURN, _QUOTE = 10, 13, ord('"')


def _read_head(file: IO[bytes], path: str) -> str:
    """The first non-blank line of the file (without its line break), or "" for a blank file."""
    data = b""
    while True:
        chunk = file.read(64 << 10)
        data += chunk
        lines = data.split(b"\n")
        complete = lines if not chunk else lines[:-1]
        for line in complete:
            if line.rstrip(b"\r"):
                return _decode(line.rstrip(b"\r"), path, "line 1").lstrip("\ufeff")
        if not chunk:
            return ""
        if len(data) > HEAD_LIMIT:
            raise DataError(f"{path}: no line break in the first {HEAD_LIMIT} bytes: not a CSV file")


def _decode(data: bytes, path: str, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: {where}: not UTF-8 text (byte {err.start}): not a CSV file?") from None


def scan(file: IO[bytes], path: str, size: int, delimiter: str, fields: int) -> np.ndarray:
    """The byte offsets of the non-blank lines of ``file`` and, last, ``size``. Refuses a line
    without quotes whose field count is not ``fields``, naming its line number."""
    starts: list[np.ndarray] = []
    carry, base, lines_before = b"", 0, 0
    separator = ord(delimiter)
    while True:
        chunk = file.read(SCAN_CHUNK)
        data = carry + chunk
        if chunk:
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            region, carry = data[:cut], data[cut:]
        else:
            region, carry = data, b""
        if region:
            line_starts, lines = _lines(np.frombuffer(region, dtype=np.uint8), separator, fields, path, lines_before)
            starts.append(line_starts + base)
            lines_before += lines
        base += len(region)
        if not chunk:
            break
    return np.concatenate([*starts, np.array([size], dtype=np.int64)]).astype(np.int64)


def _lines(region: np.ndarray, separator: int, fields: int, path: str, lines_before: int) -> tuple[np.ndarray, int]:
    """The starts of the non-blank lines of ``region`` (whole lines), and its number of lines."""
    breaks = np.flatnonzero(region == _NEWLINE)
    begins = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(region)]])
    if region[-1] == _NEWLINE:  # no line after the last break
        begins, ends = begins[:-1], ends[:-1]
    last = np.maximum(ends - 1, 0)
    ends = ends - ((ends > begins) & (region[last] == _RETURN))
    blank = ends == begins
    count = np.concatenate([[0], np.cumsum(region == separator, dtype=np.int64)])
    quotes = np.concatenate([[0], np.cumsum(region == _QUOTE, dtype=np.int64)])
    ragged = ~blank & (quotes[ends] == quotes[begins]) & (count[ends] - count[begins] != fields - 1)
    if ragged.any():
        k = int(np.argmax(ragged))
        found = int(count[ends[k]] - count[begins[k]]) + 1
        raise DataError(f"{path}: line {lines_before + k + 1}: {found} fields, expected {fields} (ragged rows)")
    return begins[~blank].astype(np.int64), len(begins)


class CsvReader:
    """Delimited text files (a path or a glob); see the module docstring."""

    default_delimiter = ","

    def __init__(self, path: str, options: ReaderOptions = ReaderOptions()) -> None:
        self._delimiter = options.delimiter or self.default_delimiter
        self._header = options.header
        self._paths = resolve(path)
        names: list[str] | None = None
        self._fields = 0
        self._offsets: list[np.ndarray] = []
        for file_path in self._paths:
            head, offsets = self._open(file_path, options)
            if not head:  # a blank file: no records, no header
                self._offsets.append(offsets[:1])
                continue
            cells = self._split(head, file_path, "line 1")
            if not self._fields:
                self._fields, names = len(cells), (cells if self._header else None)
            elif self._header and cells != names:
                raise DataError(f"{file_path}: header {cells} differs from {self._paths[0]}'s {names}")
            elif len(cells) != self._fields:
                raise DataError(f"{file_path}: line 1: {len(cells)} fields, expected {self._fields} as in {self._paths[0]}")
            self._offsets.append(offsets[1:] if self._header else offsets)
        self._files = Files([len(o) - 1 for o in self._offsets])
        if not self._fields:
            raise DataError(f"{path}: no line in any file")
        self._columns: Columns = roles(names, self._fields, options, self._paths[0])
        self._handles: dict[int, IO[bytes]] = {}
        self._lock = threading.Lock()
        self._integer_labels = self._sample()

    def _open(self, path: str, options: ReaderOptions) -> tuple[str, np.ndarray]:
        try:
            stamp = storage.fingerprint(path)
            with storage.open_input(path) as file:
                head = _read_head(file, path)
        except OSError as err:
            raise DataError(f"{path}: cannot read: {err}") from None
        fields = len(self._split(head, path, "line 1")) if head else 1

        def build() -> np.ndarray:
            try:
                with storage.open_input(path) as file:
                    return scan(file, path, stamp.size, self._delimiter, fields)
            except OSError as err:
                raise DataError(f"{path}: cannot read: {err}") from None

        kind = f"csv-lines-v1-{ord(self._delimiter)}-{fields}"
        return head, index_cache.offsets(kind, path, stamp, options.index_dir, build)

    def _split(self, line: str, path: str, where: str) -> list[str]:
        try:
            rows = list(csv.reader([line], delimiter=self._delimiter, strict=True))
        except csv.Error as err:
            raise DataError(f"{path}: {where}: {err}") from None
        return rows[0] if rows else []

    def _sample(self) -> bool:
        """Parses the first records (a bad file fails now, not on a worker); True when their labels
        are integers (then every label must be)."""
        n = min(SAMPLE, self._files.total)
        rows = self._rows(0, n)
        label = self._columns.label
        integer = label is not None and all(_INTEGER.fullmatch(row[label]) for row, _, _ in rows)
        self._convert(rows, integer)
        return integer

    @property
    def num_records(self) -> int:
        return self._files.total

    @property
    def column_names(self) -> tuple[str, ...] | None:
        """The feature columns' names, in feature order (None without a header)."""
        return tuple(self._columns.names[j] for j in self._columns.features) if self._header else None

    def read(self, start: int, end: int) -> tuple[np.ndarray, Labels]:
        return self._convert(self._rows(start, end), self._integer_labels)

    def _rows(self, start: int, end: int) -> list[tuple[list[str], str, int]]:
        """The cells of records ``[start, end)``, each with its file and record number (for errors)."""
        rows: list[tuple[list[str], str, int]] = []
        with self._lock:
            for piece in self._files.split(start, end):
                path = self._paths[piece.file]
                offsets = self._offsets[piece.file]
                text = _decode(self._chunk(piece.file, int(offsets[piece.start]), int(offsets[piece.end])), path, f"records {piece.start}-{piece.end - 1}")
                lines = [line.rstrip("\r") for line in text.split("\n")]
                lines = [line for line in lines if line]
                try:
                    parsed = list(csv.reader(lines, delimiter=self._delimiter, strict=True))
                except csv.Error as err:
                    raise DataError(f"{path}: records {piece.start}-{piece.end - 1}: {err}") from None
                if len(parsed) != piece.end - piece.start:
                    raise DataError(
                        f"{path}: records {piece.start}-{piece.end - 1}: {len(parsed)} rows in "
                        f"{piece.end - piece.start} lines (a quoted line break? not supported)"
                    )
                for k, cells in enumerate(parsed):
                    if len(cells) != self._fields:
                        raise DataError(
                            f"{path}: record {piece.start + k} (byte {int(offsets[piece.start + k])}): "
                            f"{len(cells)} fields, expected {self._fields} (ragged rows)"
                        )
                    rows.append((cells, path, piece.start + k))
        return rows

    def _chunk(self, file: int, begin: int, end: int) -> bytes:
        path = self._paths[file]
        try:
            handle = self._handles.get(file)
            if handle is None:
                handle = self._handles[file] = storage.open_input(path)
            handle.seek(begin)
            chunk = handle.read(end - begin)
        except OSError as err:
            raise DataError(f"{path}: cannot read: {err}") from None
        if len(chunk) != end - begin:
            raise DataError(f"{path}: truncated since it was indexed: {len(chunk)} of {end - begin} bytes at byte {begin}")
        if begin == 0 and chunk.startswith(b"\xef\xbb\xbf"):
            chunk = chunk[3:]
        return chunk

    def _convert(self, rows: list[tuple[list[str], str, int]], integer_labels: bool) -> tuple[np.ndarray, Labels]:
        columns = self._columns
        cells = [[row[j] for j in columns.features] for row, _, _ in rows]
        try:
            features = np.array(cells, dtype=np.float64).reshape(len(rows), len(columns.features))
        except ValueError:
            raise self._bad_cell(rows, columns.features, float) from None
        if not np.isfinite(features).all():
            k, j = (int(i) for i in np.argwhere(~np.isfinite(features))[0])
            _, path, record = rows[k]
            raise DataError(f"{path}: record {record}: column {columns.name(columns.features[j])}: "
                            f"{rows[k][0][columns.features[j]]!r} is not a finite number")
        if columns.label is None:
            return features.astype(np.float32), None
        texts = [row[columns.label] for row, _, _ in rows]
        kind = int if integer_labels else float
        try:
            labels = np.array([kind(t) for t in texts], dtype=np.int64 if integer_labels else np.float32)
        except ValueError:
            raise self._bad_cell(rows, (columns.label,), kind) from None
        if not integer_labels and not np.isfinite(labels).all():
            k = int(np.argmax(~np.isfinite(labels)))
            raise DataError(f"{rows[k][1]}: record {rows[k][2]}: column {columns.name(columns.label)}: "
                            f"{texts[k]!r} is not a finite number")
        return features.astype(np.float32), labels

    def _bad_cell(self, rows: list[tuple[list[str], str, int]], indexes: tuple[int, ...], kind: type) -> DataError:
        for cells, path, record in rows:
            for j in indexes:
                try:
                    kind(cells[j])
                except ValueError:
                    what = "an integer (the first records' labels are)" if kind is int else "a number"
                    return DataError(f"{path}: record {record}: column {self._columns.name(j)}: {cells[j]!r} is not {what}")
        return DataError(f"{self._paths[0]}: a cell is not a number")


class TsvReader(CsvReader):
    """Tab-separated values: ``csv`` with a tab as the default delimiter."""

    default_delimiter = "\t"
