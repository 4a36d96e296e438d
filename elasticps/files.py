"""Atomic file writes: a reader sees the old file or the whole new one, and a crash loses neither.

Callers: PS checkpoints, the coordinator's journal, the PS's port file, the operator's request
counts, the benchmarks' port files. Each write goes to a temporary file in the same folder, is
flushed and fsynced, renamed over the target, and the folder is fsynced so the rename itself
survives a power cut.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(path: Path, *, prefix: str | None = None, suffix: str = ".tmp") -> Iterator[tuple[BinaryIO, Path]]:
    """Yields ``(file, temporary path)``; on a clean exit the file replaces ``path`` durably, on an
    exception the temporary file is removed and ``path`` is left as it was.

    ``prefix`` names the temporary file (default ``.{name}.``), so a caller can recognise and clean
    up temporaries a crash left behind.
    """
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=prefix if prefix is not None else f".{path.name}.", suffix=suffix, dir=folder)
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as file:
            yield file, temporary
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    fsync_folder(folder)


def write_atomically(path: Path, data: bytes | str) -> None:
    """Writes ``data`` (text as UTF-8) to ``path`` atomically and durably."""
    with atomic_writer(path) as (file, _):
        file.write(data.encode("utf-8") if isinstance(data, str) else data)


def fsync_folder(folder: Path) -> None:
    """Makes a rename or an unlink in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
