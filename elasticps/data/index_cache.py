"""Record-offset indexes, built once per file version and kept in memory and in a cache folder.

Callers: the tfrecord and csv readers, whose files have no table of contents: finding record ``k``
needs the byte offset of every record, which takes one pass over the file. The pass is done once:
the offsets are kept in this process and written to ``index_dir`` (``spec.data.indexDir``, by
default ``~/.cache/elasticps/data-index``), never beside the data, which may be read-only or in an
object store. An entry is keyed by the kind of index, the file's path or URI, its size and its
version stamp (mtime or etag), so a changed file is indexed again, never read through a stale index.

The cache is an optimisation: a folder that cannot be written, or an entry that cannot be read
back, is logged and ignored.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from elasticps.files import atomic_writer
from elasticps.storage import Fingerprint

log = logging.getLogger(__name__)

_memory: dict[str, np.ndarray] = {}
_lock = threading.Lock()


def cache_key(kind: str, path: str, stamp: Fingerprint) -> str:
    return f"{kind}\n{path}\n{stamp.size}\n{stamp.version}"


def offsets(kind: str, path: str, stamp: Fingerprint, index_dir: Path | None, build: Callable[[], np.ndarray]) -> np.ndarray:
    """The index of ``path`` at version ``stamp``: from memory, else from ``index_dir``, else
    ``build()`` (then kept in both). ``build`` raises the reader's DataError for a bad file."""
    key = cache_key(kind, path, stamp)
    with _lock:
        found = _memory.get(key)
    if found is not None:
        return found
    entry = index_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.npz" if index_dir else None
    index = _load(entry, key) if entry is not None else None
    if index is None:
        index = build()
        if entry is not None:
            _save(entry, key, index)
    index.setflags(write=False)
    with _lock:
        _memory[key] = index
    return index


def _load(entry: Path, key: str) -> np.ndarray | None:
    if not entry.is_file():
        return None
    try:
        with np.load(entry, allow_pickle=False) as data:
            stored, index = str(data["key"]), data["offsets"]
    except (OSError, ValueError, KeyError) as err:
        log.warning("ignoring the unreadable index cache entry %s: %s", entry, err)
        return None
    if stored != key or index.ndim != 1 or index.dtype != np.int64:
        log.warning("ignoring the index cache entry %s: it is not the index of this file version", entry)
        return None
    return np.asarray(index)


def _save(entry: Path, key: str, index: np.ndarray) -> None:
    try:
        with atomic_writer(entry) as (file, _):
            np.savez(file, key=np.array(key), offsets=index)
    except OSError as err:
        log.warning("index not cached (kept in memory only): cannot write %s: %s", entry, err)


def forget() -> None:
    """Drops the in-memory indexes (tests)."""
    with _lock:
        _memory.clear()
