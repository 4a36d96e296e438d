"""``idx`` and ``npz``: arrays in local files, loaded whole on the first read.

Callers: the registry (``readers``).

* ``idx``: MNIST-style idx files (optionally gzipped): ``{path}-images-idx3-ubyte[.gz]`` and
  ``{path}-labels-idx1-ubyte[.gz]``, e.g. path ``../shared/data/mnist/train``;
* ``npz``: a numpy ``.npz`` file with arrays ``x`` (features) and ``y`` (labels), what tests write.
"""

from __future__ import annotations

import gzip
import math
import struct
import zipfile
from pathlib import Path

import numpy as np

from elasticps.data.api import DataError, ReaderOptions


def _idx_file(prefix: str, stem: str) -> Path:
    for suffix in ("", ".gz"):
        candidate = Path(f"{prefix}-{stem}{suffix}")
        if candidate.is_file():
            return candidate
    raise DataError(f"{prefix}-{stem}[.gz]: no such file")


class IdxReader:
    _IMAGES, _LABELS = 2051, 2049

    def __init__(self, prefix: str, options: ReaderOptions = ReaderOptions()) -> None:
        self._images_path = _idx_file(prefix, "images-idx3-ubyte")
        self._labels_path = _idx_file(prefix, "labels-idx1-ubyte")
        self._images: np.ndarray | None = None
        self._labels: np.ndarray | None = None
        count, dims = self._header(self._images_path, self._IMAGES)
        labels, _ = self._header(self._labels_path, self._LABELS)
        if count != labels:
            raise DataError(f"{self._images_path}: {count} images but {labels} labels")
        self._count = count
        self._record_size = math.prod(dims)  # bytes (pixels) per image

    @staticmethod
    def _header(path: Path, magic: int) -> tuple[int, tuple[int, ...]]:
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rb") as f:
                head = f.read(16 if magic == IdxReader._IMAGES else 8)
        except (OSError, EOFError) as err:
            raise DataError(f"{path}: cannot read: {err}") from None
        dims = 3 if magic == IdxReader._IMAGES else 1
        if len(head) < 4 + 4 * dims:
            raise DataError(f"{path}: too short for an idx header")
        found, *shape = struct.unpack(f">I{dims}I", head[: 4 + 4 * dims])
        if found != magic:
            raise DataError(f"{path}: magic {found}, expected {magic}")
        return shape[0], tuple(shape[1:])

    @property
    def num_records(self) -> int:
        return self._count

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        if self._images is None or self._labels is None:
            images = self._body(self._images_path, 16)
            labels = self._body(self._labels_path, 8)
            # Checked before the reshape: a truncated (or padded) file must not fail with a bare
            # ValueError, nor silently give images of the wrong size.
            if images.size != self._count * self._record_size:
                raise DataError(
                    f"{self._images_path}: {images.size} bytes of images, its header says "
                    f"{self._count} x {self._record_size}"
                )
            if labels.size != self._count:
                raise DataError(f"{self._labels_path}: {labels.size} labels, its header says {self._count}")
            self._images = images.reshape(self._count, self._record_size)
            self._labels = labels.astype(np.int64)
        return self._images, self._labels

    @staticmethod
    def _body(path: Path, offset: int) -> np.ndarray:
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rb") as f:
                data = f.read()
        except (OSError, EOFError) as err:
            raise DataError(f"{path}: cannot read: {err}") from None
        return np.frombuffer(data, dtype=np.uint8, offset=offset)

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        images, labels = self._load()
        return images[start:end], labels[start:end]


class NpzReader:
    """An .npz archive's arrays ``x`` (features) and ``y`` (labels). Opening it reads their headers
    only: the record count is all the coordinator and ``elasticps run`` ask for, and a PS should not
    hold the data (it stayed resident in its heap); the arrays are loaded at the first read."""

    def __init__(self, path: str, options: ReaderOptions = ReaderOptions()) -> None:
        self._path = path
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        try:
            with zipfile.ZipFile(path) as archive:
                names = sorted(name[: -len(".npy")] for name in archive.namelist() if name.endswith(".npy"))
                if "x" not in names or "y" not in names:
                    raise DataError(f"{path}: needs arrays 'x' and 'y', has {names}")
                self._count, labels = (_leading_dimension(archive, name) for name in ("x", "y"))
        except zipfile.BadZipFile:
            raise DataError(f"{path}: cannot read: not an .npz archive (arrays 'x' and 'y')") from None
        except (OSError, ValueError) as err:
            raise DataError(f"{path}: cannot read: {err}") from None
        if self._count != labels:
            raise DataError(f"{path}: {self._count} features but {labels} labels")

    @property
    def num_records(self) -> int:
        return self._count

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            try:
                with np.load(self._path, allow_pickle=False) as data:
                    x, y = data["x"], data["y"]
            except (OSError, ValueError, zipfile.BadZipFile) as err:
                raise DataError(f"{self._path}: cannot read: {err}") from None
            if len(x) != self._count or len(y) != self._count:
                raise DataError(f"{self._path}: changed since it was opened ({len(x)}, {len(y)} records, not {self._count})")
            self._arrays = x, y
        return self._arrays

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self._load()
        return x[start:end], y[start:end]


def _leading_dimension(archive: zipfile.ZipFile, name: str) -> int:
    """The first dimension of array ``name`` of an .npz archive, from its header alone (ValueError
    for a scalar, or objects that only unpickling would load)."""
    with archive.open(f"{name}.npy") as member:
        version = np.lib.format.read_magic(member)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(member)
    if dtype.hasobject:
        raise ValueError(f"array {name!r} holds Python objects (pickled): not loaded")
    if not shape:
        raise ValueError(f"array {name!r} has no records (a scalar)")
    return int(shape[0])
