"""A small multi-layer perceptron for tabular records (float features, integer class label).

Used by the tests and the quick examples: it trains in seconds on generated data. ``hidden`` is one
width or a list of widths, one dense ReLU layer each: ``features=784, hidden=[8192, 2048],
classes=10`` is the 23M-parameter (92 MB of float32) model of ``bench/large_model.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf


def custom_model(features: int = 8, hidden: int | Sequence[int] = 16, classes: int = 2) -> keras.Model:
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    return keras.Sequential(
        [
            keras.Input(shape=(features,)),
            *(keras.layers.Dense(width, activation="relu") for width in widths),
            keras.layers.Dense(classes),
        ],
        name="mlp",
    )


def loss(labels: Any, predictions: Any) -> Any:
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate=0.1)


def feed(dataset: tf.data.Dataset, mode: str) -> tf.data.Dataset:
    # A block of records per cast (two ops for the block, not two per record), then one by one again.
    return dataset.batch(4096).map(lambda x, y: (tf.cast(x, tf.float32), tf.cast(y, tf.int64))).unbatch()


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(labels: Any, predictions: Any) -> Any:
        return tf.cast(tf.equal(tf.argmax(predictions, axis=-1), tf.cast(labels, tf.int64)), tf.float32)

    return {"accuracy": accuracy}
