"""Data in an object store: a REAL S3-compatible server (moto's, a separate process on loopback)
holds TFRecord, CSV and Parquet files that the readers read through ``s3://`` URIs; ``storage.upload``
puts a local folder there. Also ``storage`` on local paths.

The server and a bucket per test are the fixtures ``s3_endpoint`` and ``s3_bucket`` of
``tests/conftest.py`` (moto runs from its own virtual environment, ``hack/s3/moto.sh``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrecord_framing as framing
from elasticps import storage
from elasticps.data.readers import DataError, ReaderOptions, open_reader


def put(local: Path, uri: str) -> None:
    storage.upload(local, uri)


def test_tfrecord_glob_csv_and_parquet_in_s3(tmp_path: Path, s3_bucket: str) -> None:
    local = tmp_path / "local"
    (local / "tf").mkdir(parents=True)
    everything: list[bytes] = []
    for i, n in enumerate([3, 4, 2]):
        records = framing.payloads(f"s{i}", n)
        framing.write(local / "tf" / f"train-{i}.tfrecord", records)
        everything += records
    (local / "tf" / "README").write_text("not part of the glob")
    (local / "table.csv").write_text("a,b,y\n1,2,0\n3,4,1\n5,6,0\n")
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0, 4.0], "y": [1, 0, 1, 0]}), local / "table.parquet", row_group_size=3)
    put(local, f"s3://{s3_bucket}/data")

    options = ReaderOptions(index_dir=tmp_path / "index", label_column="y")
    tf = open_reader("tfrecord", f"s3://{s3_bucket}/data/tf/train-*.tfrecord", options)
    assert tf.num_records == 9
    assert list(tf.read(0, 9)[0]) == everything
    assert list(tf.read(2, 5)[0]) == everything[2:5]
    assert len(list((tmp_path / "index").iterdir())) == 3  # indexes cached locally, nothing written to the bucket

    table = open_reader("csv", f"s3://{s3_bucket}/data/table.csv", options)
    features, labels = table.read(1, 3)
    np.testing.assert_array_equal(features, [[3, 4], [5, 6]])
    assert labels.tolist() == [1, 0]

    parquet = open_reader("parquet", f"s3://{s3_bucket}/data/table.parquet", options)
    features, labels = parquet.read(2, 4)
    np.testing.assert_array_equal(features, [[3], [4]])
    assert labels.tolist() == [1, 0]


def test_a_changed_object_is_indexed_again(tmp_path: Path, s3_bucket: str) -> None:
    local = tmp_path / "local"
    local.mkdir()
    framing.write(local / "d.tfrecord", framing.payloads("a", 2))
    put(local, f"s3://{s3_bucket}")
    uri = f"s3://{s3_bucket}/d.tfrecord"
    first = storage.fingerprint(uri)
    assert open_reader("tfrecord", uri, ReaderOptions(index_dir=tmp_path / "index")).num_records == 2
    framing.write(local / "d.tfrecord", framing.payloads("b", 5))
    put(local, f"s3://{s3_bucket}")
    assert storage.fingerprint(uri) != first
    assert open_reader("tfrecord", uri, ReaderOptions(index_dir=tmp_path / "index")).num_records == 5


def test_missing_objects_and_empty_globs_in_s3(s3_bucket: str) -> None:
    with pytest.raises(DataError, match=f"s3://{s3_bucket}/nope.csv: no such file"):
        open_reader("csv", f"s3://{s3_bucket}/nope.csv")
    with pytest.raises(DataError, match=rf"s3://{s3_bucket}/train-\*.tfrecord: no file matches"):
        open_reader("tfrecord", f"s3://{s3_bucket}/train-*.tfrecord")


def test_upload_copies_a_folder_tree_to_s3(tmp_path: Path, s3_bucket: str) -> None:
    model = tmp_path / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"\x00pb")
    (model / "variables" / "variables.index").write_bytes(b"index")
    storage.upload(model, f"s3://{s3_bucket}/models/run-1/")
    found = storage.glob(f"s3://{s3_bucket}/models/run-1/**")
    assert found == [f"s3://{s3_bucket}/models/run-1/saved_model.pb", f"s3://{s3_bucket}/models/run-1/variables/variables.index"]
    with storage.open_input(f"s3://{s3_bucket}/models/run-1/variables/variables.index") as f:
        assert f.read() == b"index"
    assert storage.exists(f"s3://{s3_bucket}/models/run-1/saved_model.pb")
    assert not storage.exists(f"s3://{s3_bucket}/models/run-2/saved_model.pb")


def test_download_is_the_reverse_of_upload(tmp_path: Path, s3_bucket: str) -> None:
    model = tmp_path / "model"
    (model / "saved_model" / "variables").mkdir(parents=True)
    (model / "model.keras").write_bytes(b"zip")
    (model / "saved_model" / "variables" / "variables.index").write_bytes(b"index")
    storage.upload(model, f"s3://{s3_bucket}/models/run-1")
    storage.download(f"s3://{s3_bucket}/models/run-1/", tmp_path / "back")
    assert sorted(p.relative_to(tmp_path / "back").as_posix() for p in (tmp_path / "back").rglob("*") if p.is_file()) == [
        "model.keras", "saved_model/variables/variables.index"]
    assert (tmp_path / "back" / "saved_model" / "variables" / "variables.index").read_bytes() == b"index"
    with pytest.raises(FileNotFoundError, match="no such folder"):
        storage.download(f"s3://{s3_bucket}/models/run-2", tmp_path / "none")


def test_an_upload_into_a_missing_bucket_fails_and_creates_none(tmp_path: Path, s3_bucket: str) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "f").write_text("x")
    with pytest.raises(OSError, match="not-a-bucket"):
        storage.upload(tmp_path / "m", "s3://not-a-bucket/models/run-1")
    assert not storage.exists("s3://not-a-bucket/models/run-1/f")
    storage.check_output("s3://not-a-bucket/models/run-1")  # the cheap check cannot tell: the write does


# ---- storage on local paths -------------------------------------------------------------------------


def test_is_remote() -> None:
    assert storage.is_remote("s3://b/k") and storage.is_remote("gs://b/k") and storage.is_remote("S3://b/k")
    assert not storage.is_remote("/data/train") and not storage.is_remote("file:///data/train")
    assert not storage.is_remote("relative/path:with-colon")


def test_local_upload_glob_fingerprint(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    (source / "a" / "x.bin").write_bytes(b"12345")
    (source / "top.txt").write_text("t")
    target = tmp_path / "out" / "model"
    storage.upload(source, str(target))
    storage.upload(source, f"file://{target}")  # again: files replaced, no error
    assert (target / "a" / "x.bin").read_bytes() == b"12345" and (target / "top.txt").read_text() == "t"
    assert storage.glob(str(target / "*")) == [str(target / "top.txt")]  # folders left out
    stamp = storage.fingerprint(str(target / "a" / "x.bin"))
    assert stamp.size == 5
    os.utime(target / "a" / "x.bin", ns=(5, 5))
    assert storage.fingerprint(str(target / "a" / "x.bin")) != stamp
    with pytest.raises(NotADirectoryError):
        storage.upload(source / "top.txt", str(tmp_path / "nowhere"))
    shutil.rmtree(target)
    assert not storage.exists(str(target))


def test_check_output(tmp_path: Path) -> None:
    storage.check_output(str(tmp_path / "new" / "deeper" / "model"))  # made when written
    storage.check_output(f"file://{tmp_path}")
    storage.check_output("s3://bucket/models/x")
    storage.check_output("memory://models/x")  # any scheme fsspec knows
    (tmp_path / "file").write_text("x")
    with pytest.raises(storage.OutputError, match=r"file/model: cannot make a folder under .*/file, a file"):
        storage.check_output(f"file://{tmp_path}/file/model")
    with pytest.raises(storage.OutputError, match="file: not a folder"):
        storage.check_output(str(tmp_path / "file"))
    with pytest.raises(storage.OutputError, match=r"nope://x/y: no storage for nope://"):
        storage.check_output("nope://x/y")
