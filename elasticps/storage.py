"""Files where users keep them: a local path, or an object-store URI such as ``s3://bucket/prefix/x``.

Callers: the data readers (open, glob, fingerprint), whatever writes results out (``upload`` of
a local folder, e.g. an exported model; ``check_output`` before it starts) and whatever reads them
back (``download``). Local paths are plain file I/O; a path with a scheme
(``scheme://...``, ``file://`` excepted) is remote and goes through fsspec.

``s3://`` (and ``s3a://``) use Arrow's own S3 client (``pyarrow.fs.S3FileSystem``, behind fsspec's
``ArrowFSWrapper``) rather than s3fs: s3fs needs botocore, which pins ``python-dateutil<3``, and the
kubernetes client (>=37) needs ``python-dateutil>=3``, so the two cannot share one environment;
pyarrow is here anyway for parquet. The client is configured by the standard AWS environment that a
pod template sets: ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``; any S3-compatible server, e.g.
MinIO, ``http://minio.storage:9000``), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optionally
``AWS_SESSION_TOKEN`` and ``AWS_REGION``/``AWS_DEFAULT_REGION``; without keys the SDK's usual chain
(instance or web-identity roles) applies. Other schemes (``gs://``, ``abfs://``, ...) work through
fsspec when their implementation (gcsfs, adlfs, ...) is installed in the image.

Buckets are never created: an output in a bucket that does not exist (a typo, another account's)
is an error when the files are written, not a new bucket.

Errors are ``OSError``s (``FileNotFoundError`` for a missing file); callers add their own context.
:func:`check_output` is the cheap check of an output before a job starts (``elasticps run``, PS 0
and the workers at start-up): a known scheme, or a local folder that can be made and written.
"""

from __future__ import annotations

import functools
import glob as local_glob
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_S3_SCHEMES = {"s3", "s3a"}


@dataclass(frozen=True)
class Fingerprint:
    """What identifies one version of a file: its size and a version stamp (mtime in ns, or an
    object store's etag when it reports one). A cache keyed by it is never reused for a changed file."""

    size: int
    version: str


def scheme(path: str) -> str:
    """``s3`` for ``s3://b/k``; ``""`` for a local path (``file://`` counts as local)."""
    match = _SCHEME.match(path)
    if match is None or match.group(1).lower() == "file":
        return ""
    return match.group(1).lower()


def is_remote(path: str) -> bool:
    """Whether ``path`` is an object-store URI rather than a local path."""
    return bool(scheme(path))


def expand_user(path: str) -> str:
    """``path`` with a leading ``~`` (or ``~user``) expanded, as a shell would; an object-store
    URI, a ``file://`` one and a path without ``~`` come back as they are. Each process expands it
    for itself (a data path of a TrainingJob means the home of the process that reads it)."""
    return path if is_remote(path) or not path.startswith("~") else os.path.expanduser(path)


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def _remote(uri: str) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of ``uri`` and the path inside it (``bucket/key`` for S3)."""
    kind = scheme(uri)
    if kind in _S3_SCHEMES:
        return _s3(), uri.split("://", 1)[1]
    import fsspec

    fs, inner = fsspec.core.url_to_fs(uri)
    return fs, inner


@functools.lru_cache(maxsize=1)
def _s3() -> AbstractFileSystem:
    from fsspec.implementations.arrow import ArrowFSWrapper
    from pyarrow import fs as arrow_fs

    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    s3 = arrow_fs.S3FileSystem(endpoint_override=endpoint, region=region, allow_bucket_creation=False)
    return ArrowFSWrapper(s3)


class OutputError(ValueError):
    """An output that cannot take files (one line, naming the output)."""


def check_output(path: str) -> None:
    """Raises :class:`OutputError` when files cannot go to ``path``, as far as a look that writes
    nothing tells: an object-store URI needs a scheme fsspec knows and can load; a local path must
    be a folder (or not exist yet) under a folder this process may write into. A missing bucket,
    wrong credentials or a full disk show only when the files are written."""
    kind = scheme(path)
    if kind in _S3_SCHEMES:
        return
    if kind:
        import fsspec

        try:
            fsspec.get_filesystem_class(kind)
        except (ValueError, ImportError) as err:
            raise OutputError(f"{path}: no storage for {kind}:// ({' '.join(str(err).split())})") from None
        return
    target = Path(_local(path)).absolute()
    if target.exists() and not target.is_dir():
        raise OutputError(f"{path}: not a folder")
    ancestor = target
    while not ancestor.exists():  # the nearest folder that exists: the rest is made under it
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"{path}: cannot make a folder under {ancestor}, a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: {ancestor} is not writable")


def _with_scheme(uri: str, inner: str) -> str:
    """``inner`` (a path as the filesystem spells it) back as a URI of ``uri``'s scheme."""
    prefix = uri.split("://", 1)[0]
    return f"{prefix}://{inner.lstrip('/')}" if scheme(uri) in _S3_SCHEMES else f"{prefix}://{inner}"


