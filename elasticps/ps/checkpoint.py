"""Parameter-server checkpoints: atomic, checksummed files in a simple own format (no pickle).

Role: persist one PS shard's state (variables, the model's non-trainable state, optimizer slots,
model version and a small JSON ``meta`` dict) so that a restarted PS resumes from the newest *good* checkpoint.

Callers: the PS's checkpoint schedule (``elasticps.ps.checkpointing``) calls :func:`save` from
its background writer every N model versions, handing it a snapshot (copies) of the shard's
arrays, and calls :func:`load_latest` once at start-up. :func:`load` and :func:`list_checkpoints` serve tools
and tests. A checkpoint directory belongs to one PS shard (one process) at a time.

File ``<dir>/ckpt-{version:012d}.eps``, all integers little-endian::

    b"EPSCKPT1"                 8-byte magic
    u64                         length H of the JSON header
    H bytes                     UTF-8 JSON: {"format": 1, "version": int, "meta": {...},
                                 "arrays": [{"name", "dtype" (numpy str, e.g. "<f4"),
                                             "shape", "offset", "nbytes"}, ...]}
    payload                     raw C-order array bytes, back to back, offsets relative
                                to the payload start
    32 bytes                    sha256 of everything before it

Durability: :func:`save` writes a temp file (``.ckpt-*.tmp``) in the same directory, flushes
and fsyncs it, ``os.replace``-s it onto the final name and fsyncs the directory, so the final
name only ever holds a complete file. Integrity: :func:`load` checks magic, lengths, header
structure, dtypes (plain numeric only: bool, int, uint, float, complex), sizes and the
checksum, and raises :class:`CheckpointError` naming the file and the reason;
:func:`load_latest` logs a warning for each corrupt checkpoint and falls back to older ones.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import math
import operator
import os
import re
import struct
import threading
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from elasticps.files import atomic_writer

__all__ = ["Checkpoint", "CheckpointError", "list_checkpoints", "load", "load_latest", "save", "verified"]

logger = logging.getLogger(__name__)

MAGIC = b"EPSCKPT1"
FORMAT_VERSION = 1
_LEN = struct.Struct("<Q")
_DIGEST_SIZE = hashlib.sha256().digest_size  # 32
_MIN_SIZE = len(MAGIC) + _LEN.size + _DIGEST_SIZE
_NUMERIC_KINDS = frozenset("biufc")
_CHUNK = 16 << 20  # bytes copied at a time while writing an array

_NAME_RE = re.compile(r"ckpt-(\d+)\.eps")
_TEMP_PREFIX = ".ckpt-"
_TEMP_SUFFIX = ".tmp"

# Temp files being written by save() calls of this process, never treated as stale.
_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()


class CheckpointError(Exception):
    """A checkpoint file that cannot be written or read back; the message names file and reason."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"checkpoint {os.fspath(path)}: {reason}")
        self.path = Path(path)
        self.reason = reason


@dataclass(frozen=True)
class Checkpoint:
    """One PS shard's state at a model version.

    ``arrays``: variables and optimizer state, any plain numeric dtype, any shape (0-d too).
    ``meta``: a small JSON-serialisable dict (str keys; tuples come back as lists).
    """

    version: int
    arrays: Mapping[str, npt.NDArray[Any]]
    meta: Mapping[str, Any]


def _checkpoint_path(directory: Path, version: int) -> Path:
    """The file name :func:`save` uses for ``version`` in ``directory``."""
    return Path(directory) / f"ckpt-{version:012d}.eps"


def _version_of(name: str) -> int | None:
    m = _NAME_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def path_of(directory: Path, version: int) -> Path:
    """Where the checkpoint of ``version`` is (or would be) in ``directory``."""
    return _checkpoint_path(directory, version)


def version_of(path: Path) -> int | None:
    """The version a checkpoint file's name says, or None for another file."""
    return _version_of(path.name)


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint files in ``directory``, newest (highest version in the name) first.

    Temp files and other names are ignored; a missing directory gives ``[]``.
    """
    directory = Path(directory)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[int, str]] = []
    for name in names:
        v = _version_of(name)
        if v is not None:
            found.append((v, name))
    found.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [directory / name for _, name in found]


# ---------------------------------------------------------------------------------- save


def _check_json(value: Any, where: str, target: Path) -> None:
    """Reject what JSON would not round-trip faithfully (non-str keys, numpy scalars ...)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]", target)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CheckpointError(target, f"{where} has a non-str key {key!r}")
            _check_json(item, f"{where}[{key!r}]", target)
        return
    raise CheckpointError(
        target, f"{where} is not JSON-serialisable (type {type(value).__name__})"
    )


