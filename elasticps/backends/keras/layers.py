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
two weights, the ids sorted and their rows); an id it does not hold (the job never saw it, or its
row was evicted: ``embeddingPolicy``) looks up its first values, as the PS answers it
(:func:`first_rows`, ``api/embedding.initial_rows`` in TensorFlow's ops). That model
loads with ``keras.models.load_model`` wherever ``elasticps`` is importable (the layer is
registered), and serves without any PS.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from elasticps.api.embedding import GOLDEN, MIX_1, MIX_2, TableSpec, initial_rows, table_seed
from elasticps.backends.api import tables_are_served, tables_served
from elasticps.backends.keras import tf_ops

tf_ops.register()  # TensorFlow ops on symbolic tensors, as Keras 2 took them; their layer loads with these

LOCAL_ROWS = 1 << 18


def _words(values: Any) -> tf.Tensor:
    """A uint64 constant (a number or a list) made from numpy: inside a ``tf.function``
    (``model.predict``, a served model) ``tf.constant`` of Python ints over 2**63 goes through
    float64 and rounds them."""
    return tf.constant(np.asarray(values, np.uint64))


def _mix(x: tf.Tensor) -> tf.Tensor:
    """``api/embedding._mix`` on uint64 tensors (wrapping as numpy's does)."""
    shift = tf.bitwise.right_shift
    x = tf.bitwise.bitwise_xor(x, shift(x, _words(30))) * _words(int(MIX_1))
    x = tf.bitwise.bitwise_xor(x, shift(x, _words(27))) * _words(int(MIX_2))
    return tf.bitwise.bitwise_xor(x, shift(x, _words(31)))


def _uniform01(ids: tf.Tensor, dim: int, key: int, stream: int) -> tf.Tensor:
    golden = int(GOLDEN)
    base = _mix(tf.bitwise.bitwise_xor(tf.bitcast(ids, tf.uint64), _words(key)))
    base = base + _words((stream * golden) % 2**64)
    steps = _words([(k * golden) % 2**64 for k in range(1, dim + 1)])
    bits = _mix(base[:, None] + steps[None, :])
    return tf.cast(tf.bitwise.right_shift(bits, _words(11)), tf.float64) * (1.0 / 2**53)


def first_rows(spec: TableSpec, ids: tf.Tensor) -> tf.Tensor:
    """The first values of the rows of ``ids`` (int64 [n]) as ``api/embedding.initial_rows`` makes
    them, in TensorFlow's ops (float32 [n, dim]): what an exported table answers for an id it
    does not hold, as the PS does."""
    if spec.initializer == "zeros":
        return tf.zeros([tf.size(ids), spec.dim], tf.float32)
    key = table_seed(spec)
    u = _uniform01(ids, spec.dim, key, 0)
    if spec.initializer == "uniform":
        return tf.cast((2.0 * u - 1.0) * spec.scale, tf.float32)
    v = _uniform01(ids, spec.dim, key, 1)
    normal = tf.sqrt(-2.0 * tf.math.log1p(-u)) * tf.cos(2.0 * np.pi * v)
    return tf.cast(normal * spec.scale, tf.float32)
served = tables_served  # as the worker makes its model: layers made inside take their rows from it


def _table_and_dim(table: Any, dim: Any, input_dim: int | None, output_dim: int | None) -> tuple[str | None, int, int | None]:
    """``(table, dim, vocabulary)`` from the three ways a module calls the layer: elasticps's
    ``Embedding(table, dim)``, Keras's ``Embedding(input_dim, output_dim)`` (positional or by name)
    and ElasticDL's ``Embedding(output_dim)`` (one number, or ``output_dim=`` alone). ``table`` None:
    the layer's name names the table."""
    if isinstance(table, int) and not isinstance(table, bool):  # a number first: Keras's or ElasticDL's
        if dim is None and input_dim is None and output_dim is None:
            return None, table, None  # ElasticDL's Embedding(output_dim)
        if dim is not None and output_dim is None and input_dim is None:
            return None, int(dim), table  # Keras's Embedding(input_dim, output_dim)
        raise ValueError(f"Embedding({table!r}, {dim!r}, input_dim={input_dim!r}, output_dim={output_dim!r}): "
                         "give the table and dim, Keras's input_dim and output_dim, or ElasticDL's output_dim")
    if dim is not None and output_dim is not None:
        raise ValueError(f"Embedding: dim {dim!r} and output_dim {output_dim!r} are the same argument: give one")
    width = dim if dim is not None else output_dim
    if width is None:
        raise ValueError(f"Embedding({table!r}): the row width is missing (dim, or Keras's output_dim)")
    return table, width, input_dim


@keras.saving.register_keras_serializable(package="elasticps")
class Embedding(keras.layers.Layer):  # type: ignore[misc]  # Keras is untyped
    """``(..., ids int64) -> (..., dim)``: the rows of ``ids`` in table ``table``.

    Keras's and ElasticDL's arguments are taken too: ``Embedding(input_dim, output_dim)``,
    ``Embedding(output_dim=64, mask_zero=True, input_length=10)``. Without a ``table`` the layer's
    name names it (``embedding``, ``embedding_1``, ... as Keras names layers, or ``name=``);
    ``input_dim``, the vocabulary, sizes the local table (``local_rows``: id ``i`` in row ``i``) and
    means nothing on the PS, which holds any int64 id; ``mask_zero`` masks the ids 0 for the layers
    after it, as Keras's does; ``input_length`` is accepted and ignored (Keras 3 has none)."""

    def __init__(self, table: Any = None, dim: int | None = None, initializer: str = "uniform", scale: float = 0.05,
                 seed: int = 0, local_rows: int = LOCAL_ROWS, held: int = 0, *, output_dim: int | None = None,
                 input_dim: int | None = None, mask_zero: bool = False, input_length: int | None = None,
                 **kwargs: Any) -> None:
        del input_length  # Keras 2's and ElasticDL's; the ids' shape says it
        initializer = kwargs.pop("embeddings_initializer", initializer)
        if not isinstance(initializer, str):
            raise ValueError(f"Embedding: embeddings_initializer {initializer!r} must be one of the table's "
                             "initializer names (uniform, normal, zeros)")
        name, width, vocabulary = _table_and_dim(table, dim, input_dim, output_dim)
        super().__init__(**kwargs)
        if vocabulary is not None and local_rows == LOCAL_ROWS:
            local_rows = vocabulary
        self.mask_zero = bool(mask_zero)
        self.supports_masking = self.mask_zero
        self.spec = TableSpec(name or self.name, width, initializer, scale, seed)  # EmbeddingError says what is wrong
        table = self.spec.name
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
            rows = tf.where(found[:, None], tf.gather(self.table, positions), first_rows(self.spec, tf.reshape(ids, [-1])))
            return tf.reshape(rows, tf.concat([tf.shape(ids), [self.spec.dim]], axis=0))
        positions = tf.math.floormod(ids, self.local_rows)
        return tf.gather(self.table, positions)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (*input_shape, self.spec.dim)

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        """``mask_zero``: where the ids are not 0 (Keras's Embedding's mask); else none."""
        return keras.ops.not_equal(inputs, 0) if self.mask_zero else None

    def get_config(self) -> dict[str, Any]:
        s = self.spec
        return {**super().get_config(), "table": s.name, "dim": s.dim, "initializer": s.initializer,
                "scale": s.scale, "seed": s.seed, "local_rows": self.local_rows, "held": self.held,
                "mask_zero": self.mask_zero}
