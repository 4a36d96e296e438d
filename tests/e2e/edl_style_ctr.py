"""A click-through-rate module written as ElasticDL's zoo writes its DeepFM for Keras 2, with only
its imports elasticps's: the functional model is built with TensorFlow ops on the symbolic inputs
(``tf.keras.backend.sum``, ``tf.reshape``, ``tf.sigmoid``: Keras 3 alone refuses them), a layer of
the module's own that it never registers (``ZeroMasked``), ElasticDL's ``Embedding`` without a
vocabulary, and features fed as ``{"ids": ...}`` to an ``Input`` that has no such name (Keras 2 gave
a one-input model the one tensor). The end-to-end test (``test_elasticdl_contract.py``) loads it
from this folder.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow.keras.backend as K  # noqa: N812
from tensorflow.keras.layers import Dense, Flatten, Layer

from elasticps.elasticdl import Embedding, Mode

FIELDS = 6


class ZeroMasked(Layer):  # type: ignore[misc]  # Keras is untyped
    """Zeroes the vectors of the ids 0 (the embedding's mask) and passes no mask on."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.supports_masking = True

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        return None

    def call(self, x: Any, mask: Any = None) -> Any:
        return x * tf.cast(K.expand_dims(mask, -1), x.dtype)


def custom_model(dim: int = 8, hidden: int = 16) -> Any:
    ids = tf.keras.Input(shape=(FIELDS,))
    vectors = ZeroMasked()(Embedding(output_dim=dim, mask_zero=True, input_length=FIELDS)(ids))
    pairs = 0.5 * K.sum(K.square(K.sum(vectors, axis=1)) - K.sum(K.square(vectors), axis=1), axis=1)
    bias = K.sum(ZeroMasked()(Embedding(output_dim=1, mask_zero=True)(ids)), axis=(1, 2))
    deep = tf.reshape(Dense(1)(Dense(hidden, activation="relu")(Flatten()(vectors))), shape=(-1,))
    logits = tf.keras.layers.Add()([pairs, bias, deep])
    return tf.keras.Model(inputs=ids, outputs={"logits": logits, "probs": tf.reshape(tf.sigmoid(logits), (-1, 1))})


def loss(labels: Any, predictions: Any) -> Any:
    labels = tf.cast(tf.reshape(labels, [-1]), tf.float32)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(logits=predictions["logits"], labels=labels))


def optimizer(lr: float = 0.05) -> Any:
    return tf.optimizers.Adam(lr)


def feed(dataset: Any, mode: Any, _: Any) -> Any:
    def _parse(x: Any, y: Any) -> Any:
        features = {"ids": tf.cast(x, tf.int64)}
        return features if mode == Mode.PREDICTION else (features, tf.cast(y, tf.int32))

    return dataset.map(_parse)


def eval_metrics_fn() -> dict[str, Any]:
    return {
        "logits": {
            "accuracy": lambda labels, predictions: tf.equal(
                tf.cast(tf.reshape(predictions, [-1]) > 0.0, tf.int32), tf.cast(tf.reshape(labels, [-1]), tf.int32)
            )
        },
        "probs": {"auc": tf.keras.metrics.AUC()},
    }
