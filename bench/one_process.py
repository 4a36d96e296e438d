"""The one-process reference: a model module trained alone for a given number of updates.

For "the distributed job reaches the accuracy of one process on the same number of updates": run
a model module here, in one process with no PS, through the same data path as a worker
(``KerasTrainer``: the module's ``dataset_fn``/``feed``, loss and optimizer, its local steps), for
``--updates`` steps of ``--minibatch`` records (epochs reshuffled), then evaluate it on the
validation records. A sync job of W workers with ``minibatchSize`` B averages W gradients per
update: compare it with ``--minibatch W*B`` and its model version as ``--updates``.

    python -m bench.one_process --model_def elasticps.backends.keras.zoo.mnist_functional --updates 940 --minibatch 128 \\
        --training '~/.cache/elasticps/data/mnist-tfrecord/train-*.tfrecord' \\
        --validation '~/.cache/elasticps/data/mnist-tfrecord/test-*.tfrecord'

``--reader tfrecord`` (the default) reads the files with ``tf.data`` (serialized examples, no
labels); any other ``spec.data.reader`` goes through ``elasticps.data.readers``. Prints one JSON
line (and writes it to ``--result_file``): updates, minibatch, seconds and the validation metrics.

Besides the metrics with the model as trained (BatchNormalization's moving statistics as they
are), it gives ``metrics_recalibrated``: the same model with those statistics estimated anew from
``--recalibration_records`` training records (:func:`recalibrate_batchnorm`). The moving averages
(momentum 0.99: about the last 100 updates) lag behind weights that SGD at a constant rate keeps
moving, and how far differs from one update to the next: with them, the accuracy of one evaluation
swings by up to 2 points between nearby versions, in one process as in a job; with recalibrated
statistics it measures the weights alone. ``--exported FOLDER`` evaluates a job's exported model
(``FOLDER/model.keras``) the same way instead of training one.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def tfrecords(pattern: str) -> np.ndarray:
    """Every record of the files matching ``pattern`` (sorted), serialized, as an object array."""
    import tensorflow as tf

    files = sorted(glob.glob(os.path.expanduser(pattern)))
    if not files:
        raise SystemExit(f"{pattern}: no such files (make mnist-tfrecord writes MNIST's)")
    return np.array(list(tf.data.TFRecordDataset(files).as_numpy_iterator()), dtype=object)


def records(reader: str, path: str) -> tuple[np.ndarray, np.ndarray | None]:
    if reader == "tfrecord":
        return tfrecords(path), None
    from elasticps.api.spec import DataReader
    from elasticps.data.readers import open_reader

    opened = open_reader(DataReader(reader), path)
    return opened.read(0, opened.num_records)


def recalibrate_batchnorm(trainer: Any, features: np.ndarray, labels: np.ndarray | None, records: int) -> bool:
    """Sets every BatchNormalization layer's moving statistics to their mean over ``records``
    training records (in minibatches, training-mode forward passes: momentum 1 - 1/k at the k-th, so
    each minibatch counts alike); False when the model has no such layer."""
    import keras

    def walk(layer: Any) -> Iterator[Any]:
        yield layer
        for inner in getattr(layer, "layers", []):
            yield from walk(inner)

    layers = [layer for layer in walk(trainer.model) if isinstance(layer, keras.layers.BatchNormalization)]
    if not layers:
        return False
    momenta = [layer.momentum for layer in layers]
    order = np.random.default_rng(0).permutation(len(features))[:records]
    try:
        for k, (x, _) in enumerate(trainer.batches(features[order], None if labels is None else labels[order], "evaluation"), 1):
            for layer in layers:
                layer.momentum = 1.0 - 1.0 / k
            trainer.model(x, training=True)
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
    return True


def evaluate(
    trainer: Any,
    training: tuple[np.ndarray, np.ndarray | None],
    validation: tuple[np.ndarray, np.ndarray | None],
    recalibration_records: int,
) -> dict[str, Any]:
    """The validation metrics (means) as trained and, for a model with BatchNormalization, with its
    statistics recalibrated on training records (the model's state is put back afterwards)."""
    count = len(validation[0])
    result: dict[str, Any] = {"metrics": {name: value / count for name, value in trainer.evaluate(*validation).items()}}
    held = trainer.state()
    if recalibration_records > 0 and recalibrate_batchnorm(trainer, *training, recalibration_records):
        sums = trainer.evaluate(*validation)
        result["metrics_recalibrated"] = {name: value / count for name, value in sums.items()}
        result["recalibration_records"] = min(recalibration_records, len(training[0]))
        trainer.assign_state(held)
    return result


def exported(
    model_def: str,
    folder: str,
    training: tuple[np.ndarray, np.ndarray | None],
    validation: tuple[np.ndarray, np.ndarray | None],
    minibatch: int,
    recalibration_records: int,
) -> dict[str, Any]:
    """:func:`evaluate` of a job's exported model (``folder/model.keras``)."""
    from elasticps.backends.keras.trainer import KerasTrainer
    from elasticps.backends.keras.model_loading import load_model_module

    trainer = KerasTrainer(load_model_module(model_def), {}, minibatch)
    trainer.load_exported(folder)
    features, labels = training
    trainer.build(features[:1], None if labels is None else labels[:1])
    return {"model_def": model_def, "exported": folder, **evaluate(trainer, training, validation, recalibration_records)}


def train(
    model_def: str,
    training: tuple[np.ndarray, np.ndarray | None],
    validation: tuple[np.ndarray, np.ndarray | None],
    updates: int,
    minibatch: int,
    learning_rate: float = 0.0,
    seed: int = 0,
    recalibration_records: int = 10_000,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Trains ``model_def`` (``custom_model(**params)``) for ``updates`` minibatches; returns the
    validation metrics (means)."""
    import tensorflow as tf

    from elasticps.backends.keras.trainer import KerasTrainer
    from elasticps.backends.keras.model_loading import load_model_module

    tf.random.set_seed(seed)
    trainer = KerasTrainer(load_model_module(model_def), params or {}, minibatch, seed=seed, learning_rate=learning_rate)
    features, labels = training
    trainer.build(features[:1], None if labels is None else labels[:1])
    started, done, epochs = time.monotonic(), 0, 0
    while done < updates:
        epochs += 1
        for x, y in trainer.batches(features, labels, "training"):
            trainer.apply_local(trainer.gradients(x, y)[1], trainer.learning_rate_at(done))  # the schedule's, if any
            done += 1
            if done == updates:
                break
    seconds = time.monotonic() - started
    return {
        "model_def": model_def,
        "updates": done,
        "minibatch": minibatch,
        "epochs": epochs,
        "train_seconds": round(seconds, 1),
        **evaluate(trainer, training, validation, recalibration_records),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_def", default="elasticps.backends.keras.zoo.mnist_functional")
    parser.add_argument("--reader", default="tfrecord")
    parser.add_argument("--training", default="~/.cache/elasticps/data/mnist-tfrecord/train-*.tfrecord")
    parser.add_argument("--validation", default="~/.cache/elasticps/data/mnist-tfrecord/test-*.tfrecord")
    parser.add_argument("--updates", type=int, default=0)
    parser.add_argument("--minibatch", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=0.0, help="> 0 replaces the module optimizer's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--params", type=json.loads, default={}, help="custom_model's keyword arguments, as JSON")
    parser.add_argument("--recalibration_records", type=int, default=10_000, help="0: no recalibrated metrics")
    parser.add_argument("--exported", help="evaluate this folder's model.keras (a job's export) instead of training")
    parser.add_argument("--result_file", type=Path)
    args = parser.parse_args(argv)
    if args.exported:
        result = exported(
            args.model_def,
            args.exported,
            records(args.reader, args.training),
            records(args.reader, args.validation),
            args.minibatch,
            args.recalibration_records,
        )
    else:
        if args.updates <= 0:
            parser.error("--updates is required (> 0) unless --exported is given")
        result = train(
            args.model_def,
            records(args.reader, args.training),
            records(args.reader, args.validation),
            args.updates,
            args.minibatch,
            args.learning_rate,
            args.seed,
            args.recalibration_records,
            args.params,
        )
    line = json.dumps(result)
    print(line)
    if args.result_file:
        args.result_file.write_text(line + "\n")


if __name__ == "__main__":
    main()
