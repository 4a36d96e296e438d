"""A tiny model with BatchNormalization (and Dropout, whose integer seed state is not synchronised):
the model module of the end-to-end test of model state on the PS (``test_model_state.py``).

Loaded by the test's workers as ``--model_def bn_net`` (the test puts this folder on PYTHONPATH).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def custom_model(features: int = 8, hidden: int = 16, classes: int = 2) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input(shape=(features,)),
            keras.layers.Dense(hidden),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dropout(0.1),
            keras.layers.Dense(classes),
        ],
        name="bn_net",  # placed by size, both moving statistics land on shard 1 of 2, the shard the test kills
    )


def loss(labels: Any, predictions: Any) -> Any:
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate=0.1)


def feed(dataset: tf.data.Dataset, mode: str) -> tf.data.Dataset:
    # Features far from mean 0 and variance 1, so trained moving statistics cannot stay at 0 and 1.
    return dataset.map(lambda x, y: (tf.cast(x, tf.float32) * 3.0 + 2.0, tf.cast(y, tf.int64)))


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(labels: Any, predictions: Any) -> Any:
        return tf.cast(tf.equal(tf.argmax(predictions, axis=-1), tf.cast(labels, tf.int64)), tf.float32)

    return {"accuracy": accuracy}