def _write_array(f: BinaryIO, hasher: Any, arr: npt.NDArray[Any]) -> None:
    contiguous = arr if arr.flags.c_contiguous else arr.copy(order="C")
    flat = contiguous.reshape(-1).view(np.uint8)
    for start in range(0, flat.size, _CHUNK):
        # Hash and write the same bytes, so the file is self-consistent even if the caller
        # mutated the array meanwhile.
        chunk = flat[start : start + _CHUNK].tobytes()
        hasher.update(chunk)
        f.write(chunk)


def save(directory: Path, checkpoint: Checkpoint, keep: int = 3, protect: int | Collection[int] = 0) -> Path:
    """Write ``checkpoint`` atomically to ``directory/ckpt-{version:012d}.eps``; return its path.

    Creates ``directory`` if needed. Writes a temp file in the same directory, flushes, fsyncs,
    ``os.replace``-s it onto the final name and fsyncs the directory. Then deletes checkpoints
    beyond the ``keep`` newest (never the one just written, nor the versions ``protect`` names:
    the newest the whole job can restore, 0 for none, and the whole checkpoints that kept deltas
    are of) and stale temp files; failures of
    that clean-up are logged, not raised. Invalid content (negative version, non-numeric dtype,
    meta not JSON-serialisable) raises :class:`CheckpointError`; I/O errors propagate as
    ``OSError``. The arrays are read as given: pass a snapshot, not arrays being updated.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    directory = Path(directory)
    if isinstance(checkpoint.version, bool):
        raise CheckpointError(directory, f"version must be an int, got {checkpoint.version!r}")
    try:
        version = operator.index(checkpoint.version)
    except TypeError:
        raise CheckpointError(
            directory, f"version must be an int, got {checkpoint.version!r}"
        ) from None
    if version < 0:
        raise CheckpointError(directory, f"version must be >= 0, got {version}")
    final = _checkpoint_path(directory, version)

    if not isinstance(checkpoint.meta, Mapping):
        raise CheckpointError(
            final, f"meta must be a mapping, got {type(checkpoint.meta).__name__}"
        )
    _check_json(checkpoint.meta, "meta", final)

    arrays: list[tuple[str, npt.NDArray[Any]]] = []
    entries: list[dict[str, Any]] = []
    offset = 0
    for name, value in checkpoint.arrays.items():
        if not isinstance(name, str):
            raise CheckpointError(final, f"array name {name!r} is not a str")
        arr = np.asarray(value)
        if arr.dtype.kind not in _NUMERIC_KINDS or arr.dtype.fields is not None:
            raise CheckpointError(
                final, f"array {name!r} has non-numeric dtype {arr.dtype} (kind {arr.dtype.kind!r})"
            )
        nbytes = int(arr.nbytes)
        entries.append(
            {
                "name": name,
                "dtype": arr.dtype.str,
                "shape": [int(d) for d in arr.shape],
                "offset": offset,
                "nbytes": nbytes,
            }
        )
        arrays.append((name, arr))
        offset += nbytes

    header = {
        "format": FORMAT_VERSION,
        "version": version,
        "meta": dict(checkpoint.meta),
        "arrays": entries,
    }
    try:
        header_bytes = json.dumps(header, ensure_ascii=True).encode("utf-8")
    except (TypeError, ValueError) as e:  # pragma: no cover - _check_json catches these first
        raise CheckpointError(final, f"header is not JSON-serialisable: {e}") from e

    tmp_name = ""
    try:
        with atomic_writer(final, prefix=f"{_TEMP_PREFIX}{version:012d}.", suffix=_TEMP_SUFFIX) as (f, tmp):
            tmp_name = str(tmp)
            with _in_flight_lock:
                _in_flight.add(tmp_name)
            hasher = hashlib.sha256()
            for part in (MAGIC, _LEN.pack(len(header_bytes)), header_bytes):
                hasher.update(part)
                f.write(part)
            for _, arr in arrays:
                _write_array(f, hasher, arr)
            f.write(hasher.digest())
    finally:
        with _in_flight_lock:
            _in_flight.discard(tmp_name)

    protected = {protect} if isinstance(protect, int) else set(protect)
    _cleanup(directory, keep, final, {_checkpoint_path(directory, v).name for v in protected if v > 0})
    return final


def _cleanup(directory: Path, keep: int, just_written: Path, protected: Collection[str] = ()) -> None:
    for old in list_checkpoints(directory)[keep:]:
        if old.name == just_written.name or old.name in protected:
            continue
        try:
            old.unlink(missing_ok=True)
        except OSError as e:
            logger.warning("could not delete old checkpoint %s: %s", old, e)
    try:
        names = os.listdir(directory)
    except OSError as e:
        logger.warning("could not list checkpoint directory %s: %s", directory, e)
        return
    for name in names:
        if not (name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX)):
            continue
        tmp = os.path.join(directory, name)
        with _in_flight_lock:
            if tmp in _in_flight:
                continue
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("could not delete stale checkpoint temp file %s: %s", tmp, e)


# ---------------------------------------------------------------------------------- load


def _read_exact(f: io.BufferedReader, n: int, path: Path, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError(path, f"truncated while reading {what}")
    return data


def _readinto_exact(f: io.BufferedReader, view: memoryview, path: Path, what: str) -> None:
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise CheckpointError(path, f"truncated while reading {what}")
        done += n


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_Entry = tuple[str, np.dtype[Any], tuple[int, ...], int]  # name, dtype, shape, nbytes


def _parse_entry(i: int, entry: Any, expected_offset: int, path: Path) -> _Entry:
    if not isinstance(entry, dict):
        raise CheckpointError(path, f"bad header: arrays[{i}] is not an object")
    name = entry.get("name")
    if not isinstance(name, str):
        raise CheckpointError(path, f"bad header: arrays[{i}] has no str name")
    dtype_str = entry.get("dtype")
    if not isinstance(dtype_str, str):
        raise CheckpointError(path, f"bad header: array {name!r} has no str dtype")
    try:
        dtype = np.dtype(dtype_str)
    except (TypeError, ValueError, SyntaxError):
        raise CheckpointError(
            path, f"bad header: array {name!r} has invalid dtype {dtype_str!r}"
        ) from None
    if dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None or dtype.str != dtype_str:
        raise CheckpointError(
            path,
            f"bad header: array {name!r} has unsupported dtype {dtype_str!r} (plain numeric only)",
        )
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise CheckpointError(path, f"bad header: array {name!r} has invalid shape {shape!r}")
    offset, nbytes = entry.get("offset"), entry.get("nbytes")
    if not _is_int(offset) or offset != expected_offset:
        raise CheckpointError(
            path, f"bad header: array {name!r} offset {offset!r}, expected {expected_offset}"
        )
    expected_nbytes = math.prod(shape) * dtype.itemsize
    if not _is_int(nbytes) or nbytes != expected_nbytes:
        raise CheckpointError(
            path,
            f"bad header: array {name!r} nbytes {nbytes!r} does not match "
            f"shape {shape} x {dtype_str} = {expected_nbytes}",
        )
    return name, dtype, tuple(shape), expected_nbytes


def load(path: Path) -> Checkpoint:
    """Read and fully verify one checkpoint file; raise :class:`CheckpointError` if anything is off.

    Returns writable, owned, C-contiguous arrays (the PS updates them in place) and the meta as
    plain JSON types. If the file name has the ``ckpt-<version>.eps`` form, the version inside
    must match it.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _load(f, path)
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e.strerror or e}") from e


