"""Keras layers for model modules: :class:`Embedding`, a lookup in an embedding table (issue 17).

A model module uses ``elasticps.backends.keras.layers.Embedding(table, dim)`` where it would use
``keras.layers.Embedding(vocabulary, dim)``: no vocabulary, ids are any int64 (hash strings with
``elasticps.api.embedding.hash_ids``; the ``criteo`` reader gives ids already). The table's rows
start from values that depend only on the table's name, its seed and the id
(``api/embedding.py``).

In one plain process (``model.fit``, a notebook, no elasticps at all) the table is local: a
Keras weight of ``local_rows`` rows, id ``i`` in row ``i mod local_rows``, trained by the model's
optimizer like any weight (ids that share a row share it; pick ``local_rows`` well above the ids
the data has).

Served by parameter servers (a layer made inside :func:`served`, as the worker makes the model),
the layer holds no table: before each minibatch the worker pulls the rows of the minibatch's
distinct ids and puts them in the layer's two buffers (:meth:`Embedding.load`: the ids, sorted,
and their rows); the layer looks each id up there (``searchsorted``), and the gradient of the rows
buffer is each distinct id's gradient summed over the minibatch, which the worker pushes. Only the
rows a minibatch touches travel. The buffers are plain ``tf.Variable``s outside Keras's tracking:
never in the model's weights, so never among the dense variables the PS holds.

Exported (``spec.output``) from a PS job, the layer holds the rows the PS held (``held`` of them:
two weights, the ids sorted and their rows); an id the job never saw looks up zeros. That model
loads with ``keras.models.load_model`` wherever ``elasticps`` is importable (the layer is
registered), and serves without any PS.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from elasticps.api.embedding import TableSpec, initial_rows
from elasticps.backends.api import tables_are_served, tables_served

LOCAL_ROWS = 1 << 18
served = tables_served  # as the worker makes its model: layers made inside take their rows from it


@keras.saving.register_keras_serializable(package="elasticps")
class Embedding(keras.layers.Layer):  # type: ignore[misc]  # Keras is untyped
    """``(..., ids int64) -> (..., dim)``: the rows of ``ids`` in table ``table``."""

    def __init__(self, table: str, dim: int, initializer: str = "uniform", scale: float = 0.05, seed: int = 0,
                 local_rows: int = LOCAL_ROWS, held: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = TableSpec(table, dim, initializer, scale, seed)  # checked: EmbeddingError says what is wrong
        if isinstance(local_rows, bool) or not isinstance(local_rows, int) or local_rows < 1:
            raise ValueError(f"embedding table {table!r}: local_rows {local_rows!r} must be an integer >= 1")
        if isinstance(held, bool) or not isinstance(held, int) or held < 0:
            raise ValueError(f"embedding table {table!r}: held {held!r} must be an integer >= 0")
        self.local_rows = local_rows
        self.held = held  # > 0: an exported table of that many rows (ids and rows as weights)
        self.served = tables_are_served() and not held
        if self.served:
            dim = self.spec.dim
            self.ids_buffer = tf.Variable(np.empty(0, np.int64), shape=tf.TensorShape([None]), trainable=False,
                                          name=f"{table}_ids")
            self.rows_buffer = tf.Variable(np.empty((0, dim), np.float32), shape=tf.TensorShape([None, dim]),
                                           name=f"{table}_rows")

    def build(self, input_shape: Any) -> None:
        if self.served:
            return
        if self.held:
            self.held_ids = self.add_weight(name="ids", shape=(self.held,), initializer="zeros", dtype="int64",
                                            trainable=False)
            self.table = self.add_weight(name="rows", shape=(self.held, self.spec.dim), initializer="zeros",
                                         dtype="float32")
            return
        self.table = self.add_weight(name="rows", shape=(self.local_rows, self.spec.dim), initializer="zeros",
                                     dtype="float32")
        self.table.assign(initial_rows(self.spec, np.arange(self.local_rows, dtype=np.int64)))

    def load(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Served: the minibatch's distinct ids, sorted, and their rows (len(ids), dim)."""
        self.ids_buffer.assign(ids)
        self.rows_buffer.assign(rows)

    def call(self, ids: Any) -> Any:
        ids = tf.cast(ids, tf.int64)
        if self.served:
            positions = tf.searchsorted(self.ids_buffer, tf.reshape(ids, [-1]))
            rows = tf.gather(self.rows_buffer, positions)
            return tf.reshape(rows, tf.concat([tf.shape(ids), [self.spec.dim]], axis=0))
        if self.held:
            positions = tf.minimum(tf.searchsorted(self.held_ids, tf.reshape(ids, [-1])), self.held - 1)
            found = tf.equal(tf.gather(self.held_ids, positions), tf.reshape(ids, [-1]))
            rows = tf.where(found[:, None], tf.gather(self.table, positions), tf.zeros_like(self.table[:1]))
            return tf.reshape(rows, tf.concat([tf.shape(ids), [self.spec.dim]], axis=0))
        positions = tf.math.floormod(ids, self.local_rows)
        return tf.gather(self.table, positions)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (*input_shape, self.spec.dim)

    def get_config(self) -> dict[str, Any]:
        s = self.spec
        return {**super().get_config(), "table": s.name, "dim": s.dim, "initializer": s.initializer,
                "scale": s.scale, "seed": s.seed, "local_rows": self.local_rows, "held": self.held}
