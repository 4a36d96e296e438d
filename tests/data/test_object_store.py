"""Data in an object store: a REAL S3-compatible server (moto's, a separate process on loopback)
holds TFRecord, CSV and Parquet files that the readers read through ``s3://`` URIs; ``storage.upload``
puts a local folder there. Also ``storage`` on local paths.

moto runs from its own virtual environment (``hack/s3/moto.sh``, built on first use): it needs
botocore, whose ``python-dateutil<3`` pin clashes with the kubernetes client in the project's one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrecord_framing as framing
from elasticps import storage
from elasticps.data import index_cache
from elasticps.data.readers import DataError, ReaderOptions, open_reader

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    built = subprocess.run(["bash", str(ROOT / "hack/s3/moto.sh")], capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        pytest.skip(f"no moto server (hack/s3/moto.sh failed: {built.stderr.strip()[-300:]})")
    port = free_port()
    server = subprocess.Popen([built.stdout.strip(), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("moto server did not start")
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new bucket on the server, and the AWS environment a pod template would set."""
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    storage._s3.cache_clear()
    index_cache.forget()
    name = request.node.name.replace("_", "-")[:50].strip("-").lower()
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{name}", method="PUT"), timeout=10).close()
    yield name
    storage._s3.cache_clear()


def put(local: Path, uri: str) -> None:
    storage.upload(local, uri)


def test_tfrecord_glob_csv_and_parquet_in_s3(tmp_path: Path, bucket: str) -> None:
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
    put(local, f"s3://{bucket}/data")

    options = ReaderOptions(index_dir=tmp_path / "index", label_column="y")
    tf = open_reader("tfrecord", f"s3://{bucket}/data/tf/train-*.tfrecord", options)
    assert tf.num_records == 9
    assert list(tf.read(0, 9)[0]) == everything
    assert list(tf.read(2, 5)[0]) == everything[2:5]
    assert len(list((tmp_path / "index").iterdir())) == 3  # indexes cached locally, nothing written to the bucket

    table = open_reader("csv", f"s3://{bucket}/data/table.csv", options)
    features, labels = table.read(1, 3)
    np.testing.assert_array_equal(features, [[3, 4], [5, 6]])
    assert labels.tolist() == [1, 0]

    parquet = open_reader("parquet", f"s3://{bucket}/data/table.parquet", options)
    features, labels = parquet.read(2, 4)
    np.testing.assert_array_equal(features, [[3], [4]])
    assert labels.tolist() == [1, 0]


def test_a_changed_object_is_indexed_again(tmp_path: Path, bucket: str) -> None:
    local = tmp_path / "local"
    local.mkdir()
    framing.write(local / "d.tfrecord", framing.payloads("a", 2))
    put(local, f"s3://{bucket}")
    uri = f"s3://{bucket}/d.tfrecord"
    first = storage.fingerprint(uri)
    assert open_reader("tfrecord", uri, ReaderOptions(index_dir=tmp_path / "index")).num_records == 2
    framing.write(local / "d.tfrecord", framing.payloads("b", 5))
    put(local, f"s3://{bucket}")
    assert storage.fingerprint(uri) != first
    assert open_reader("tfrecord", uri, ReaderOptions(index_dir=tmp_path / "index")).num_records == 5


def test_missing_objects_and_empty_globs_in_s3(bucket: str) -> None:
    with pytest.raises(DataError, match=f"s3://{bucket}/nope.csv: no such file"):
        open_reader("csv", f"s3://{bucket}/nope.csv")
    with pytest.raises(DataError, match=rf"s3://{bucket}/train-\*.tfrecord: no file matches"):
        open_reader("tfrecord", f"s3://{bucket}/train-*.tfrecord")


def test_upload_copies_a_folder_tree_to_s3(tmp_path: Path, bucket: str) -> None:
    model = tmp_path / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"\x00pb")
    (model / "variables" / "variables.index").write_bytes(b"index")
    storage.upload(model, f"s3://{bucket}/models/run-1/")
    found = storage.glob(f"s3://{bucket}/models/run-1/**")
    assert found == [f"s3://{bucket}/models/run-1/saved_model.pb", f"s3://{bucket}/models/run-1/variables/variables.index"]
    with storage.open_input(f"s3://{bucket}/models/run-1/variables/variables.index") as f:
        assert f.read() == b"index"
    assert storage.exists(f"s3://{bucket}/models/run-1/saved_model.pb")
    assert not storage.exists(f"s3://{bucket}/models/run-2/saved_model.pb")


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
