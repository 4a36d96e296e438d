"""One PS shard's rows of an embedding table (issue 17), in pure numpy.

The shard holds only the rows of its ids (``id mod N``, ``api/embedding.py``) that someone pulled
or pushed: a row is made on first use with its seeded first values, so a table of 10 million
possible ids costs memory only for the ids the data has. Each row has its own optimizer slots and
its own update count (lazy semantics, as TensorFlow's lazy Adam): a push updates exactly the rows
it names, with the job's optimizer formulas (:meth:`Optimizer.update_rows`).

Storage: the rows, each slot and the counts are arrays grown by doubling, row ``i`` of each at
position ``i``; an :class:`IdIndex` maps ids to positions, a whole minibatch's ids at once (sorted
arrays and binary search: no Python object per id). Memory per row:
``(1 + len(slots)) * dim * itemsize + 8`` (the count) ``+ 8`` (the id) bytes in the arrays, 16 in
the index, and up to 2x of growth room (:meth:`EmbeddingTable.nbytes` counts the capacity).

A push is checked before it changes anything: ids unique (the worker sums a minibatch's gradients
per id) and of this shard, the gradient (n, dim) and finite, the updated rows and slots finite (the
update runs on gathered copies and is written back only then). Pulls and pushes may come from many
threads; one lock per table serialises them.

In the shard's model (``model.py``) the table is one more :class:`~elasticps.ps.tables.Table`,
keyed ``emb/<name>`` (:func:`table_key`), whose gradient is a :class:`RowGradient`; so every update
rule applies it as it applies the dense table, with nothing of its own: sync rounds sum the
members' row gradients per id and divide by the members (:class:`RowSum`, as the dense mean), async
pushes apply at once with the push's (staleness-modulated) learning rate. An update staged aside
(:meth:`EmbeddingTable.stage`) is written back by its commit; if another update wrote any of its
rows in between (async pushes sharing hot ids), the commit computes it again from the rows as they
are then, so no update is lost. Checkpoint keys: ``emb/<name>/ids``, ``.../rows``, ``.../steps``,
``.../slot/<slot>``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import EmbeddingError, IdArray, TableSpec, as_ids, initial_rows, summed_by_id
from elasticps.ps.errors import GradientError
from elasticps.ps.optimizers import Optimizer, finite

log = logging.getLogger(__name__)

Array = npt.NDArray[Any]
FIRST_CAPACITY = 1024
IDS = "ids"
STEPS = "steps"
ROWS = "rows"
SLOT = "slot/"
PREFIX = "emb/"  # of a table's key in the shard's model and of its checkpoint keys


def table_key(name: str) -> str:
    """The table's key among the shard's tables (``Model.tables``)."""
    return PREFIX + name


@dataclass(frozen=True)
class RowGradient:
    """A push's gradient for one table: distinct ids and each one's summed gradient (n, dim)."""

    ids: IdArray
    grads: Array

    @classmethod
    def empty(cls, dim: int, dtype: npt.DTypeLike = np.float32) -> RowGradient:
        return cls(np.empty(0, np.int64), np.empty((0, dim), dtype))


class RowSum:
    """A sync round's row gradients of one table: the members' (ids, rows), summed per id and
    divided by the members when averaged (the dense table's mean, for the rows a minibatch has)."""

    def __init__(self, dim: int, dtype: np.dtype[Any]) -> None:
        self._dim, self._dtype = dim, dtype
        self._parts: list[RowGradient] = []

    def add(self, gradient: RowGradient, take: bool = False) -> bool:
        if gradient.ids.size:
            self._parts.append(gradient)
        return False

    def averaged(self, count: int) -> RowGradient:
        if not self._parts:
            return RowGradient.empty(self._dim, self._dtype)
        with np.errstate(over="ignore"):  # an overflowing sum is refused by the stage's finiteness check
            ids, summed = summed_by_id(np.concatenate([p.ids for p in self._parts]),
                                       np.concatenate([p.grads for p in self._parts]).astype(self._dtype))
        if count != 1:
            summed *= self._dtype.type(1.0 / count)
        return RowGradient(ids, summed)

    def clear(self) -> None:
        self._parts = []


class IdIndex:
    """Positions of int64 ids, found for a whole array of ids at once.

    Two sorted levels: the main arrays (ids and their positions) and a small pending pair that new
    ids join (a merge of a few thousand entries); the pending pair is merged into the main one once
    it holds more than an eighth of it, so each id is copied a bounded number of times on average
    and a lookup is two binary searches."""

    def __init__(self) -> None:
        self._keys: IdArray = np.empty(0, np.int64)
        self._values: npt.NDArray[np.intp] = np.empty(0, np.intp)
        self._new_keys: IdArray = np.empty(0, np.int64)
        self._new_values: npt.NDArray[np.intp] = np.empty(0, np.intp)

    def __len__(self) -> int:
        return int(self._keys.size + self._new_keys.size)

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes + self._values.nbytes + self._new_keys.nbytes + self._new_values.nbytes)

    def find(self, ids: IdArray) -> npt.NDArray[np.intp]:
        """Each id's position, -1 for an id not held."""
        out = np.full(ids.size, -1, np.intp)
        for keys, values in ((self._keys, self._values), (self._new_keys, self._new_values)):
            if keys.size:
                at = np.minimum(np.searchsorted(keys, ids), keys.size - 1)
                hit = keys[at] == ids
                out[hit] = values[at[hit]]
        return out

    def add(self, ids: IdArray, positions: npt.NDArray[np.intp]) -> None:
        """New ids (distinct, none held) at these positions."""
        keys = np.concatenate([self._new_keys, ids])
        values = np.concatenate([self._new_values, positions])
        if keys.size > max(4096, self._keys.size // 8):
            keys, values = np.concatenate([self._keys, keys]), np.concatenate([self._values, values])
            order = np.argsort(keys, kind="stable")
            self._keys, self._values = keys[order], values[order]
            self._new_keys, self._new_values = np.empty(0, np.int64), np.empty(0, np.intp)
        else:
            order = np.argsort(keys, kind="stable")
            self._new_keys, self._new_values = keys[order], values[order]


class EmbeddingTable:
    def __init__(self, spec: TableSpec, optimizer: Optimizer, dtype: npt.DTypeLike = np.float32,
                 shard: int = 0, shards: int = 1) -> None:
        if not 0 <= shard < shards:
            raise EmbeddingError(f"embedding table {spec.name!r}: shard {shard} of {shards} does not exist")
        self.spec = spec
        self.dtype = np.dtype(dtype)
        self.shard, self.shards = shard, shards
        self._optimizer = optimizer
        self._slot_values = optimizer.row_slots()
        self._lock = threading.Lock()
        self._index = IdIndex()
        self._ids: IdArray
        self._rows: Array
        self._slots: dict[str, Array]
        self._steps: npt.NDArray[np.int64]
        self._allocate(FIRST_CAPACITY)

    @property
    def rows_held(self) -> int:
        return len(self._index)

    def nbytes(self) -> int:
        """The table's memory: its arrays' capacity and the id -> position dict."""
        arrays = self._ids.nbytes + self._rows.nbytes + self._steps.nbytes + sum(a.nbytes for a in self._slots.values())
        return arrays + self._index.nbytes

    def pull(self, ids: Any) -> Array:
        """The rows of ``ids`` (len(ids), dim), in their order (an id twice: its row twice); rows
        not held yet are made. Ids of another shard are refused (EmbeddingError)."""
        ids = as_ids(ids)
        self._check_ids(ids)
        with self._lock:
            at = self._positions(ids)  # may grow the arrays: index them after
            return self._rows[at]

    def push(self, ids: Any, grads: Any, lr: float) -> None:
        """Apply ``grads`` (one row per id, the minibatch's sum for that id) to the rows of
        ``ids``, each row's count + 1. Refused with :class:`EmbeddingError`, changing no row, when
        the ids repeat or are another shard's, the gradient is not (len(ids), dim) or not finite,
        or the update would overflow a row or a slot."""
        gradient = RowGradient(as_ids(ids), np.asarray(grads))
        self._check_push(gradient.ids, gradient.grads)
        try:
            update = self.stage(gradient, self._optimizer, lr)
        except GradientError as err:
            raise EmbeddingError(f"{err} (lower the learning rate or clip the gradients)") from None
        update.commit()

    def held(self) -> tuple[IdArray, Array]:
        """Every row held, sorted by id: the ids and the rows (copies)."""
        with self._lock:
            n = len(self._index)
            order = np.argsort(self._ids[:n], kind="stable")
            return self._ids[:n][order], self._rows[:n][order]

    def _check_ids(self, ids: IdArray) -> None:
        if self.shards > 1 and ids.size and (np.mod(ids, self.shards) != self.shard).any():
            wrong = int(ids[np.mod(ids, self.shards) != self.shard][0])
            raise EmbeddingError(f"embedding table {self.spec.name!r}: id {wrong} belongs to shard "
                                 f"{wrong % self.shards}, not {self.shard} (id mod {self.shards})")

    def _check_push(self, ids: IdArray, grads: Array) -> None:
        self._check_ids(ids)
        name, dim = self.spec.name, self.spec.dim
        if grads.shape != (ids.size, dim):
            raise EmbeddingError(f"embedding table {name!r}: gradient is {list(grads.shape)}, expected [{ids.size}, {dim}] "
                                 "(one row per id)")
        if grads.dtype.kind != "f":
            raise EmbeddingError(f"embedding table {name!r}: gradient dtype {grads.dtype} is not floating-point")
        if np.unique(ids).size != ids.size:
            raise EmbeddingError(f"embedding table {name!r}: ids repeat in one push; sum each id's gradients first")
        if not finite(grads):
            raise EmbeddingError(f"embedding table {name!r}: gradient holds NaN or infinity; nothing applied")

    def _positions(self, ids: IdArray) -> npt.NDArray[np.intp]:
        """Each id's position, making the rows of ids not held (caller holds the lock)."""
        index = self._index
        at = index.find(ids)
        missing = at < 0
        if missing.any():
            new, slot = np.unique(ids[missing], return_inverse=True)
            start = len(index)
            if start + new.size > self._ids.size:
                self._grow(max(2 * self._ids.size, start + new.size))
            end = start + new.size
            self._ids[start:end] = new
            self._rows[start:end] = initial_rows(self.spec, new, self.dtype)
            for s, value in self._slot_values.items():
                self._slots[s][start:end] = value
            self._steps[start:end] = 0
            index.add(new, np.arange(start, end, dtype=np.intp))
            at[missing] = start + slot.reshape(-1)
        return at

    def _allocate(self, capacity: int) -> None:
        self._ids = np.empty(capacity, np.int64)
        self._rows = np.empty((capacity, self.spec.dim), self.dtype)
        self._slots = {s: np.empty((capacity, self.spec.dim), self.dtype) for s in self._slot_values}
        self._steps = np.empty(capacity, np.int64)

    def _grow(self, capacity: int) -> None:
        def grown(a: Array) -> Array:
            out = np.empty((capacity, *a.shape[1:]), a.dtype)
            out[: a.shape[0]] = a
            return out

        self._ids, self._rows, self._steps = grown(self._ids), grown(self._rows), grown(self._steps)
        self._slots = {s: grown(a) for s, a in self._slots.items()}

    # -- checkpoints ---------------------------------------------------------------------------------

    def state(self) -> dict[str, Array]:
        """Every row held: ids, rows, counts and slots (copies, in the order made)."""
        with self._lock:
            n = len(self._index)
            out = {IDS: self._ids[:n].copy(), ROWS: self._rows[:n].copy(), STEPS: self._steps[:n].copy()}
            out.update({SLOT + s: a[:n].copy() for s, a in self._slots.items()})
            return out

    def load_state(self, state: Mapping[str, Array]) -> None:
        """Replace every row with ``state``'s (a :meth:`state` of a table of the same spec and
        optimizer), or :class:`EmbeddingError` saying what does not fit, changing nothing."""
        name, dim = self.spec.name, self.spec.dim
        expected = {IDS, ROWS, STEPS, *(SLOT + s for s in self._slot_values)}
        if set(state) != expected:
            raise EmbeddingError(f"embedding table {name!r}: saved state has {sorted(state)}, expected {sorted(expected)}")
        ids = as_ids(state[IDS], f"embedding table {name!r}: saved ids")
        n = ids.size
        for key in (ROWS, *(SLOT + s for s in self._slot_values)):
            a = np.asarray(state[key])
            if a.shape != (n, dim) or a.dtype != self.dtype or not np.isfinite(a).all():
                raise EmbeddingError(f"embedding table {name!r}: saved {key} is {a.dtype}{list(a.shape)}, expected "
                                     f"finite {self.dtype}[{n}, {dim}]")
        steps = np.asarray(state[STEPS])
        if steps.shape != (n,) or steps.dtype.kind not in "iu" or (steps < 0).any():
            raise EmbeddingError(f"embedding table {name!r}: saved steps must be {n} counts >= 0")
        if np.unique(ids).size != n:
            raise EmbeddingError(f"embedding table {name!r}: saved ids repeat")
        with self._lock:
            self._allocate(max(FIRST_CAPACITY, n))
            self._ids[:n] = ids
            self._rows[:n] = state[ROWS]
            self._steps[:n] = steps
            for s in self._slot_values:
                self._slots[s][:n] = state[SLOT + s]
            self._index = IdIndex()
            self._index.add(ids, np.arange(n, dtype=np.intp))

    # -- the shard's Table interface (tables.py) -----------------------------------------------------

    def register(self, optimizer: Optimizer) -> None:
        """Rows make their slots when they are made: nothing to register."""

    def check(self, gradient: RowGradient) -> None:
        try:
            self._check_push(as_ids(gradient.ids), np.asarray(gradient.grads))
        except EmbeddingError as err:
            raise GradientError(str(err)) from None

    def stage(
        self,
        gradient: RowGradient,
        optimizer: Optimizer,
        lr: float,
        *,
        locking: bool = False,
        implicit_momentum: float = 0.0,
    ) -> _RowUpdate:
        """The rows' update computed aside; GradientError (nothing changed) when any new value of
        a row or slot would not be finite. ``implicit_momentum`` is not used: a row's momentum is
        its own pushes', the push's staleness counts the dense model's updates."""
        update = _RowUpdate(self, gradient, lr)
        with self._lock:
            if not update.compute():
                raise GradientError(f"embedding table {self.spec.name!r}: the update at learning rate {lr:g} would "
                                    "make a row or its optimizer state NaN or infinite; nothing applied")
        return update

    def apply(
        self,
        gradient: RowGradient,
        optimizer: Optimizer,
        lr: float,
        *,
        locking: bool = False,
        implicit_momentum: float = 0.0,
    ) -> None:
        self.stage(gradient, optimizer, lr, locking=locking).commit()

    def accumulator(self) -> RowSum:
        return RowSum(self.spec.dim, self.dtype)

    def snapshot(self) -> dict[str, Array]:
        prefix = f"{table_key(self.spec.name)}/"
        return {prefix + key: value for key, value in self.state().items()}

    @classmethod
    def restored(cls, spec: TableSpec, optimizer: Optimizer, arrays: Mapping[str, Array], shard: int = 0,
                 shards: int = 1) -> EmbeddingTable:
        """The table :meth:`snapshot` wrote, from a checkpoint's arrays (EmbeddingError when they
        do not fit the spec and optimizer)."""
        prefix = f"{table_key(spec.name)}/"
        state = {key.removeprefix(prefix): value for key, value in arrays.items() if key.startswith(prefix)}
        table = cls(spec, optimizer, np.asarray(state.get(ROWS, np.empty(0, np.float32))).dtype, shard, shards)
        table.load_state(state)
        return table


class _RowUpdate:
    """A staged update of some rows: their new values, slots and counts, and the counts they were
    computed from (a commit that finds other counts computes the update again)."""

    def __init__(self, table: EmbeddingTable, gradient: RowGradient, lr: float) -> None:
        self._table, self._lr = table, lr
        self._ids = as_ids(gradient.ids)
        self._grads = np.asarray(gradient.grads)
        self._open = True

    def compute(self) -> bool:
        """Under the table's lock: the new values from the rows as they are; whether all are finite."""
        table = self._table
        if not self._ids.size:
            self._at = np.empty(0, np.intp)
            return True
        at = self._at = table._positions(self._ids)
        self._before = table._steps[at].copy()
        self._rows = table._rows[at]
        self._slots = {s: a[at] for s, a in table._slots.items()}
        self._steps = self._before + 1
        with np.errstate(all="ignore"):
            table._optimizer.update_rows(self._rows, self._slots, self._steps, self._grads, self._lr)
        return finite(self._rows) and all(finite(a) for a in self._slots.values())

    def commit(self) -> None:
        if not self._open:
            raise RuntimeError("this update was committed or discarded already")
        self._open = False
        table, at = self._table, self._at
        if not at.size:
            return
        with table._lock:
            if not np.array_equal(table._steps[at], self._before) and not self.compute():
                # Another update wrote these rows since (async pushes sharing ids) and this one,
                # applied on top of it, would overflow: dropped, as the PS drops a refused push.
                log.warning("embedding table %r: an update concurrent with another would overflow a row; dropped",
                            table.spec.name)
                return
            table._rows[at] = self._rows
            for s, a in self._slots.items():
                table._slots[s][at] = a
            table._steps[at] = self._steps

    def discard(self) -> None:
        self._open = False
