"""The parquet reader on files written here: records across row groups and files, only the needed
columns read, label types, and malformed files -> one DataError naming the file (and the column)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elasticps.data.parquet import ParquetReader
from elasticps.data.readers import DataError, ReaderOptions, open_reader


def table(n: int, start: int = 0) -> pa.Table:
    k = np.arange(start, start + n)
    return pa.table({"f": k.astype(np.float64) / 2, "i": k.astype(np.int32), "b": k % 2 == 0,
                     "y": (k % 3).astype(np.int64), "z": k.astype(np.float32) / 4, "s": [f"r{v}" for v in k]})


def write(path: Path, data: pa.Table, group: int = 4) -> str:
    pq.write_table(data, path, row_group_size=group)
    return str(path)


def test_records_across_row_groups_and_files(tmp_path: Path) -> None:
    write(tmp_path / "p-0.parquet", table(10), group=4)  # groups of 4, 4, 2
    write(tmp_path / "p-1.parquet", table(0, 10))
    write(tmp_path / "p-2.parquet", table(5, 10), group=3)
    reader = open_reader("parquet", str(tmp_path / "p-*.parquet"), ReaderOptions(label_column="y", feature_columns=("f", "i", "b")))
    assert reader.num_records == 15
    assert reader.column_names == ("f", "i", "b")
    features, labels = reader.read(0, 15)
    k = np.arange(15)
    np.testing.assert_array_equal(features, np.column_stack([k / 2, k, k % 2 == 0]).astype(np.float32))
    assert features.dtype == np.float32 and labels.dtype == np.int64
    assert labels.tolist() == (k % 3).tolist()
    for start, end in [(3, 9), (7, 8), (9, 14), (0, 0), (14, 15)]:
        x, y = reader.read(start, end)
        np.testing.assert_array_equal(x[:, 1], k[start:end])
        assert y.tolist() == (k[start:end] % 3).tolist()


def test_float_labels_and_no_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "d.parquet", table(6).drop_columns(["s"]))
    labels = open_reader("parquet", path, ReaderOptions(label_column="z")).read(0, 6)[1]
    assert labels.dtype == np.float32 and labels.tolist() == [k / 4 for k in range(6)]
    features, none = open_reader("parquet", path, ReaderOptions()).read(2, 4)
    assert none is None and features.shape == (2, 5)


def test_only_the_needed_row_groups_and_columns_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "d.parquet", table(20), group=5)
    reader = ParquetReader(path, ReaderOptions(label_column="y", feature_columns=("i",)))
    calls: list[tuple[int, tuple[str, ...]]] = []
    real = pq.ParquetFile.read_row_group

    def spy(self: pq.ParquetFile, i: int, columns: list[str], **kwargs: object) -> pa.Table:
        calls.append((i, tuple(columns)))
        return real(self, i, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    reader.read(6, 12)
    assert calls == [(1, ("i", "y")), (2, ("i", "y"))]
    reader.read(12, 14)  # the last group read is kept
    assert len(calls) == 2


# ---- malformed data ---------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.parquet: no such file"):
        open_reader("parquet", str(tmp_path / "nope.parquet"))


def test_empty_glob(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"\*.parquet: no file matches"):
        open_reader("parquet", str(tmp_path / "*.parquet"))


def test_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="d.parquet: not a readable Parquet file"):
        open_reader("parquet", str(path))


def test_a_truncated_parquet_file(tmp_path: Path) -> None:
    path = Path(write(tmp_path / "d.parquet", table(10)))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataError, match="d.parquet: not a readable Parquet file"):
        open_reader("parquet", str(path))


def test_a_text_feature_column(tmp_path: Path) -> None:
    path = write(tmp_path / "d.parquet", table(4))
    with pytest.raises(DataError, match="d.parquet: column 's' is string, not a number"):
        open_reader("parquet", path, ReaderOptions(label_column="y"))


def test_a_column_that_is_not_there(tmp_path: Path) -> None:
    path = write(tmp_path / "d.parquet", table(4))
    with pytest.raises(DataError, match=r"d.parquet: no label column 'click' \(columns: f, i, b, y, z, s\)"):
        open_reader("parquet", path, ReaderOptions(label_column="click"))


def test_null_cells(tmp_path: Path) -> None:
    path = write(tmp_path / "d.parquet", pa.table({"x": [1.0, None, 3.0], "y": [0, 1, 0]}), group=2)
    reader = open_reader("parquet", path, ReaderOptions(label_column="y"))
    assert reader.read(2, 3)[1].tolist() == [0]
    with pytest.raises(DataError, match="d.parquet: row group 0: column 'x' has 1 null cells"):
        reader.read(0, 3)


def test_files_of_a_glob_with_other_columns(tmp_path: Path) -> None:
    write(tmp_path / "p-0.parquet", table(3))
    write(tmp_path / "p-1.parquet", table(3).drop_columns(["z"]))
    with pytest.raises(DataError, match="p-1.parquet: its columns differ from .*p-0.parquet's"):
        open_reader("parquet", str(tmp_path / "p-*.parquet"))
