"""The tfrecord reader on files written here (by the tests' own framing and, once, by TensorFlow):
records numbered across a glob, the offset index and its cache, and every malformed file -> DataError."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tfrecord_framing as framing
from elasticps.data import index_cache
from elasticps.data.readers import DataError, ReaderOptions, open_reader
from elasticps.data.tfrecord import TFRecordReader, frame, masked_crc


@pytest.fixture(autouse=True)
def fresh_memory() -> None:
    index_cache.forget()


def options(tmp_path: Path) -> ReaderOptions:
    return ReaderOptions(index_dir=tmp_path / "index")


def shards(directory: Path, sizes: list[int]) -> list[bytes]:
    """Files ``train-<i>.tfrecord`` with ``sizes[i]`` records; all records in order."""
    directory.mkdir(exist_ok=True)
    everything: list[bytes] = []
    for i, n in enumerate(sizes):
        records = framing.payloads(f"f{i}", n)
        framing.write(directory / f"train-{i:02d}.tfrecord", records)
        everything += records
    return everything


def test_masked_crc_agrees_with_a_second_implementation() -> None:
    for data in (b"", b"a", b"123456789", bytes(range(256)) * 5):
        assert masked_crc(data) == framing.masked(data)
        assert frame(data) == framing.record(data)


def test_a_glob_is_one_dataset_numbered_across_files(tmp_path: Path) -> None:
    everything = shards(tmp_path / "data", [3, 0, 5, 1])
    reader = open_reader("tfrecord", str(tmp_path / "data" / "train-*.tfrecord"), options(tmp_path))
    assert reader.num_records == 9
    features, labels = reader.read(0, 9)
    assert labels is None
    assert features.dtype == object and features.shape == (9,)
    assert list(features) == everything
    for start, end in [(2, 4), (3, 8), (8, 9), (0, 0), (4, 4), (1, 9)]:
        assert list(reader.read(start, end)[0]) == everything[start:end], (start, end)


def test_one_file_and_an_empty_file(tmp_path: Path) -> None:
    path = framing.write(tmp_path / "one.tfrecord", framing.payloads("x", 4))
    assert TFRecordReader(str(path), options(tmp_path)).num_records == 4
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    reader = TFRecordReader(str(empty), options(tmp_path))
    assert reader.num_records == 0
    assert reader.read(0, 0)[0].shape == (0,)


def test_a_range_outside_the_records_is_refused(tmp_path: Path) -> None:
    path = framing.write(tmp_path / "one.tfrecord", framing.payloads("x", 4))
    with pytest.raises(DataError, match=r"records \[2, 5\) are outside \[0, 4\)"):
        TFRecordReader(str(path)).read(2, 5)


# ---- the index and its cache ------------------------------------------------------------------------


def test_the_index_is_cached_in_its_folder_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards(tmp_path / "data", [2, 3])
    pattern = str(tmp_path / "data" / "*.tfrecord")
    TFRecordReader(pattern, options(tmp_path))
    assert len(list((tmp_path / "index").iterdir())) == 2
    assert sorted(os.listdir(tmp_path / "data")) == ["train-00.tfrecord", "train-01.tfrecord"]  # nothing beside the data
    index_cache.forget()
    from elasticps.data import tfrecord

    def no_scan(*args: object) -> np.ndarray:
        raise AssertionError("the cached index should have been used")

    monkeypatch.setattr(tfrecord, "scan", no_scan)
    assert TFRecordReader(pattern, options(tmp_path)).num_records == 5


def test_a_changed_file_is_indexed_again(tmp_path: Path) -> None:
    path = framing.write(tmp_path / "d.tfrecord", framing.payloads("a", 3))
    assert TFRecordReader(str(path), options(tmp_path)).num_records == 3
    framing.write(path, framing.payloads("b", 5))
    os.utime(path, ns=(1, 1))  # even with an old mtime: the size differs
    assert TFRecordReader(str(path), options(tmp_path)).num_records == 5
    framing.write(path, framing.payloads("c", 5)[::-1])  # same size, new mtime
    reader = TFRecordReader(str(path), options(tmp_path))
    assert list(reader.read(0, 5)[0]) == framing.payloads("c", 5)[::-1]


def test_read_only_data_and_an_unwritable_cache_folder_still_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shards(data, [3])
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    data.chmod(0o555)
    try:
        reader = TFRecordReader(str(data / "*.tfrecord"), ReaderOptions(index_dir=blocker / "index"))
        assert reader.num_records == 3
    finally:
        data.chmod(0o755)


def test_a_corrupt_cache_entry_is_ignored(tmp_path: Path) -> None:
    path = framing.write(tmp_path / "d.tfrecord", framing.payloads("a", 3))
    TFRecordReader(str(path), options(tmp_path))
    for entry in (tmp_path / "index").iterdir():
        entry.write_bytes(b"garbage")
    index_cache.forget()
    assert TFRecordReader(str(path), options(tmp_path)).num_records == 3


def test_indexing_a_file_larger_than_the_scan_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elasticps.data import tfrecord

    monkeypatch.setattr(tfrecord, "SCAN_CHUNK", 37)  # headers and records straddle every chunk
    records = framing.payloads("big", 60) + [b"z" * 500]
    path = framing.write(tmp_path / "d.tfrecord", records)
    reader = TFRecordReader(str(path))
    assert reader.num_records == 61
    assert list(reader.read(0, 61)[0]) == records


# ---- TensorFlow compatibility (a subprocess: this test process stays free of TensorFlow) -----------

TF_SCRIPT = """
import sys, numpy as np, tensorflow as tf
from elasticps.data.tfrecord import TFRecordReader
written, ours = sys.argv[1], sys.argv[2]
with tf.io.TFRecordWriter(written) as w:
    for k in range(7):
        ex = tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[k, k / 2])),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[k % 3]))}))
        w.write(ex.SerializeToString())
