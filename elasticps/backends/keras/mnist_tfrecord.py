"""``make mnist-tfrecord``: MNIST's idx files as TFRecord shards of ``tf.train.Example``.

Writes ``{out}/train-{i:05d}-of-{n:05d}.tfrecord`` and ``{out}/test-...`` from
``{mnist}/train-*-idx*-ubyte[.gz]`` and ``{mnist}/t10k-*``, each record in the layout of
``elasticps.backends.keras.zoo.mnist_functional`` (:func:`~elasticps.backends.keras.zoo.mnist_functional.example`, ElasticDL's
MNIST layout), for ``examples/mnist-tfrecord.yaml``. The output lives outside the repository
(default ``~/.cache/elasticps/data/mnist-tfrecord``); a split whose shards are all there is
skipped, and shards are written under a temporary name and renamed, so a run that was interrupted
is finished by the next one. Imports TensorFlow (to write the files), as workers do.

    python -m elasticps.backends.keras.mnist_tfrecord [--mnist ../shared/data/mnist] [--out DIR] [--shards 4]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from elasticps.data.readers import IdxReader

DEFAULT_OUT = Path.home() / ".cache" / "elasticps" / "data" / "mnist-tfrecord"
SPLITS = {"train": "train", "test": "t10k"}  # output name: idx prefix


def shard_paths(out: Path, split: str, shards: int) -> list[Path]:
    return [out / f"{split}-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]


def write_split(images: np.ndarray, labels: np.ndarray, out: Path, split: str, shards: int) -> list[Path]:
    """Writes the records, in order, as ``shards`` files of nearly equal size; returns them.
    Files already there are kept (the split is written once)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from elasticps.backends.keras.zoo.mnist_functional import example

    out.mkdir(parents=True, exist_ok=True)
    paths = shard_paths(out, split, shards)
    bounds = np.linspace(0, len(images), shards + 1).astype(int)
    for path, start, end in zip(paths, bounds[:-1], bounds[1:]):
        if path.exists():
            continue
        partial = path.with_name(path.name + ".partial")
        with tf.io.TFRecordWriter(str(partial)) as writer:
            for image, label in zip(images[start:end], labels[start:end]):
                writer.write(example(image, int(label)))
        partial.replace(path)
    return paths


def convert(mnist: Path, out: Path, shards: int) -> None:
    for split, prefix in SPLITS.items():
        paths = shard_paths(out, split, shards)
        if all(path.exists() for path in paths):
            print(f"{out}/{split}-*.tfrecord: already there")
            continue
        reader = IdxReader(str(mnist / prefix))
        images, labels = reader.read(0, reader.num_records)
        write_split(images, labels, out, split, shards)
        print(f"{out}/{split}-*.tfrecord: {len(images)} records in {shards} files")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mnist", type=Path, default=Path("../shared/data/mnist"), help="folder of the idx files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the TFRecord files")
    parser.add_argument("--shards", type=int, default=4, help="files per split")
    args = parser.parse_args(argv)
    convert(args.mnist, args.out, args.shards)


if __name__ == "__main__":
    main()
