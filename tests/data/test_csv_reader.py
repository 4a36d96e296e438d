"""The csv and tsv readers on files written here: column roles, label types, the line index, and
every malformed file -> one DataError naming the file (and the line, record or column)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elasticps.data import index_cache
from elasticps.data.readers import DataError, ReaderOptions, open_reader
from elasticps.data.csv_reader import CsvReader


@pytest.fixture(autouse=True)
def fresh_memory() -> None:
    index_cache.forget()


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def opts(tmp_path: Path, **kwargs: object) -> ReaderOptions:
    return ReaderOptions(index_dir=tmp_path / "index", **kwargs)  # type: ignore[arg-type]


TABLE = "a,b,label\n1,2,0\n3.5,-4,1\n5,6e2,2\n"


def test_header_label_by_name_and_every_other_column_a_feature(tmp_path: Path) -> None:
    reader = open_reader("csv", write(tmp_path / "d.csv", TABLE), opts(tmp_path, label_column="label"))
    assert reader.num_records == 3
    features, labels = reader.read(0, 3)
    assert features.dtype == np.float32 and features.shape == (3, 2)
    np.testing.assert_array_equal(features, [[1, 2], [3.5, -4], [5, 600]])
    assert labels.dtype == np.int64
    assert labels.tolist() == [0, 1, 2]
    x, y = reader.read(1, 2)
    np.testing.assert_array_equal(x, [[3.5, -4]])
    assert y.tolist() == [1]


def test_feature_columns_by_name_in_their_order(tmp_path: Path) -> None:
    reader = open_reader("csv", write(tmp_path / "d.csv", TABLE), opts(tmp_path, label_column="a", feature_columns=("label", "b")))
    features, labels = reader.read(0, 2)
    assert reader.column_names == ("label", "b")
    np.testing.assert_array_equal(features, [[0, 2], [1, -4]])
    assert labels.dtype == np.float32 and labels.tolist() == [1, 3.5]  # 3.5 among the first labels: float


def test_float_labels_are_float32(tmp_path: Path) -> None:
    reader = open_reader("csv", write(tmp_path / "d.csv", "x,y\n1,0.5\n2,1.5\n3,2\n"), opts(tmp_path, label_column="y"))
    labels = reader.read(0, 3)[1]
    assert labels.dtype == np.float32 and labels.tolist() == [0.5, 1.5, 2.0]


def test_without_a_label_column_the_labels_are_none(tmp_path: Path) -> None:
    reader = open_reader("csv", write(tmp_path / "d.csv", TABLE), opts(tmp_path))
    features, labels = reader.read(0, 3)
    assert labels is None and features.shape == (3, 3)


def test_no_header_columns_by_index(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "1,2,0\n3,4,1\n")
    reader = open_reader("csv", path, opts(tmp_path, header=False, label_column="2", feature_columns=("1", "0")))
    assert reader.column_names is None
    features, labels = reader.read(0, 2)
    np.testing.assert_array_equal(features, [[2, 1], [4, 3]])
    assert labels.tolist() == [0, 1]


def test_tsv_and_other_delimiters(tmp_path: Path) -> None:
    tsv = open_reader("tsv", write(tmp_path / "d.tsv", "a\tb\n1\t2\n3\t4\n"), opts(tmp_path, label_column="b"))
    assert tsv.read(0, 2)[1].tolist() == [2, 4]
    semi = open_reader("csv", write(tmp_path / "d.csv", "a;b\n1;2\n"), opts(tmp_path, delimiter=";", label_column="a"))
    np.testing.assert_array_equal(semi.read(0, 1)[0], [[2]])
    tab = open_reader("csv", write(tmp_path / "t.csv", "a\tb\n1\t2\n"), opts(tmp_path, delimiter="\t"))
    np.testing.assert_array_equal(tab.read(0, 1)[0], [[1, 2]])


def test_crlf_blank_lines_bom_quotes_and_no_final_line_break(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(b'\xef\xbb\xbf"a","b"\r\n\r\n1,"2"\r\n\n\n3,4\r\n5,6')
    reader = open_reader("csv", str(path), opts(tmp_path, label_column="a"))
    assert reader.num_records == 3
    features, labels = reader.read(0, 3)
    np.testing.assert_array_equal(features, [[2], [4], [6]])
    assert labels.tolist() == [1, 3, 5]


def test_a_glob_of_files_is_one_dataset(tmp_path: Path) -> None:
    for i, rows in enumerate([["1,10", "2,20"], [], ["3,30"], ["4,40", "5,50", "6,60"]]):
        write(tmp_path / f"part-{i}.csv", "x,y\n" + "".join(r + "\n" for r in rows))
    reader = open_reader("csv", str(tmp_path / "part-*.csv"), opts(tmp_path, label_column="y"))
    assert reader.num_records == 6
    assert reader.read(0, 6)[1].tolist() == [10, 20, 30, 40, 50, 60]
    features, labels = reader.read(1, 5)
    assert features[:, 0].tolist() == [2, 3, 4, 5] and labels.tolist() == [20, 30, 40, 50]


def test_the_line_index_spans_scan_chunks_and_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elasticps.data import csv_reader

    monkeypatch.setattr(csv_reader, "SCAN_CHUNK", 10)
    rows = [f"{k},{k * k}" for k in range(200)]
    path = write(tmp_path / "d.csv", "k,sq\n" + "\n".join(rows) + "\n")
    reader = CsvReader(path, opts(tmp_path, label_column="sq"))
    assert reader.num_records == 200
    assert reader.read(150, 153)[1].tolist() == [150 ** 2, 151 ** 2, 152 ** 2]
    index_cache.forget()

    def no_scan(*args: object) -> np.ndarray:
        raise AssertionError("the cached index should have been used")

    monkeypatch.setattr(csv_reader, "scan", no_scan)
    assert CsvReader(path, opts(tmp_path, label_column="sq")).num_records == 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "index"]


# ---- malformed data ---------------------------------------------------------------------------------


def refused(tmp_path: Path, text: str | bytes, match: str, reader: str = "csv", **kwargs: object) -> DataError:
    path = tmp_path / "bad.csv"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(DataError, match=match) as raised:
        open_reader(reader, str(path), opts(tmp_path, **kwargs))
    assert str(path) in str(raised.value)
    assert "\n" not in str(raised.value)
    return raised.value


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.csv: no such file"):
        open_reader("csv", str(tmp_path / "nope.csv"))


def test_empty_glob(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"\*.csv: no file matches"):
        open_reader("csv", str(tmp_path / "*.csv"))


def test_a_file_without_any_line(tmp_path: Path) -> None:
    path = write(tmp_path / "empty.csv", "\n\n")
    with pytest.raises(DataError, match="empty.csv: no line in any file"):
        open_reader("csv", path)


def test_a_label_column_that_is_not_there(tmp_path: Path) -> None:
    refused(tmp_path, TABLE, r"bad.csv: no label column 'click' \(columns: a, b, label\)", label_column="click")


def test_a_feature_column_that_is_not_there(tmp_path: Path) -> None:
    refused(tmp_path, TABLE, "no feature column 'c'", label_column="label", feature_columns=("a", "c"))


def test_a_column_index_past_the_last_column(tmp_path: Path) -> None:
    refused(tmp_path, "1,2\n", "label column 5: the file has 2 columns", header=False, label_column="5")


def test_a_column_name_without_a_header(tmp_path: Path) -> None:
    refused(tmp_path, "1,2\n", "no label column 'y' .*no header", header=False, label_column="y")


def test_the_label_is_also_a_feature(tmp_path: Path) -> None:
    refused(tmp_path, TABLE, "column 'a' is both the label and a feature", label_column="a", feature_columns=("a", "b"))


def test_a_feature_column_listed_twice(tmp_path: Path) -> None:
    refused(tmp_path, TABLE, "a feature column is listed twice", feature_columns=("a", "0"))


def test_only_a_label_column(tmp_path: Path) -> None:
    refused(tmp_path, "y\n1\n", "no feature column", label_column="y")


def test_a_non_numeric_feature_cell_fails_at_open(tmp_path: Path) -> None:
    refused(tmp_path, "a,b\n1,2\n3,abc\n", r"bad.csv: record 1: column 'b': 'abc' is not a number")


def test_an_empty_cell(tmp_path: Path) -> None:
    refused(tmp_path, "a,b\n1,2\n3,\n", r"record 1: column 'b': '' is not a number")


def test_a_header_read_as_data(tmp_path: Path) -> None:
    refused(tmp_path, TABLE, r"record 0: column '0': 'a' is not a number", header=False)


@pytest.mark.parametrize("cell", ["nan", "inf", "-Infinity"])
def test_non_finite_cells(tmp_path: Path, cell: str) -> None:
    refused(tmp_path, f"a,b\n1,{cell}\n", f"record 0: column 'b': '{cell}' is not a finite number")


def test_a_non_finite_float_label(tmp_path: Path) -> None:
    refused(tmp_path, "a,y\n1,0.5\n2,nan\n", "record 1: column 'y': 'nan' is not a finite number", label_column="y")


def test_a_ragged_row_fails_at_open_naming_the_line(tmp_path: Path) -> None:
    text = "a,b,c\n" + "1,2,3\n" * 300 + "\n4,5\n" + "1,2,3\n"
    refused(tmp_path, text, r"bad.csv: line 303: 2 fields, expected 3 \(ragged rows\)")


def test_a_row_with_too_many_fields(tmp_path: Path) -> None:
    refused(tmp_path, "a,b\n1,2\n1,2,3\n", "line 3: 3 fields, expected 2")


def test_a_ragged_row_with_quotes_fails_when_read(tmp_path: Path) -> None:
    path = write(tmp_path / "q.csv", "a,b\n" + "1,2\n" * 200 + '"3",4,5\n')
    reader = open_reader("csv", path, opts(tmp_path))  # quoted lines are checked when read
    with pytest.raises(DataError, match=r"q.csv: record 200 \(byte \d+\): 3 fields, expected 2 \(ragged rows\)"):
        reader.read(190, 201)


def test_a_bad_cell_past_the_first_records_fails_the_read(tmp_path: Path) -> None:
    path = write(tmp_path / "late.csv", "a,y\n" + "1,0\n" * 500 + "x,1\n")
    reader = open_reader("csv", path, opts(tmp_path, label_column="y"))
    assert reader.read(0, 500)[0].shape == (500, 1)
    with pytest.raises(DataError, match=r"late.csv: record 500: column 'a': 'x' is not a number"):
        reader.read(480, 501)


def test_a_fractional_label_after_integer_ones(tmp_path: Path) -> None:
    path = write(tmp_path / "l.csv", "a,y\n" + "1,0\n" * 150 + "1,2.5\n")
    reader = open_reader("csv", path, opts(tmp_path, label_column="y"))
    with pytest.raises(DataError, match=r"l.csv: record 150: column 'y': '2.5' is not an integer"):
        reader.read(100, 151)


def test_a_quoted_line_break(tmp_path: Path) -> None:
    refused(tmp_path, 'a,b\n1,"2\n3"\n', "a quoted line break")


def test_an_unclosed_quote(tmp_path: Path) -> None:
    refused(tmp_path, 'a,b\n1,"2\n', "bad.csv: records 0-0")


def test_binary_data_given_as_csv(tmp_path: Path) -> None:
    refused(tmp_path, b"\x80\x81\x00\xff\n\x00\x01\n", "not UTF-8 text")


def test_a_tfrecord_file_given_as_csv(tmp_path: Path) -> None:
    from elasticps.data.tfrecord import frame

    refused(tmp_path, b"".join(frame(b"record %d" % k) for k in range(3)), "bad.csv: line 1: not UTF-8 text")


def test_headers_that_differ_across_a_glob(tmp_path: Path) -> None:
    write(tmp_path / "p-0.csv", "a,b\n1,2\n")
    write(tmp_path / "p-1.csv", "a,c\n1,2\n")
    with pytest.raises(DataError, match=r"p-1.csv: header \['a', 'c'\] differs from .*p-0.csv's \['a', 'b'\]"):
        open_reader("csv", str(tmp_path / "p-*.csv"))


def test_column_counts_that_differ_across_a_glob(tmp_path: Path) -> None:
    write(tmp_path / "p-0.csv", "1,2\n")
    write(tmp_path / "p-1.csv", "1,2,3\n")
    with pytest.raises(DataError, match="p-1.csv: line 1: 3 fields, expected 2"):
        open_reader("csv", str(tmp_path / "p-*.csv"), ReaderOptions(header=False))


def test_a_csv_given_the_wrong_delimiter(tmp_path: Path) -> None:
    refused(tmp_path, "a;b\n1;2\n", r"no label column 'b' \(columns: a;b\)", label_column="b")
