"""``tfrecord``: files of serialized ``tf.train.Example`` records, read without TensorFlow.

Callers: the registry (``readers``). PS 0 counts the records and must never import TensorFlow, so
the framing is read here: each record is

    uint64 length (little endian) | uint32 masked crc32c of those 8 bytes | data | uint32 masked crc32c of data

(masked: the CRC rotated right by 15 bits plus 0xa282ead8, modulo 2^32, as TensorFlow writes it).
One pass over each file builds the index of record offsets, checking every length's CRC; the
index is cached (``index_cache``). A read checks every record's data CRC. ``read`` returns the
records' bytes as a numpy object array and no labels: the model's ``feed``/``dataset_fn`` parses
them (``tf.io.parse_example``), as ElasticDL's models do.

Gzip-compressed TFRecord files are refused with a clear error: a record range in one would need
decompressing the file from its start; decompress them once instead (or use uncompressed files).
"""

from __future__ import annotations

import struct
import threading
from typing import IO

import google_crc32c
import numpy as np

from elasticps import storage
from elasticps.data import index_cache
from elasticps.data.api import DataError, Labels, ReaderOptions
from elasticps.data.sources import Files, resolve

INDEX_KIND = "tfrecord-offsets-v1"
HEADER = 12  # length (8) + its CRC (4)
FOOTER = 4  # the data's CRC
SCAN_CHUNK = 8 << 20  # bytes read at once while indexing (one request each on an object store)
_MASK_DELTA = 0xA282EAD8
_GZIP_MAGIC = b"\x1f\x8b"


def masked_crc(data: bytes) -> int:
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record as it is stored in a TFRecord file (what tests and tools write)."""
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked_crc(length)) + record + struct.pack("<I", masked_crc(record))


def scan(file: IO[bytes], path: str, size: int) -> np.ndarray:
    """The offsets of every record of ``file`` (``size`` bytes) and, last, ``size``: record ``k`` is
    bytes ``[offsets[k], offsets[k + 1])``. Checks each length's CRC and that no record is cut short."""
    offsets: list[int] = []
    buffer, buffer_start = b"", 0  # the bytes read so far from buffer_start on; file is at its end
    position = 0
    while position < size:
        if position + HEADER > buffer_start + len(buffer):
            if position >= buffer_start + len(buffer):
                file.seek(position)
                buffer = b""
            else:
                buffer = buffer[position - buffer_start:]
            buffer += file.read(SCAN_CHUNK)
            buffer_start = position
        at = position - buffer_start
        header = buffer[at:at + HEADER]
        where = f"{path}: record {len(offsets)} at byte {position}"
        if len(header) < HEADER:
            raise DataError(f"{where}: truncated: {size - position} bytes left, a record header needs {HEADER}")
        length, crc = struct.unpack("<QI", header)
        if masked_crc(header[:8]) != crc:
            if position == 0 and header.startswith(_GZIP_MAGIC):
                raise DataError(f"{path}: a gzip-compressed TFRecord file: not supported, decompress it first")
            raise DataError(f"{where}: the length's CRC does not match (a corrupt file, or not a TFRecord file)")
        end = position + HEADER + length + FOOTER
        if end > size:
            raise DataError(f"{where}: truncated: the record needs {HEADER + length + FOOTER} bytes, {size - position} are left")
        offsets.append(position)
        position = end
    offsets.append(size)
    return np.asarray(offsets, dtype=np.int64)


def unframe(chunk: bytes, offsets: np.ndarray, path: str, first: int) -> list[bytes]:
    """The records' data in ``chunk``, which holds the records whose offsets (relative to the chunk,
    plus the end) are ``offsets``; ``first`` is the first one's number in its file (for errors)."""
    records: list[bytes] = []
    view = memoryview(chunk)
    for k in range(len(offsets) - 1):
        start, end = int(offsets[k]), int(offsets[k + 1])
        length, _ = struct.unpack_from("<QI", chunk, start)
        if length != end - start - HEADER - FOOTER:
            raise DataError(f"{path}: record {first + k}: its length changed since the file was indexed")
        data = bytes(view[start + HEADER:end - FOOTER])
        (crc,) = struct.unpack_from("<I", chunk, end - FOOTER)
        if masked_crc(data) != crc:
            raise DataError(f"{path}: record {first + k}: the data's CRC does not match (a corrupt record)")
        records.append(data)
    return records


class TFRecordReader:
    """A TFRecord file or a glob of them; features are the records' bytes, labels None."""

    def __init__(self, path: str, options: ReaderOptions = ReaderOptions()) -> None:
        self._paths = resolve(path)
        self._offsets = [self._index(p, options) for p in self._paths]
        self._files = Files([len(o) - 1 for o in self._offsets])
        self._handles: dict[int, IO[bytes]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _index(path: str, options: ReaderOptions) -> np.ndarray:
        try:
            stamp = storage.fingerprint(path)
        except OSError as err:
            raise DataError(f"{path}: cannot read: {err}") from None

        def build() -> np.ndarray:
            try:
                with storage.open_input(path) as file:
                    return scan(file, path, stamp.size)
            except OSError as err:
                raise DataError(f"{path}: cannot read: {err}") from None

        return index_cache.offsets(INDEX_KIND, path, stamp, options.index_dir, build)

    @property
    def num_records(self) -> int:
        return self._files.total

    def read(self, start: int, end: int) -> tuple[np.ndarray, Labels]:
        records: list[bytes] = []
        with self._lock:
            for piece in self._files.split(start, end):
                offsets = self._offsets[piece.file][piece.start:piece.end + 1]
                records += unframe(self._chunk(piece.file, offsets), offsets - offsets[0], self._paths[piece.file], piece.start)
        features = np.empty(len(records), dtype=object)
        features[:] = records
        return features, None

    def _chunk(self, file: int, offsets: np.ndarray) -> bytes:
        path = self._paths[file]
        begin, size = int(offsets[0]), int(offsets[-1] - offsets[0])
        try:
            handle = self._handles.get(file)
            if handle is None:
                handle = self._handles[file] = storage.open_input(path)
            handle.seek(begin)
            chunk = handle.read(size)
        except OSError as err:
            raise DataError(f"{path}: cannot read: {err}") from None
        if len(chunk) != size:
            raise DataError(f"{path}: truncated since it was indexed: {len(chunk)} of {size} bytes at byte {begin}")
        return chunk
