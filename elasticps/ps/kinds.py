"""What a shard does with each kind of table (issue 32): one registry entry per ``TableKind``.

The store (``store.py``) makes a pushed model's tables through :data:`KINDS` and the checkpoint
schedule (``checkpointing.py``) restores a saved model's through it, dispatching on the kind each
declared table's spec carries (the checkpoint's ``meta["tables"]``; a spec saved without a kind is
an embedding table's). An entry says, for its kind:

* ``key``: the table's key among the model's tables (``Model.tables``): ``dense``, ``state``,
  ``emb/<name>``; its checkpoint keys and optimizer state are named under it by the table itself;
* ``create``: a new table, from a declared table's spec or, for the implicit dense and state
  tables, the pushed model's tensors, on this shard of ``shards``, sharing the shard's optimizer;
* ``restore``: the table a checkpoint's arrays hold (the meta too: the state table reads there
  whether it was saved at all).

A new kind is a module with its table (a :class:`~elasticps.ps.tables.Table`; a
:class:`~elasticps.ps.tables.RowTable` too if its rows are pulled by id) and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import TableSpec
from elasticps.api.row_policy import RowPolicy
from elasticps.api.table_kinds import TableKind
from elasticps.ps.checkpoint_deltas import table_key
from elasticps.ps.embeddings import EmbeddingTable
from elasticps.ps.optimizers import Optimizer
from elasticps.ps.state_table import STATE, StateTable
from elasticps.ps.tables import DENSE, DenseTable, Table

__all__ = ["KINDS", "Kind", "Making", "Restoring"]

Array = npt.NDArray[Any]
_NO_ARRAYS: Mapping[str, Array] = {}


@dataclass(frozen=True)
class Making:
    """What a new table is made from: where (this shard of ``shards``, whose optimizer it shares)
    and from what: a declared table's ``spec``, or the pushed model's ``tensors`` for an implicit
    one (``received``: the PS's own buffers, which the dense table may keep)."""

    shard: int
    shards: int
    optimizer: Optimizer
    spec: TableSpec | None = None
    tensors: Mapping[str, Array] = field(default_factory=lambda: _NO_ARRAYS)
    received: bool = False
    policy: RowPolicy = RowPolicy()  # a table of rows: which it keeps (api/row_policy.py)


@dataclass(frozen=True)
class Restoring:
    """A checkpoint's table to restore: where (as :class:`Making`), its spec if declared, and the
    checkpoint's arrays and meta."""

    shard: int
    shards: int
    optimizer: Optimizer
    arrays: Mapping[str, Array]
    meta: Mapping[str, Any]
    spec: TableSpec | None = None
    policy: RowPolicy = RowPolicy()


@dataclass(frozen=True)
class Kind:
    key: Callable[[TableSpec | None], str]
    create: Callable[[Making], Table[Any]]
    restore: Callable[[Restoring], Table[Any]]


def _declared(spec: TableSpec | None) -> TableSpec:
    if spec is None:
        raise ValueError("a declared table is made from its spec, and none was given")
    return spec


def _embedding(making: Making) -> EmbeddingTable:
    return EmbeddingTable(_declared(making.spec), making.optimizer, np.float32, making.shard, making.shards, making.policy)


def _restored_embedding(saved: Restoring) -> EmbeddingTable:
    return EmbeddingTable.restored(_declared(saved.spec), saved.optimizer, saved.arrays, saved.shard, saved.shards,
                                   saved.policy)


KINDS: Mapping[TableKind, Kind] = {
    TableKind.DENSE: Kind(
        key=lambda spec: DENSE,
        create=lambda making: DenseTable.create(making.tensors, making.shard, received=making.received),
        restore=lambda saved: DenseTable.restored(saved.arrays, saved.shard),
    ),
    TableKind.STATE: Kind(
        key=lambda spec: STATE,
        create=lambda making: StateTable.create(making.tensors, making.shard),
        # meta["state_table"]: saved with a state table; absent (older files): one that adopts.
        restore=lambda saved: StateTable.restored(saved.arrays, saved.shard,
                                                  saved=bool(saved.meta.get("state_table", False))),
    ),
    TableKind.EMBEDDING: Kind(key=lambda spec: table_key(_declared(spec).name), create=_embedding,
                              restore=_restored_embedding),
}
