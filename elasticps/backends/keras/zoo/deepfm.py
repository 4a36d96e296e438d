"""DeepFM (Guo et al., 2017) for click-through rate: one embedding id per field in, a click logit out.

Records are the ``criteo`` reader's: 39 int64 ids (13 bucketed counts, 26 categoricals) and a 0/1
label. Three parts share the ids: a linear term (a 1-wide embedding per id, summed, plus a bias),
the factorisation machine's pairwise interactions of the ``dim``-wide embeddings
(``0.5 * ((sum e)^2 - sum e^2)``, summed over the width), and an MLP on the same embeddings
concatenated. The embeddings are ``elasticps.backends.keras.layers.Embedding`` tables: every id of every field
in one table (the reader keeps fields apart in the ids themselves).

Metrics: ``eval_metrics_fn`` gives the accuracy at 0.5 per record (the job's ``loss`` is the log
loss); ``eval_set_metrics_fn`` the AUC (:func:`auc`) over an evaluation task's records at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from elasticps.api.metrics import auc as auc  # the job's set metric (eval_set_metrics_fn)
from elasticps.api.metrics import log_loss as log_loss  # the benchmarks'
from elasticps.backends.keras.layers import Embedding

FIELDS = 39


def custom_model(dim: int = 16, hidden: int | Sequence[int] = (200, 200), fields: int = FIELDS,
                 local_rows: int = 1 << 18, seed: int = 0, id_space: int = 0) -> keras.Model:
    """``id_space`` > 0: the ids are taken modulo it first (a table of that many possible ids, as
    a hashed feature column with that many buckets); 0: the reader's 64-bit ids as they are."""
    ids = keras.Input(shape=(fields,), dtype="int64", name="ids")
    keys = IdSpace(id_space, name="id_space")(ids) if id_space > 0 else ids
    linear = Embedding("deepfm_linear", 1, initializer="zeros", seed=seed, local_rows=local_rows)(keys)  # (n, f, 1)
    factors = Embedding("deepfm_factors", dim, seed=seed, local_rows=local_rows)(keys)  # (n, f, dim)
    first = FieldSum(name="linear_sum")(linear)  # (n, 1)
    pairs = PairwiseInteractions(name="fm")(factors)  # (n, 1)
    deep = keras.layers.Flatten()(factors)
    for width in [hidden] if isinstance(hidden, int) else list(hidden):
        deep = keras.layers.Dense(width, activation="relu")(deep)
    deep = keras.layers.Dense(1)(deep)
    logit = keras.layers.Add(name="logit")([first, pairs, deep])
    return keras.Model(ids, logit, name="deepfm")


@keras.saving.register_keras_serializable(package="elasticps.deepfm")
class IdSpace(keras.layers.Layer):  # type: ignore[misc]  # Keras is untyped
    """``ids -> ids mod size``, in [0, size)."""

    def __init__(self, size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"id_space {size!r} must be an integer >= 1")
        self.size = size

    def call(self, ids: Any) -> Any:
        return tf.math.floormod(tf.cast(ids, tf.int64), self.size)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return tuple(input_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "size": self.size}


@keras.saving.register_keras_serializable(package="elasticps.deepfm")
class FieldSum(keras.layers.Layer):  # type: ignore[misc]  # Keras is untyped
    """``(n, fields, 1) -> (n, 1)``: the linear term, every field's weight summed."""

    def call(self, weights: Any) -> Any:
        return tf.reduce_sum(weights, axis=[1, 2])[:, None]

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (input_shape[0], 1)


@keras.saving.register_keras_serializable(package="elasticps.deepfm")
class PairwiseInteractions(keras.layers.Layer):  # type: ignore[misc]  # Keras is untyped
    """``(n, fields, dim) -> (n, 1)``: the factorisation machine's sum over field pairs of the
    dot products of their embeddings, ``0.5 * sum((sum e)^2 - sum e^2)``, in linear time."""

    def call(self, e: Any) -> Any:
        square_of_sum = tf.square(tf.reduce_sum(e, axis=1))
        sum_of_squares = tf.reduce_sum(tf.square(e), axis=1)
        return 0.5 * tf.reduce_sum(square_of_sum - sum_of_squares, axis=1, keepdims=True)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (input_shape[0], 1)


def loss(labels: Any, logits: Any) -> Any:
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1, 1])
    return keras.losses.binary_crossentropy(labels, logits, from_logits=True)


def optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(learning_rate=0.001)


def feed(dataset: tf.data.Dataset, mode: str) -> tf.data.Dataset:
    return dataset.map(lambda x, y: (tf.cast(x, tf.int64), tf.cast(y, tf.int64)))


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(labels: Any, logits: Any) -> Any:
        clicked = tf.reshape(tf.cast(labels, tf.float32), [-1])
        return tf.cast(tf.equal(tf.cast(tf.reshape(logits, [-1]) > 0, tf.float32), clicked), tf.float32)

    return {"accuracy": accuracy}


def eval_set_metrics_fn() -> dict[str, Any]:
    return {"auc": auc}
