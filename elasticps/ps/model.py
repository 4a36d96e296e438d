"""The model one shard holds: its tables by name and the one optimizer that updates them.

Built by the store (``store.py``) when a worker pushes a model and by the checkpoint schedule
(``checkpointing.py``) when a shard restores; used by the update rules (``rules.py``), which
apply an :data:`Update` (each table's gradient, keyed by table name) through it. The dense table is
always there, under :data:`~elasticps.ps.tables.DENSE`, and so is the model's non-trainable state,
under :data:`~elasticps.ps.state_table.STATE` (``state_table.py``: empty for a model without any);
other tables (embeddings) sit beside them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elasticps.ps.errors import GradientError
from elasticps.ps.optimizers import Optimizer
from elasticps.ps.state_table import STATE, StateTable
from elasticps.ps.tables import DENSE, Accumulator, DenseTable, Table

# One push's gradients: table name -> that table's gradient (its own type; see tables.py).
Update = Mapping[str, Any]


class Model:
    def __init__(
        self,
        dense: DenseTable,
        optimizer: Optimizer,
        others: Mapping[str, Table[Any]] | None = None,
        state: StateTable | None = None,
    ) -> None:
        self.dense = dense
        self.optimizer = optimizer
        self.state = state if state is not None else StateTable()
        self.tables: dict[str, Table[Any]] = {DENSE: dense, STATE: self.state, **(others or {})}
        for table in self.tables.values():
            table.register(optimizer)

    def check(self, update: Update) -> None:
        """Raises GradientError, changing nothing, unless every table accepts its gradient."""
        for name, gradient in update.items():
            table = self.tables.get(name)
            if table is None:
                raise GradientError(f"no table {name!r} on this shard")
            table.check(gradient)

    def apply(self, update: Update, lr: float, *, locking: bool = False) -> None:
        for name, gradient in update.items():
            self.tables[name].apply(gradient, self.optimizer, lr, locking=locking)

    def accumulators(self) -> dict[str, Accumulator[Any]]:
        return {name: table.accumulator() for name, table in self.tables.items()}
