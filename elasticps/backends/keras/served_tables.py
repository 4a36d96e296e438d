"""The worker's side of embedding tables served by the PS (issue 17): ids in, rows in, gradients out.

Used by the Keras trainer (``keras_trainer.py``) around every model call on a minibatch. The model
was made inside ``elasticps.backends.api.tables_served()``, so its ``Embedding`` layers hold no table, only two
buffers (``layers.py``). Before a minibatch runs, :meth:`ServedTables.load`:

1. finds the ids each layer will look up: a probe model from the model's inputs to the layers'
   inputs (so the model must be functional or sequential; the probe is traced once);
2. takes each table's distinct ids over its layers and asks the row source for their rows (the
   worker's: ``PSClient.pull_embeddings``, every shard at once; before the PS holds the model, the
   rows' first values, which are a function of the id alone, ``api/embedding.initial_rows``);
3. puts each layer's distinct ids (sorted) and their rows in its buffers.

After a gradient step, :meth:`ServedTables.take` turns the buffers' gradients into one
:class:`~elasticps.api.embedding.RowGrads` per table (each distinct id's gradient summed over the
minibatch and over the layers sharing the table), which the next push carries.

For an export, :meth:`ServedTables.exported` copies the model with every served layer replaced by
one holding the rows the PS holds (``Embedding(..., held=n)``: ids and rows as weights), the
other layers' weights copied: a model that serves without a PS.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from elasticps.api.embedding import IdArray, RowGrads, TableSpec, initial_rows, row_grads
from elasticps.backends.api import HeldRows, ModelError, RowSource
from elasticps.backends.keras.layers import Embedding


def _served_layers(model: keras.Model) -> list[Embedding]:
    return [layer for layer in model._flatten_layers() if isinstance(layer, Embedding) and layer.served]


class ServedTables:
    def __init__(self, model: keras.Model, module: str) -> None:
        self.layers = _served_layers(model)
        specs: dict[str, TableSpec] = {}
        for layer in self.layers:
            held = specs.setdefault(layer.spec.name, layer.spec)
            if held != layer.spec:
                raise ModelError(f"{module}: two Embedding layers name table {held.name!r} with different "
                                 f"settings ({held} and {layer.spec})")
        self.specs = specs
        self._model = model
        self._module = module
        self._probe: Any = None
        self._source: RowSource | None = None
        self._held: HeldRows | None = None
        self._gradients: dict[str, RowGrads] = {}
        self._loaded: list[IdArray] = []  # each layer's ids in its buffer (what load put there)

    def __bool__(self) -> bool:
        return bool(self.layers)

    def serve(self, source: RowSource, held: HeldRows) -> None:
        """Where rows come from from now on (the PS, once it holds the model), and every row held
        (for an export)."""
        self._source, self._held = source, held

    @property
    def buffers(self) -> list[tf.Variable]:
        """The layers' row buffers, whose gradients :meth:`take` reads (in this order)."""
        return [layer.rows_buffer for layer in self.layers]

    def _ids(self, x: Any) -> list[IdArray]:
        if self._probe is None:
            try:
                probe = keras.Model(self._model.inputs, [layer.input for layer in self.layers])
            except (AttributeError, ValueError, TypeError) as err:
                raise ModelError(f"{self._module}: a model whose elasticps.backends.keras.layers.Embedding tables are served by the "
                                 f"PS must be a functional or sequential Keras model ({err})") from None
            self._probe = tf.function(lambda inputs: probe(inputs, training=False), reduce_retracing=True)
        found = self._probe(x)
        found = found if isinstance(found, (list, tuple)) else [found]
        return [np.unique(np.asarray(ids).astype(np.int64).reshape(-1)) for ids in found]

    def load(self, x: Any, *, initial: bool = False, training: bool = True) -> None:
        """The rows of the minibatch ``x``'s ids into the layers' buffers; ``initial``: their first
        values, computed here (warming the step up before the PS holds the model); ``training``
        false (evaluation, prediction): the PS makes no row for them."""
        per_layer = self._ids(x)
        wanted: dict[str, IdArray] = {}
        for layer, ids in zip(self.layers, per_layer):
            held = wanted.get(layer.spec.name)
            wanted[layer.spec.name] = ids if held is None else np.union1d(held, ids)
        if initial or self._source is None:
            rows: Mapping[str, np.ndarray] = {name: initial_rows(self.specs[name], ids) for name, ids in wanted.items()}
        else:
            rows = self._source(wanted, training)
        for layer, ids in zip(self.layers, per_layer):
            table_ids, table_rows = wanted[layer.spec.name], rows[layer.spec.name]
            layer.load(ids, table_rows if table_ids.size == ids.size else table_rows[np.searchsorted(table_ids, ids)])
        self._loaded = per_layer

    def take(self, gradients: list[Any]) -> None:
        """The buffers' gradients (dense, one per layer, as :attr:`buffers`) as each table's row gradients."""
        parts: dict[str, list[tuple[IdArray, np.ndarray]]] = {}
        for layer, ids, grad in zip(self.layers, self._loaded, gradients):
            parts.setdefault(layer.spec.name, []).append((ids, np.asarray(grad)))
        self._gradients = row_grads(parts)

    def exported(self) -> keras.Model:
        """A copy of the model holding the rows the PS holds now, needing no PS (see the module)."""
        if self._held is None:
            raise ModelError(f"{self._module}: an export of served tables needs the PS's rows (serve_rows)")
        held = self._held(list(self.specs))

        def clone(layer: Any) -> Any:
            if isinstance(layer, Embedding) and layer.served:
                return Embedding.from_config({**layer.get_config(), "held": max(1, held[layer.spec.name][0].size)})
            return layer.__class__.from_config(layer.get_config())

        copy = keras.models.clone_model(self._model, clone_function=clone)
        for original, twin in zip(self._model.layers, copy.layers):
            if isinstance(original, Embedding) and original.served:
                ids, rows = held[original.spec.name]
                if not ids.size:  # a table no minibatch touched: one row of zeros, for no id at all
                    ids, rows = np.zeros(1, np.int64), np.zeros((1, original.spec.dim), np.float32)
                twin.held_ids.assign(ids)
                twin.table.assign(rows)
            else:
                twin.set_weights(original.get_weights())
        return copy

    def gradients(self) -> dict[str, RowGrads]:
        """The row gradients of the last gradient step (none before one)."""
        return self._gradients