def verify(path: Path) -> Mapping[str, Any]:
    """Reads ``path`` through and checks it as :func:`load` does, without keeping its arrays (at
    most ``_CHUNK`` bytes held at a time); its meta, or :class:`CheckpointError` naming what is wrong."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _load(f, path, keep=False).meta
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e.strerror or e}") from e


def _load(f: io.BufferedReader, path: Path, keep: bool = True) -> Checkpoint:
    size = os.fstat(f.fileno()).st_size
    if size < _MIN_SIZE:
        raise CheckpointError(
            path, f"truncated: {size} bytes, a checkpoint has at least {_MIN_SIZE}"
        )
    hasher = hashlib.sha256()
    magic = _read_exact(f, len(MAGIC), path, "magic")
    if magic != MAGIC:
        raise CheckpointError(path, f"bad magic {magic!r}, expected {MAGIC!r}")
    raw_len = _read_exact(f, _LEN.size, path, "header length")
    (header_len,) = _LEN.unpack(raw_len)
    if header_len > size - _MIN_SIZE:
        raise CheckpointError(
            path, f"header length {header_len} does not fit in a {size}-byte file (truncated?)"
        )
    header_bytes = _read_exact(f, header_len, path, "header")
    for part in (magic, raw_len, header_bytes):
        hasher.update(part)

    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(path, f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "bad header: not a JSON object")
    if header.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            path, f"unsupported format {header.get('format')!r}, expected {FORMAT_VERSION}"
        )
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CheckpointError(path, f"bad header: invalid version {version!r}")
    name_version = _version_of(path.name)
    if name_version is not None and name_version != version:
        raise CheckpointError(
            path, f"file name says version {name_version} but the header says {version}"
        )
    meta = header.get("meta")
    if not isinstance(meta, dict):
        raise CheckpointError(path, "bad header: meta is not an object")
    entries = header.get("arrays")
    if not isinstance(entries, list):
        raise CheckpointError(path, "bad header: arrays is not a list")

    parsed: list[_Entry] = []
    seen: set[str] = set()
    offset = 0
    for i, entry in enumerate(entries):
        name, dtype, shape, nbytes = _parse_entry(i, entry, offset, path)
        if name in seen:
            raise CheckpointError(path, f"bad header: duplicate array name {name!r}")
        seen.add(name)
        parsed.append((name, dtype, shape, nbytes))
        offset += nbytes
    expected_size = len(MAGIC) + _LEN.size + header_len + offset + _DIGEST_SIZE
    if size != expected_size:
        raise CheckpointError(
            path,
            f"file is {size} bytes but its header describes {expected_size} "
            f"({'truncated' if size < expected_size else 'trailing garbage'})",
        )

    arrays: dict[str, npt.NDArray[Any]] = {}
    if not keep:  # verified only: the bytes go through the hash a chunk at a time
        scratch = memoryview(bytearray(min(_CHUNK, max(offset, 1))))
        left = offset
        while left:
            piece = scratch[: min(left, len(scratch))]
            _readinto_exact(f, piece, path, "arrays")
            hasher.update(piece)
            left -= len(piece)
        parsed = []
    for name, dtype, shape, _ in parsed:
        try:
            arr: npt.NDArray[Any] = np.empty(shape, dtype=dtype)
        except (ValueError, MemoryError) as e:
            raise CheckpointError(
                path, f"cannot allocate array {name!r} {shape} {dtype}: {e}"
            ) from None
        view = memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        _readinto_exact(f, view, path, f"array {name!r}")
        hasher.update(view)
        arrays[name] = arr
    digest = _read_exact(f, _DIGEST_SIZE, path, "checksum")
    if not hmac.compare_digest(digest, hasher.digest()):
        raise CheckpointError(path, "sha256 checksum mismatch (file corrupt)")
    return Checkpoint(version=version, arrays=arrays, meta=meta)


def verified(directory: Path) -> Iterator[Checkpoint]:
    """The checkpoints in ``directory`` that load and verify, newest first (none for a missing
    directory). Each corrupt one is reported with ``logging.warning`` (file and reason) and skipped."""
    for path in list_checkpoints(Path(directory)):
        try:
            found = load(path)
        except CheckpointError as e:
            logger.warning("skipping corrupt checkpoint %s: %s", path, e.reason)
            continue
        yield found


def load_latest(directory: Path) -> Checkpoint | None:
    """The newest checkpoint in ``directory`` that loads and verifies, or ``None``.

    ``None`` when the directory is missing, holds no checkpoints, or all of them are corrupt.
    Each corrupt checkpoint is reported with ``logging.warning`` (file and reason) and skipped
    in favour of the next older one (:func:`verified`).
    """
    latest = next(verified(directory), None)
    if latest is None:
        paths = list_checkpoints(Path(directory))
        if paths:
            logger.warning("no good checkpoint in %s (%d corrupt)", directory, len(paths))
    return latest