def open_input(path: str) -> IO[bytes]:
    """A seekable binary file to read. Each read of a remote file is one request: read in large
    pieces (the readers scan files in 8 MiB chunks)."""
    if not is_remote(path):
        return open(_local(path), "rb")
    fs, inner = _remote(path)
    handle: IO[bytes] = fs.open(inner, "rb")
    return handle


def copy_to_file(path: str, local: str | Path) -> None:
    """Copies the file ``path`` (a local path or an object-store URI) to the local file ``local``,
    8 MiB at a time (OSError when it cannot be read)."""
    with open_input(path) as source, open(local, "wb") as copy:
        while chunk := source.read(8 << 20):
            copy.write(chunk)


def fingerprint(path: str) -> Fingerprint:
    if not is_remote(path):
        stat = os.stat(_local(path))
        return Fingerprint(stat.st_size, str(stat.st_mtime_ns))
    fs, inner = _remote(path)
    info = fs.info(inner)
    if info.get("type") != "file":
        raise IsADirectoryError(f"{path}: not a file")
    stamp = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or ""
    return Fingerprint(int(info.get("size") or 0), str(stamp))


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(_local(path))
    fs, inner = _remote(path)
    return bool(fs.exists(inner))


def is_pattern(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def glob(pattern: str) -> list[str]:
    """The files matching ``pattern`` (``*``, ``?``, ``[...]``), sorted, as paths or URIs like the
    pattern; folders are left out."""
    if not is_remote(pattern):
        return sorted(p for p in local_glob.glob(_local(pattern)) if os.path.isfile(p))
    fs, inner = _remote(pattern)
    found = fs.glob(inner, detail=True)
    assert isinstance(found, dict)
    return sorted(_with_scheme(pattern, name) for name, info in found.items() if info.get("type") == "file")


def upload(local_dir: str | Path, uri: str) -> None:
    """Copies the folder ``local_dir`` recursively to ``uri``, a local path or an object-store URI
    (``s3://bucket/models/run-1``): ``local_dir/a/b`` becomes ``{uri}/a/b``. Existing files of the
    same names are replaced; others under ``uri`` are left alone."""
    source = Path(local_dir)
    if not source.is_dir():
        raise NotADirectoryError(f"{source}: not a folder")
    if not is_remote(uri):
        shutil.copytree(source, _local(uri), dirs_exist_ok=True)
        return
    fs, inner = _remote(uri)
    # The files of subfolders first, then the top-level ones: object stores have no atomic rename,
    # so a caller whose readers must see a whole folder uploads its marker file last, in a second call.
    files = sorted(
        (p for p in source.rglob("*") if p.is_file()),
        key=lambda p: (len(p.relative_to(source).parts) == 1, p.relative_to(source).as_posix()),
    )
    for file in files:
        relative = file.relative_to(source).as_posix()
        fs.put_file(str(file), f"{inner.rstrip('/')}/{relative}")


def download(uri: str, local_dir: str | Path) -> None:
    """Copies the folder ``uri`` (a local path or an object-store URI) into ``local_dir``, the
    reverse of :func:`upload`: ``{uri}/a/b`` becomes ``local_dir/a/b``. FileNotFoundError when
    nothing is there."""
    target = Path(local_dir)
    if not is_remote(uri):
        shutil.copytree(_local(uri), target, dirs_exist_ok=True)
        return
    fs, inner = _remote(uri)
    prefix = inner.rstrip("/")
    found = fs.find(prefix, detail=True)
    assert isinstance(found, dict)
    files = [name for name, info in found.items() if info.get("type") == "file"]
    if not files:
        raise FileNotFoundError(f"{uri}: no such folder")
    for name in files:
        relative = name.lstrip("/")[len(prefix.lstrip("/")):].lstrip("/")
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(name, str(destination))
