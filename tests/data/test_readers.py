"""Record readers on small files written here: idx (plain and gzipped) and npz; bad files -> DataError."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from elasticps.api.spec import DataReader
from elasticps.data.readers import DataError, IdxReader, NpzReader, open_reader

IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049


def images_bytes(images: np.ndarray, magic: int = IMAGES_MAGIC, count: int | None = None) -> bytes:
    n, rows, cols = images.shape
    return struct.pack(">IIII", magic, n if count is None else count, rows, cols) + images.astype(np.uint8).tobytes()


def labels_bytes(labels: np.ndarray, magic: int = LABELS_MAGIC, count: int | None = None) -> bytes:
    return struct.pack(">II", magic, len(labels) if count is None else count) + labels.astype(np.uint8).tobytes()


def write(path: Path, data: bytes, gz: bool) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def sample(n: int = 5, rows: int = 3, cols: int = 4) -> tuple[np.ndarray, np.ndarray]:
    images = (np.arange(n * rows * cols) % 251).astype(np.uint8).reshape(n, rows, cols)
    labels = (np.arange(n) * 3 % 10).astype(np.uint8)
    return images, labels


def write_idx(
    directory: Path, images: np.ndarray, labels: np.ndarray, gz_images: bool = False, gz_labels: bool = False
) -> str:
    prefix = directory / "train"
    write(Path(f"{prefix}-images-idx3-ubyte"), images_bytes(images), gz_images)
    write(Path(f"{prefix}-labels-idx1-ubyte"), labels_bytes(labels), gz_labels)
    return str(prefix)


# ---- idx -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gz_images", "gz_labels"), [(False, False), (True, True), (True, False)], ids=["plain", "gz", "mixed"]
)
def test_idx_reads_records(tmp_path: Path, gz_images: bool, gz_labels: bool) -> None:
    images, labels = sample()
    reader = IdxReader(write_idx(tmp_path, images, labels, gz_images, gz_labels))
    assert reader.num_records == 5
    x, y = reader.read(1, 4)
    assert x.shape == (3, 12)
    assert x.dtype == np.uint8
    np.testing.assert_array_equal(x, images[1:4].reshape(3, 12))
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, [3, 6, 9])
    x_all, y_all = reader.read(0, 5)
    np.testing.assert_array_equal(x_all, images.reshape(5, 12))
    np.testing.assert_array_equal(y_all, labels)


def test_open_reader_idx(tmp_path: Path) -> None:
    images, labels = sample()
    reader = open_reader(DataReader.IDX, write_idx(tmp_path, images, labels))
    assert reader.num_records == 5
    np.testing.assert_array_equal(reader.read(4, 5)[1], [2])


def test_idx_with_no_records(tmp_path: Path) -> None:
    images, labels = sample(n=0)
    reader = IdxReader(write_idx(tmp_path, images, labels))
    assert reader.num_records == 0
    x, y = reader.read(0, 0)
    assert x.shape == (0, 12)
    assert y.shape == (0,)


def test_idx_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file") as raised:
        IdxReader(str(tmp_path / "nothing"))
    assert str(tmp_path / "nothing") in str(raised.value)
    images, _ = sample()
    Path(f"{tmp_path}/only-images-idx3-ubyte").write_bytes(images_bytes(images))
    with pytest.raises(DataError, match="labels-idx1-ubyte"):
        IdxReader(str(tmp_path / "only"))


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_idx_wrong_magic(tmp_path: Path, gz: bool) -> None:
    images, labels = sample()
    prefix = tmp_path / "train"
    bad = write(Path(f"{prefix}-images-idx3-ubyte"), images_bytes(images, magic=LABELS_MAGIC), gz)
    write(Path(f"{prefix}-labels-idx1-ubyte"), labels_bytes(labels), gz)
    with pytest.raises(DataError, match=f"magic {LABELS_MAGIC}, expected {IMAGES_MAGIC}") as raised:
        IdxReader(str(prefix))
    assert str(raised.value).startswith(str(bad))


def test_idx_wrong_labels_magic(tmp_path: Path) -> None:
    images, labels = sample()
    prefix = tmp_path / "train"
    write(Path(f"{prefix}-images-idx3-ubyte"), images_bytes(images), False)
    write(Path(f"{prefix}-labels-idx1-ubyte"), labels_bytes(labels, magic=0x0801_0000), False)
    with pytest.raises(DataError, match="labels-idx1-ubyte: magic"):
        IdxReader(str(prefix))


def test_idx_count_mismatch(tmp_path: Path) -> None:
    images, labels = sample()
    prefix = write_idx(tmp_path, images, labels[:4])
    with pytest.raises(DataError, match="5 images but 4 labels"):
        IdxReader(prefix)


def test_idx_header_too_short(tmp_path: Path) -> None:
    prefix = tmp_path / "train"
    Path(f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">II", IMAGES_MAGIC, 5))
    Path(f"{prefix}-labels-idx1-ubyte").write_bytes(labels_bytes(sample()[1]))
    with pytest.raises(DataError, match="too short"):
        IdxReader(str(prefix))


@pytest.mark.parametrize("missing_bytes", [1, 12, 13], ids=["one-byte", "one-record", "one-record-and-a-byte"])
def test_idx_truncated_images(tmp_path: Path, missing_bytes: int) -> None:
    images, labels = sample()
    prefix = tmp_path / "train"
    Path(f"{prefix}-images-idx3-ubyte").write_bytes(images_bytes(images)[:-missing_bytes])
    Path(f"{prefix}-labels-idx1-ubyte").write_bytes(labels_bytes(labels))
    reader = IdxReader(str(prefix))  # the header is fine: the body is checked when first read
    with pytest.raises(DataError, match="images-idx3-ubyte"):
        reader.read(0, 1)


def test_idx_images_with_trailing_bytes(tmp_path: Path) -> None:
    images, labels = sample()
    prefix = tmp_path / "train"
    Path(f"{prefix}-images-idx3-ubyte").write_bytes(images_bytes(images) + b"\x00" * 12)
    Path(f"{prefix}-labels-idx1-ubyte").write_bytes(labels_bytes(labels))
    with pytest.raises(DataError, match="images-idx3-ubyte"):
        IdxReader(str(prefix)).read(0, 1)


def test_idx_truncated_labels(tmp_path: Path) -> None:
    images, labels = sample()
    prefix = tmp_path / "train"
    Path(f"{prefix}-images-idx3-ubyte").write_bytes(images_bytes(images))
    Path(f"{prefix}-labels-idx1-ubyte").write_bytes(labels_bytes(labels)[:-2])
    with pytest.raises(DataError):
        IdxReader(str(prefix)).read(0, 1)


def test_idx_corrupt_gzip(tmp_path: Path) -> None:
    prefix = tmp_path / "train"
    Path(f"{prefix}-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b not really gzip")
    Path(f"{prefix}-labels-idx1-ubyte").write_bytes(labels_bytes(sample()[1]))
    with pytest.raises(DataError, match="cannot read"):
        IdxReader(str(prefix))


# ---- npz ------------------------------------------------------------------------------------------------


def test_npz_reads_records(tmp_path: Path) -> None:
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    y = np.array([0, 1, 1, 0, 1, 0])
    path = tmp_path / "train.npz"
    np.savez(path, x=x, y=y)
    for reader in (NpzReader(str(path)), open_reader(DataReader.NPZ, str(path))):
        assert reader.num_records == 6
        xs, ys = reader.read(2, 5)
        np.testing.assert_array_equal(xs, x[2:5])
        np.testing.assert_array_equal(ys, y[2:5])
        assert xs.dtype == np.float32


def test_npz_compressed(tmp_path: Path) -> None:
    path = tmp_path / "train.npz"
    np.savez_compressed(path, x=np.ones((3, 2)), y=np.zeros(3))
    assert NpzReader(str(path)).num_records == 3


def test_npz_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read") as raised:
        NpzReader(str(tmp_path / "nope.npz"))
    assert str(tmp_path / "nope.npz") in str(raised.value)


def test_npz_without_labels(tmp_path: Path) -> None:
    path = tmp_path / "train.npz"
    np.savez(path, x=np.ones((3, 2)), labels=np.zeros(3))
    with pytest.raises(DataError, match="needs arrays 'x' and 'y', has \\['labels', 'x'\\]"):
        NpzReader(str(path))


def test_npz_length_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "train.npz"
    np.savez(path, x=np.ones((3, 2)), y=np.zeros(4))
    with pytest.raises(DataError, match="3 features but 4 labels"):
        NpzReader(str(path))


def test_npz_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "train.npz"
    path.write_text("x,y\n1,2\n")
    with pytest.raises(DataError, match="cannot read"):
        NpzReader(str(path))


def test_npz_given_a_single_npy_file(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.ones(3))
    with pytest.raises(DataError):
        NpzReader(str(path))


def test_npz_with_pickled_objects_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "train.npz"
    np.savez(path, x=np.array([{"a": 1}, None], dtype=object), y=np.zeros(2))
    with pytest.raises(DataError, match="cannot read"):
        NpzReader(str(path))


def test_npz_counts_from_headers_and_a_corrupt_body_is_a_data_error_at_the_first_read(tmp_path: Path) -> None:
    """Opening reads the arrays' headers only (the count the coordinator needs, no data held); the
    arrays are loaded at the first read, where bytes that do not match the archive's checksum are a
    DataError, not a traceback."""
    path = tmp_path / "train.npz"
    x = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    np.savez(path, x=x, y=np.zeros(1000))
    raw = bytearray(path.read_bytes())
    body = raw.find(x.tobytes()[:64])
    raw[body + 100 : body + 108] = b"\xff" * 8  # inside x's data, past its header
    path.write_bytes(bytes(raw))
    reader = NpzReader(str(path))
    assert reader.num_records == 1000
    with pytest.raises(DataError, match="cannot read"):
        reader.read(0, 10)
