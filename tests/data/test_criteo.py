"""Criteo's click-log TSV as embedding ids (``data/criteo.py``), on small files made here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elasticps.data.api import DataError, ReaderOptions
from elasticps.data.criteo import FIELDS, CriteoReader, bucket
from elasticps.data.readers import open_reader


def line(label: str = "0", ints: list[str] | None = None, cats: list[str] | None = None) -> str:
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *ints, *cats])


def write(tmp_path: Path, lines: list[str], name: str = "train.txt") -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_reads_labels_and_one_id_per_field(tmp_path: Path) -> None:
    rows = [line("1"), line("0", ints=[""] * 13, cats=[""] * 26), line("0", ints=["-1", "3", "1000", *["7"] * 10])]
    reader = open_reader("criteo", write(tmp_path, rows))
    assert reader.num_records == 3
    ids, labels = reader.read(0, 3)
    assert ids.shape == (3, FIELDS) and ids.dtype == np.int64
    assert labels.tolist() == [1, 0, 0] and labels.dtype == np.int64
    # Every field has its own ids: the same value (or an empty cell) in two fields differs.
    assert len(set(ids[1].tolist())) == FIELDS
    assert len(set(ids[0].tolist())) == FIELDS
    # Field I1: 0 in row 0, -1 in row 2: different buckets; I2: 1 and 3 (bucket 4) differ too.
    assert ids[0, 0] != ids[2, 0] and ids[0, 1] != ids[2, 1]
    # Reading in pieces gives the same records.
    parts = np.concatenate([reader.read(0, 1)[0], reader.read(1, 3)[0]])
    np.testing.assert_array_equal(parts, ids)


def test_buckets_are_logarithmic_and_never_collide_with_small_counts() -> None:
    assert [bucket(v) for v in (-2, 0, 1, 2, 3, 1000, 10**6)] == [-2, 0, 1, 2, 4, 50, 193]
    assert len({bucket(v) for v in range(-3, 3)} & {bucket(v) for v in range(3, 10**5, 97)}) == 0


def test_equal_values_give_equal_ids_across_files_and_readers(tmp_path: Path) -> None:
    a = CriteoReader(write(tmp_path, [line("0"), line("1")], "a.txt"))
    b = CriteoReader(write(tmp_path, [line("1")], "b.txt"))
    np.testing.assert_array_equal(a.read(1, 2)[0], b.read(0, 1)[0])


@pytest.mark.parametrize("bad, message", [
    (line("2"), "label '2' is not 0 or 1"),
    (line("0", ints=["x", *["1"] * 12]), "field I1: 'x' is not an integer"),
    (line("0", cats=["zz", *["0"] * 25]), "field C1: 'zz' is not a 32-bit hex value"),
    (line("0", cats=["1ffffffff", *["0"] * 25]), "field C1: '1ffffffff' is not a 32-bit hex value"),
])
def test_a_bad_cell_fails_the_read_naming_record_and_field(tmp_path: Path, bad: str, message: str) -> None:
    good = [line("0")] * 150  # past the records parsed when the file is opened
    reader = CriteoReader(write(tmp_path, [*good, bad]))
    with pytest.raises(DataError, match=f"record 150: {message}"):
        reader.read(140, 151)


def test_a_file_of_another_shape_is_refused_when_opened(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="line 1 has 3 fields; a Criteo line has 40"):
        CriteoReader(write(tmp_path, ["0\t1\t2"]), ReaderOptions())


def test_the_shared_criteo_sample_reads_if_present() -> None:
    path = Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo" / "criteo_train_head10k.txt"
    if not path.exists():
        pytest.skip("no ../shared/data/criteo beside the repository")
    reader = CriteoReader(str(path))
    ids, labels = reader.read(0, 2000)
    assert reader.num_records == 10_000 and ids.shape == (2000, FIELDS)
    assert 0.1 < labels.mean() < 0.4  # clicks are the minority
    assert len(np.unique(ids)) > 5000
