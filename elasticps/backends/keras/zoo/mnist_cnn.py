"""MNIST (or Fashion-MNIST) CNN: Conv32-pool-Conv64-pool-Dense128-Dense10, 225k parameters.

The model of the project's MNIST example and benchmarks (PERFORMANCE.md measures TensorFlow's own
ParameterServerStrategy on the same network). Records are 784 uint8 pixels and an integer label.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def custom_model(learning_rate: float = 0.05) -> keras.Model:
    del learning_rate  # the optimizer's; accepted so spec.model.params may carry it
    return keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ],
        name="mnist_cnn",
    )


def loss(labels: Any, predictions: Any) -> Any:
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)


# Records are parsed a block at a time (one cast and reshape per block rather than per record),
# then handed on one by one again, as the model contract has them.
BLOCK = 4096


def feed(dataset: tf.data.Dataset, mode: str) -> tf.data.Dataset:
    def parse(pixels: Any, labels: Any) -> tuple[Any, Any]:
        images = tf.reshape(tf.cast(pixels, tf.float32) / 255.0, (-1, 28, 28, 1))
        return images, labels

    return dataset.batch(BLOCK).map(parse).unbatch()


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(labels: Any, predictions: Any) -> Any:
        return tf.cast(tf.equal(tf.argmax(predictions, axis=-1), tf.cast(labels, tf.int64)), tf.float32)

    return {"accuracy": accuracy}
