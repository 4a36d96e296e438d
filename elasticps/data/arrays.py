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
    def __init__(self, path: str, options: ReaderOptions = ReaderOptions()) -> None:
        try:
            loaded = np.load(path, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):  # a single .npy array
                raise DataError(f"{path}: not an .npz archive (arrays 'x' and 'y')")
            with loaded as data:
                if "x" not in data or "y" not in data:
                    raise DataError(f"{path}: needs arrays 'x' and 'y', has {sorted(data.files)}")
                self._x = data["x"]
                self._y = data["y"]
        except (OSError, ValueError) as err:
            if isinstance(err, DataError):
                raise
            raise DataError(f"{path}: cannot read: {err}") from None
        if len(self._x) != len(self._y):
            raise DataError(f"{path}: {len(self._x)} features but {len(self._y)} labels")

    @property
    def num_records(self) -> int:
        return len(self._x)

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        return self._x[start:end], self._y[start:end]