features, labels = TFRecordReader(written).read(2, 6)
assert labels is None
parsed = tf.io.parse_example(features.tolist(), {"x": tf.io.FixedLenFeature([2], tf.float32),
                                                 "y": tf.io.FixedLenFeature([], tf.int64)})
np.testing.assert_allclose(parsed["x"].numpy(), [[k, k / 2] for k in range(2, 6)])
assert parsed["y"].numpy().tolist() == [k % 3 for k in range(2, 6)]
theirs = [r.numpy() for r in tf.data.TFRecordDataset(ours)]
assert theirs == list(TFRecordReader(ours).read(0, len(theirs))[0]) and len(theirs) == 9
print("compatible")
"""


def test_files_written_by_tensorflow_and_files_read_by_tensorflow(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    ours = framing.write(tmp_path / "ours.tfrecord", framing.payloads("t", 9))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", TF_SCRIPT, str(tmp_path / "tf.tfrecord"), str(ours)],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert done.returncode == 0 and "compatible" in done.stdout, done.stderr[-3000:]


def test_the_reader_modules_never_import_tensorflow() -> None:
    code = "import sys, elasticps.data.readers, elasticps.ps.main; print('tensorflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


# ---- malformed files: one DataError naming the file -------------------------------------------------


def corrupt(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file") as raised:
        TFRecordReader(str(tmp_path / "nope.tfrecord"))
    assert str(tmp_path / "nope.tfrecord") in str(raised.value)


def test_empty_glob(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"train-\*\.tfrecord: no file matches"):
        TFRecordReader(str(tmp_path / "train-*.tfrecord"))


def test_a_folder_instead_of_a_file(tmp_path: Path) -> None:
    (tmp_path / "folder.tfrecord").mkdir()
    with pytest.raises(DataError, match="folder.tfrecord: cannot read"):
        TFRecordReader(str(tmp_path / "folder.tfrecord"))


def test_a_csv_file_given_as_tfrecord(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text("a,b,label\n" + "1,2,0\n" * 50)
    with pytest.raises(DataError, match=r"train.csv: record 0 at byte 0: the length's CRC does not match .*not a TFRecord"):
        TFRecordReader(str(path))


def test_a_gzip_compressed_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "train.tfrecord.gz"
    path.write_bytes(gzip.compress(b"".join(framing.record(r) for r in framing.payloads("g", 5))))
    with pytest.raises(DataError, match="train.tfrecord.gz: a gzip-compressed TFRecord file: not supported"):
        TFRecordReader(str(path))


def test_a_corrupt_length_names_the_record_and_its_offset(tmp_path: Path) -> None:
    records = framing.payloads("c", 5)
    path = framing.write(tmp_path / "d.tfrecord", records)
    offset = sum(len(framing.record(r)) for r in records[:2])
    corrupt(path, offset + 1)
    with pytest.raises(DataError, match=f"d.tfrecord: record 2 at byte {offset}: the length's CRC does not match"):
        TFRecordReader(str(path))


def test_a_corrupt_length_crc(tmp_path: Path) -> None:
    path = framing.write(tmp_path / "d.tfrecord", framing.payloads("c", 3))
    corrupt(path, 9)
    with pytest.raises(DataError, match="record 0 at byte 0: the length's CRC"):
        TFRecordReader(str(path))


def test_corrupt_data_is_found_when_read(tmp_path: Path) -> None:
    records = framing.payloads("c", 5)
    path = framing.write(tmp_path / "d.tfrecord", records)
    offset = sum(len(framing.record(r)) for r in records[:3])
    corrupt(path, offset + 12 + 1)  # a byte of record 3's data
    reader = TFRecordReader(str(path))  # the index checks the lengths only
    assert list(reader.read(0, 3)[0]) == records[:3]
    with pytest.raises(DataError, match="d.tfrecord: record 3: the data's CRC does not match"):
        reader.read(2, 5)


def test_a_corrupt_data_crc(tmp_path: Path) -> None:
    path = framing.write(tmp_path / "d.tfrecord", framing.payloads("c", 2))
    corrupt(path, path.stat().st_size - 1)
    with pytest.raises(DataError, match="record 1: the data's CRC"):
        TFRecordReader(str(path)).read(0, 2)


@pytest.mark.parametrize("cut", [1, 4, 5, 20], ids=["footer-byte", "footer", "data-byte", "most-of-a-record"])
def test_a_truncated_record(tmp_path: Path, cut: int) -> None:
    records = [b"a" * 10, b"b" * 30]
    path = framing.write(tmp_path / "d.tfrecord", records)
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(DataError, match=f"d.tfrecord: record 1 at byte {len(framing.record(records[0]))}: truncated"):
        TFRecordReader(str(path))


@pytest.mark.parametrize("left", [1, 8, 11])
def test_a_truncated_header(tmp_path: Path, left: int) -> None:
    path = framing.write(tmp_path / "d.tfrecord", [b"abc"])
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + framing.record(b"next")[:left])
    with pytest.raises(DataError, match=f"record 1 at byte {size}: truncated: {left} bytes left, a record header needs 12"):
        TFRecordReader(str(path))


def test_a_file_that_shrank_after_indexing(tmp_path: Path) -> None:
    path = framing.write(tmp_path / "d.tfrecord", framing.payloads("s", 6))
    reader = TFRecordReader(str(path))
    path.write_bytes(path.read_bytes()[:30])
    with pytest.raises(DataError, match="d.tfrecord: truncated since it was indexed"):
        reader.read(0, 6)


def test_a_length_that_changed_after_indexing(tmp_path: Path) -> None:
    path = framing.write(tmp_path / "d.tfrecord", [b"abcd", b"efgh"])
    reader = TFRecordReader(str(path))
    path.write_bytes(framing.record(b"abcdefgh") + struct.pack("<I", 0) * 4)  # same size, other framing
    with pytest.raises(DataError, match="record 0: its length changed since the file was indexed"):
        reader.read(0, 2)


def test_a_path_under_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # examples/mnist-tfrecord.yaml reads ~/.cache/elasticps/data/mnist-tfrecord/train-*.tfrecord.
    monkeypatch.setenv("HOME", str(tmp_path))
    everything = shards(tmp_path / "data", [2, 3])
    reader = open_reader("tfrecord", "~/data/train-*.tfrecord", options(tmp_path))
    assert reader.num_records == 5
    assert list(reader.read(0, 5)[0]) == everything
    assert open_reader("tfrecord", "~/data/train-01.tfrecord", options(tmp_path)).num_records == 3
    with pytest.raises(DataError, match="no file matches"):
        open_reader("tfrecord", "~/nothing/train-*.tfrecord", options(tmp_path))
