"""``elasticps.backends.keras.mnist_tfrecord`` on generated idx files: its TFRecord shards parse, record for
record, with the zoo module's ``dataset_fn``; a second run leaves them alone."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import tensorflow as tf

from elasticps import Metadata, Mode
from elasticps.backends.keras.mnist_tfrecord import convert
from elasticps.backends.keras.zoo.mnist_functional import dataset_fn


def write_idx(prefix: Path, images: np.ndarray, labels: np.ndarray) -> None:
    with gzip.open(f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, len(images), 28, 28) + images.tobytes())
    with gzip.open(f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, len(labels)) + labels.tobytes())


def generated(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, 28, 28), dtype=np.uint8), rng.integers(0, 10, count, dtype=np.uint8)


def test_the_shards_parse_with_the_modules_dataset_fn(tmp_path: Path) -> None:
    mnist, out = tmp_path / "mnist", tmp_path / "out"
    mnist.mkdir()
    splits = {"train": generated(300, 0), "test": generated(50, 1)}
    write_idx(mnist / "train", *splits["train"])
    write_idx(mnist / "t10k", *splits["test"])

    convert(mnist, out, shards=3)

    for split, (images, labels) in splits.items():
        files = sorted(str(p) for p in out.glob(f"{split}-*.tfrecord"))
        assert len(files) == 3
        records = tf.data.TFRecordDataset(files)  # in order: the shards split the records in order
        parsed = dataset_fn(records, Mode.EVALUATION, Metadata())
        x, y = parsed.batch(1000).get_single_element()
        np.testing.assert_allclose(x["image"].numpy() * 255.0, images, atol=1e-3)
        np.testing.assert_array_equal(y.numpy().reshape(-1), labels)
        only_features = dataset_fn(records, Mode.PREDICTION, Metadata()).batch(1000).get_single_element()
        assert set(only_features) == {"image"}

    written = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    convert(mnist, out, shards=3)  # idempotent: everything there, nothing rewritten
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == written
    assert not list(out.glob("*.partial"))


def test_the_one_process_reference_trains_on_the_shards(tmp_path: Path) -> None:
    from bench.one_process import records, train

    mnist, out = tmp_path / "mnist", tmp_path / "out"
    mnist.mkdir()
    write_idx(mnist / "train", *generated(64, 0))
    write_idx(mnist / "t10k", *generated(32, 1))
    convert(mnist, out, shards=2)
    result = train(
        "elasticps.backends.keras.zoo.mnist_functional",
        records("tfrecord", str(out / "train-*.tfrecord")),
        records("tfrecord", str(out / "test-*.tfrecord")),
        updates=5,
        minibatch=16,
    )
    assert (result["updates"], result["epochs"]) == (5, 2)
    assert set(result["metrics"]) == {"loss", "accuracy"} and 0 <= result["metrics"]["accuracy"] <= 1
