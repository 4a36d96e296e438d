"""Keras layers for model modules: :class:`Embedding`, a lookup in an embedding table (issue 17).

A model module uses ``elasticps.layers.Embedding(table, dim)`` where it would use
``keras.layers.Embedding(vocabulary, dim)``: no vocabulary, ids are any int64 (hash strings with
``elasticps.api.embedding.hash_ids``; the ``criteo`` reader gives ids already). The table's rows
start from values that depend only on the table's name, its seed and the id
(``api/embedding.py``).

In one plain process (``model.fit``, a notebook, no elasticps at all) the table is local: a
Keras weight of ``local_rows`` rows, id ``i`` in row ``i mod local_rows``, trained by the model's
optimizer like any weight (ids that share a row share it; pick ``local_rows`` well above the ids
the data has). Served by parameter servers, only the rows a minibatch touches travel.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from elasticps.api.embedding import TableSpec, initial_rows

LOCAL_ROWS = 1 << 18


@keras.saving.register_keras_serializable(package="elasticps")
class Embedding(keras.layers.Layer):  # type: ignore[misc]  # Keras is untyped
    """``(..., ids int64) -> (..., dim)``: the rows of ``ids`` in table ``table``."""

    def __init__(self, table: str, dim: int, initializer: str = "uniform", scale: float = 0.05, seed: int = 0,
                 local_rows: int = LOCAL_ROWS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = TableSpec(table, dim, initializer, scale, seed)  # checked: EmbeddingError says what is wrong
        if isinstance(local_rows, bool) or not isinstance(local_rows, int) or local_rows < 1:
            raise ValueError(f"embedding table {table!r}: local_rows {local_rows!r} must be an integer >= 1")
        self.local_rows = local_rows

    def build(self, input_shape: Any) -> None:
        self.table = self.add_weight(name="rows", shape=(self.local_rows, self.spec.dim), initializer="zeros",
                                     dtype="float32")
        self.table.assign(initial_rows(self.spec, np.arange(self.local_rows, dtype=np.int64)))

    def call(self, ids: Any) -> Any:
        positions = tf.math.floormod(tf.cast(ids, tf.int64), self.local_rows)
        return tf.gather(self.table, positions)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (*input_shape, self.spec.dim)

    def get_config(self) -> dict[str, Any]:
        s = self.spec
        return {**super().get_config(), "table": s.name, "dim": s.dim, "initializer": s.initializer,
                "scale": s.scale, "seed": s.seed, "local_rows": self.local_rows}
