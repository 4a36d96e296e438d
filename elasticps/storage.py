"""Object stores: telling a URI from a local path, and copying a finished local folder to a URI.

Callers: the worker's exporter (``worker/exporting.py``) and ``elasticps export``: they write an
export into a local temporary folder and, when the output is remote (``s3://bucket/prefix``,
``gs://...``, ``memory://...``), hand the folder to :func:`upload`. fsspec does the copying and is
imported only then, so local jobs never need it; a scheme whose filesystem package is missing
(``s3fs`` for ``s3://``) raises :class:`StorageError` naming it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StorageError(OSError):
    """An upload that cannot be done; the message names the URI and why."""


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URI of another filesystem (``s3://...``); ``file://`` and plain paths
    are local."""
    found = _SCHEME.match(path)
    return found is not None and found.group(1).lower() != "file"


def upload(local_dir: str | os.PathLike[str], uri: str) -> None:
    """Copies every file under ``local_dir`` to ``uri`` (``local_dir/a/b`` -> ``uri/a/b``), the
    files of subfolders first, then the top-level ones, each in name order. Object stores have no
    atomic rename: a reader that must see a whole folder should look for a file the caller uploads
    last, in a second call."""
    try:
        import fsspec
    except ImportError as err:
        raise StorageError(f"{uri}: writing to an object store needs fsspec (pip install fsspec): {err}") from None
    root = Path(local_dir)
    files = sorted(
        (p for p in root.rglob("*") if p.is_file()),
        key=lambda p: (len(p.relative_to(root).parts) == 1, p.relative_to(root).as_posix()),
    )
    try:
        fs, base = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as err:  # an unknown scheme, or its package is not installed
        raise StorageError(f"{uri}: {err}") from None
    base = base.rstrip("/")
    for path in files:
        target = f"{base}/{path.relative_to(root).as_posix()}"
        try:
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(path), target)
        except OSError as err:
            raise StorageError(f"{uri}: cannot write {target}: {err}") from err
