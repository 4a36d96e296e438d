"""The torch worker's side of embedding tables served by the PS: rows in, gradients out, and an
export holding the PS's rows.

Used by the torch trainer (``trainer.py``). The model was made inside
``elasticps.backends.api.tables_served()``, so its ``Embedding`` modules hold no table: each
call pulls its distinct ids' rows itself (torch runs eagerly, so no probe of the ids is needed, as
the Keras side's is). :meth:`ServedTables.take` turns the rows' gradients after ``backward`` into
one :class:`~elasticps.api.embedding.RowGrads` per table (summed over the modules, and the calls,
sharing a table), which the next push carries. :meth:`ServedTables.holding` swaps each served
module for one holding the rows the PS holds, for an export, and back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from elasticps.api.embedding import IdArray, RowGrads, TableSpec, row_grads
from elasticps.backends.api import HeldRows, ModelError, RowSource
from elasticps.backends.pytorch.layers import Embedding, Rows


def _rows_of(source: RowSource, table: str) -> Rows:
    return lambda ids, training: source({table: ids}, training)[table]


class ServedTables:
    def __init__(self, model: nn.Module, module: str) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, Embedding) and m.served]
        specs: dict[str, TableSpec] = {}
        for layer in self.layers:
            held = specs.setdefault(layer.spec.name, layer.spec)
            if held != layer.spec:
                raise ModelError(f"{module}: two Embedding modules name table {held.name!r} with different "
                                 f"settings ({held} and {layer.spec})")  # fmt: skip
        self.specs = specs
        self._model = model
        self._module = module
        self._held: HeldRows | None = None
        self._gradients: dict[str, RowGrads] = {}

    def __bool__(self) -> bool:
        return bool(self.layers)

    def serve(self, source: RowSource, held: HeldRows) -> None:
        """Where rows come from from now on (the PS, once it holds the model), and every row held
        (for an export)."""
        for layer in self.layers:
            layer.serve(_rows_of(source, layer.spec.name))
        self._held = held

    @contextlib.contextmanager
    def initial(self) -> Iterator[None]:
        """Inside, calls take their rows' first values, computed here (building the model before
        the PS holds it)."""
        sources = [layer.source for layer in self.layers]
        for layer in self.layers:
            layer.serve(None)
        try:
            yield
        finally:
            for layer, source in zip(self.layers, sources):
                layer.serve(source)

    def clear(self) -> None:
        """Forgets the calls so far (before a gradient step's forward pass)."""
        for layer in self.layers:
            layer.clear()

    def take(self) -> None:
        """The rows' gradients of the calls since :meth:`clear`, as each table's row gradients."""
        parts: dict[str, list[tuple[IdArray, np.ndarray]]] = {}
        for layer in self.layers:
            for ids, rows in layer.taken():
                grad = rows.grad
                value = np.zeros(tuple(rows.shape), np.float32) if grad is None else grad.detach().cpu().numpy()
                parts.setdefault(layer.spec.name, []).append((ids, value))
            layer.clear()
        self._gradients = row_grads(parts)

    def gradients(self) -> dict[str, RowGrads]:
        """The row gradients of the last gradient step (none before one)."""
        return self._gradients

    @contextlib.contextmanager
    def holding(self, device: torch.device) -> Iterator[None]:
        """Inside, every served module of the model is one holding the rows the PS holds now (a
        model that serves without a PS, for an export); after, the served ones again."""
        if self._held is None:
            raise ModelError(f"{self._module}: an export of served tables needs the PS's rows (serve_rows)")
        held = self._held(list(self.specs))
        swapped: list[tuple[nn.Module, str, Embedding]] = []
        for parent in self._model.modules():
            for key, child in list(parent._modules.items()):
                if isinstance(child, Embedding) and child.served:
                    ids, rows = held[child.spec.name]
                    parent._modules[key] = child.holding(ids, rows).to(device)
                    swapped.append((parent, key, child))
        try:
            yield
        finally:
            for parent, key, child in swapped:
                parent._modules[key] = child
