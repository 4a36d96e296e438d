"""The model one shard holds: its tables by name and the one optimizer that updates them.

Built by the store (``store.py``) when a worker pushes a model and by the checkpoint schedule
(``checkpointing.py``) when a shard restores; used by the update rules (``rules.py``), which
apply an :data:`Update` (each table's gradient, keyed by table name) through it. The dense table is
always there, under :data:`~elasticps.ps.tables.DENSE`, and so is the model's non-trainable state,
under :data:`~elasticps.ps.state_table.STATE` (``state_table.py``: empty for a model without any);
other tables sit beside them: the declared tables, each keyed by its kind (``kinds.py``): the
embedding tables (``embeddings.py``), keyed ``emb/<name>``. :meth:`Model.of` takes them all as
the kinds' factories made them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from elasticps.api.embedding import TableSpec
from elasticps.ps.errors import GradientError
from elasticps.ps.layout import Layout
from elasticps.ps.optimizers import Optimizer
from elasticps.ps.state_table import STATE, StateTable
from elasticps.ps.tables import DENSE, Accumulator, DenseTable, RowTable, Staged, Table

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

    @classmethod
    def of(cls, tables: Mapping[str, Table[Any]], optimizer: Optimizer) -> Model:
        """The model of ``tables`` by key: a dense table under ``dense``, its state under ``state``
        (an empty one when absent), every other table beside them."""
        dense, state = tables.get(DENSE), tables.get(STATE)
        if not isinstance(dense, DenseTable):
            raise TypeError(f"a model's {DENSE!r} table must be a DenseTable, got {type(dense).__name__}")
        if state is not None and not isinstance(state, StateTable):
            raise TypeError(f"a model's {STATE!r} table must be a StateTable, got {type(state).__name__}")
        others = {key: table for key, table in tables.items() if key not in (DENSE, STATE)}
        return cls(dense, optimizer, others, state=state)

    @functools.cached_property
    def layout(self) -> Layout:
        """What a stream to this model may carry, as the model was installed (a state table that
        adopts takes tensors beyond it)."""
        specs = {name: table.spec for name, table in self.embeddings.items()}
        return Layout.of(self.dense.variables, self.state.values, adopts_state=self.state.adopts_new, tables=specs)

    @functools.cached_property
    def embeddings(self) -> dict[str, RowTable]:
        """The declared tables whose rows are pulled by id (embedding tables), by their own names."""
        return {t.spec.name: t for t in self.tables.values() if isinstance(t, RowTable)}

    @functools.cached_property
    def keys(self) -> dict[str, str]:
        """Each declared table's key in :attr:`tables`, by its own name."""
        return {t.spec.name: key for key, t in self.tables.items() if isinstance(t, RowTable)}

    @property
    def empty(self) -> bool:
        """No variable, no state, no table: the placement put none of the model on this shard."""
        return not self.dense.variables and not self.state.values and not self.embeddings

    def difference(self, variables: Mapping[str, Any], state: Mapping[str, Any],
                   tables: Sequence[TableSpec] = ()) -> str:
        """How a pushed model (arrays by name, table specs) differs from this one ("" when it
        does not): names, shapes and dtypes of the variables and of the state tensors; tables."""
        found = _difference("variable", self.dense.variables, variables)
        held = sorted((t.spec for t in self.embeddings.values()), key=lambda spec: spec.name)
        pushed = sorted(tables, key=lambda spec: spec.name)
        if not found and held != pushed:
            found = f"the pushed model's embedding tables are {pushed}, this shard's {held}"
        if found or self.state.adopts_new:  # a table that adopts state takes what workers push
            return found
        return _difference("state tensor", self.state.values, state)

    def check(self, update: Update) -> None:
        """Raises GradientError, changing nothing, unless every table accepts its gradient."""
        for name, gradient in update.items():
            table = self.tables.get(name)
            if table is None:
                raise GradientError(f"no table {name!r} on this shard")
            table.check(gradient)

    def apply(self, update: Update, lr: float, *, locking: bool = False, implicit_momentum: float = 0.0) -> None:
        """Applies every table's gradient, or none: GradientError (nothing changed) when any
        table's new values would not be finite."""
        self.commit(self.stage(update, lr, locking=locking, implicit_momentum=implicit_momentum))

    def stage(
        self, update: Update, lr: float, *, locking: bool = False, implicit_momentum: float = 0.0
    ) -> list[Staged]:
        """Every table's update computed aside (see ``tables.py``); GradientError, nothing held,
        when any would not be finite. Commit the list with :meth:`commit` or :meth:`discard` it."""
        staged: list[Staged] = []
        try:
            for name, table in self.tables.items():  # the model's order, whatever the push's
                if name in update:
                    staged.append(
                        table.stage(update[name], self.optimizer, lr, locking=locking, implicit_momentum=implicit_momentum)
                    )
        except BaseException:
            self.discard(staged)
            raise
        return staged

    @staticmethod
    def commit(staged: list[Staged]) -> None:
        for update in staged:
            update.commit()

    @staticmethod
    def discard(staged: list[Staged]) -> None:
        for update in staged:
            update.discard()

    def accumulators(self) -> dict[str, Accumulator[Any]]:
        return {name: table.accumulator() for name, table in self.tables.items()}


def _difference(what: str, held: Mapping[str, Any], pushed: Mapping[str, Any]) -> str:
    missing, extra = sorted(set(held) - set(pushed)), sorted(set(pushed) - set(held))
    if missing:
        return f"the pushed model lacks {what} {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    if extra:
        return f"the pushed model has {what} {extra[0]!r}, which this shard does not hold" + (
            f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        )
    for name, value in held.items():
        other = pushed[name]
        if value.shape != other.shape or value.dtype != other.dtype:
            return (
                f"{what} {name!r} is {other.dtype}{list(other.shape)} in the pushed model, "
                f"{value.dtype}{list(value.shape)} on this shard"
            )
    return ""
