"""How the PS client cuts each kind of table over the shards (issue 32): one entry per ``TableKind``.

A push's part for a table is split into each shard's piece, and a pull's pieces are put back
whole, by the splitter of the table's kind in :data:`SPLITTERS`:

* the dense and state tables (:class:`Placed`): each shard takes what the model's placement puts
  there (``sharding.py``: whole tensors, largest first, big ones cut into row slices); a pull's
  slices come back whole through the placement's ``Joined``;
* the embedding tables (:class:`ById`): row ``id`` lives on shard ``id mod N`` (``api/embedding.py``);
  a push's row gradients go to their rows' shards, a pull asks each shard for its ids and the rows
  it answers are put back in the order asked.

A new kind is one entry here: a splitter of its own in a module beside this one, or one of these
(a kind of rows keyed by id that lives where the embedding rows do reuses :class:`ById`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from elasticps.api.embedding import PART_GRADIENT, PART_IDS, IdArray, RowGrads, shard_of
from elasticps.api.table_kinds import TableKind
from elasticps.psclient.sharding import Joined, Placement

__all__ = ["SPLITTERS", "ById", "Placed", "RowSplitter", "by_id", "placed"]


class Placed:
    """Tensors by name, cut by the model's placement (the dense variables and the state)."""

    def split(self, tensors: Mapping[str, np.ndarray], placement: Placement) -> list[dict[str, np.ndarray]]:
        """Each shard's pieces of ``tensors`` (views: no copy), keyed by the name the shard holds."""
        return placement.split(tensors)

    def joiner(self, placement: Placement) -> Joined:
        """What puts a pull's slices back whole (buffers made once, filled shard by shard)."""
        return Joined(placement)


class RowSplitter(Protocol):
    """A declared table's rows keyed by id: a push's row gradients and a pull's ids cut over the
    shards, and the pulled rows put back in the order asked."""

    def split(self, part: RowGrads, shards: int) -> list[dict[str, np.ndarray] | None]:
        """Each shard's ids and row gradients (``{"ids", "gradient"}``), None for a shard with none."""
        ...

    def ask(self, ids: IdArray, shards: int) -> list[IdArray]:
        """The ids each shard is asked for, in the order given."""
        ...

    def join(self, ids: IdArray, shards: int, answers: Sequence[np.ndarray | None]) -> np.ndarray:
        """The rows of ``ids`` in their order, from each shard's answer to :meth:`ask` (None: it
        was asked for nothing)."""
        ...


class ById:
    """Row ``id`` on shard ``id mod N``: the embedding tables'."""

    def split(self, part: RowGrads, shards: int) -> list[dict[str, np.ndarray] | None]:
        owners = shard_of(part.ids, shards)
        out: list[dict[str, np.ndarray] | None] = []
        for shard in range(shards):
            mine = owners == shard
            out.append({PART_IDS: part.ids[mine], PART_GRADIENT: part.grads[mine]} if mine.any() else None)
        return out

    def ask(self, ids: IdArray, shards: int) -> list[IdArray]:
        owners = shard_of(ids, shards)
        return [ids[owners == shard] for shard in range(shards)]

    def join(self, ids: IdArray, shards: int, answers: Sequence[np.ndarray | None]) -> np.ndarray:
        owners = shard_of(ids, shards)
        dim = next((a.shape[1] for a in answers if a is not None), 0)
        dtype = next((a.dtype for a in answers if a is not None), np.dtype(np.float32))
        rows = np.empty((ids.size, dim), dtype)
        for shard, answer in enumerate(answers):
            if answer is not None:
                rows[owners == shard] = answer
        return rows


PLACED, BY_ID = Placed(), ById()
SPLITTERS: Mapping[TableKind, Placed | RowSplitter] = {
    TableKind.DENSE: PLACED,
    TableKind.STATE: PLACED,
    TableKind.EMBEDDING: BY_ID,
}


def placed(kind: TableKind) -> Placed:
    """The splitter of a kind placed with the model (ValueError for a kind whose rows go by id)."""
    splitter = SPLITTERS[kind]
    if not isinstance(splitter, Placed):
        raise ValueError(f"tables of kind {kind.value!r} are pulled by id, not placed with the model")
    return splitter


def by_id(kind: TableKind) -> RowSplitter:
    """The splitter of a declared kind's rows (ValueError for a kind whose tables are not pulled by id)."""
    splitter = SPLITTERS[kind]
    if isinstance(splitter, Placed):
        raise ValueError(f"tables of kind {kind.value!r} are placed with the model, not pulled by id")
    return splitter
