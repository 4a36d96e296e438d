"""A tiny model over ``tf.train.Example`` records (``x``: 8 floats, ``label``: one int64), read by
``reader: tfrecord``: the model module of the object-store end-to-end test (``test_object_store_job.py``).

Loaded by the test's workers as ``--model_def examples_net`` (the test puts this folder on PYTHONPATH).
The contract is ElasticDL's, as ``elasticps.backends.keras.zoo.mnist_functional``'s: ``dataset_fn`` parses the
records, the labels travel inside them.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from elasticps import Mode

FEATURES = 8


def custom_model(hidden: int = 16, classes: int = 2) -> keras.Model:
    return keras.Sequential(
        [keras.Input(shape=(FEATURES,)), keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(classes)],
        name="examples_net",
    )


def loss(labels: Any, predictions: Any) -> Any:
    labels = tf.reshape(labels, [-1])
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate=0.1)


def example(x: np.ndarray, label: int) -> bytes:
    """One record, serialized."""
    features = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.asarray(x, np.float32).ravel())),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return bytes(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())


def dataset_fn(dataset: tf.data.Dataset, mode: Mode, metadata: Any) -> tf.data.Dataset:
    del metadata
    description = {"x": tf.io.FixedLenFeature([FEATURES], tf.float32)}
    if mode != Mode.PREDICTION:
        description["label"] = tf.io.FixedLenFeature([1], tf.int64)

    def parse(record: Any) -> Any:
        parsed = tf.io.parse_single_example(record, description)
        return parsed["x"] if mode == Mode.PREDICTION else (parsed["x"], parsed["label"])

    return dataset.map(parse)


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(labels: Any, predictions: Any) -> Any:
        labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
        return tf.cast(tf.equal(tf.argmax(predictions, axis=-1), labels), tf.float32)

    return {"accuracy": accuracy}
