"""MNIST in the style of ElasticDL's model zoo: functional Keras, ``dataset_fn`` over tf.train.Example.

The module shows the ElasticDL contract (``docs/model-zoo.md``): a functional model with one
input named ``image``, ``loss(labels, predictions)``, ``optimizer()``, ``eval_metrics_fn()`` and
``dataset_fn(dataset, mode, metadata)``, which parses serialized ``tf.train.Example`` records
(``reader: tfrecord``; labels travel inside the records). Its only elasticps import is ``Mode``.

The records' layout is ElasticDL's MNIST one, so its own ``mnist_functional_api`` module trains
on the same files: ``image``, 784 floats (pixel values 0-255, row by row) read as ``[28, 28]``,
and ``label``, one int64. :func:`example` writes one record; ``elasticps.backends.keras.mnist_tfrecord``
(``make mnist-tfrecord``) writes MNIST with it.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from elasticps import Mode

IMAGE = (28, 28)


def custom_model(dropout: float = 0.25) -> keras.Model:
    image = keras.Input(shape=IMAGE, name="image")
    x = keras.layers.Reshape(IMAGE + (1,))(image)
    x = keras.layers.Conv2D(32, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, activation="relu")(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Flatten()(x)
    logits = keras.layers.Dense(10)(x)
    # Inputs as a dict: the model takes dataset_fn's features by name, as they come.
    return keras.Model(inputs={"image": image}, outputs=logits, name="mnist_functional")


def loss(labels: Any, predictions: Any) -> Any:
    labels = tf.reshape(labels, [-1])
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def optimizer(lr: float = 0.1) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(lr)


def example(image: np.ndarray, label: int) -> bytes:
    """One record, serialized: ``image`` (28 x 28 pixels, any numeric type) and its ``label``."""
    features = {
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=np.asarray(image, np.float32).ravel())),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return bytes(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())


BLOCK = 4096  # records parsed together


def dataset_fn(dataset: tf.data.Dataset, mode: Mode, metadata: Any) -> tf.data.Dataset:
    del metadata  # the records describe themselves
    description = {"image": tf.io.FixedLenFeature(IMAGE, tf.float32)}
    if mode != Mode.PREDICTION:
        description["label"] = tf.io.FixedLenFeature([1], tf.int64)

    def parse(records: Any) -> Any:
        parsed = tf.io.parse_example(records, description)
        features = {"image": parsed["image"] / 255.0}
        if mode == Mode.PREDICTION:
            return features
        return features, parsed["label"]

    # A block of records per parse (one op for the block, not one per record), then one by one again.
    return dataset.batch(BLOCK).map(parse).unbatch()


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(labels: Any, predictions: Any) -> Any:
        labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
        return tf.cast(tf.equal(tf.argmax(predictions, axis=-1), labels), tf.float32)

    return {"accuracy": accuracy}
