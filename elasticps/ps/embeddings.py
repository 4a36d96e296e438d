"""One PS shard's rows of an embedding table (issue 17), in pure numpy.

The shard holds only the rows of its ids (``id mod N``, ``api/embedding.py``) that someone pulled
or pushed: a row is made on first use with its seeded first values, so a table of 10 million
possible ids costs memory only for the ids the data has. Each row has its own optimizer slots and
its own update count (lazy semantics, as TensorFlow's lazy Adam): a push updates exactly the rows
it names, with the job's optimizer formulas (:meth:`Optimizer.update_rows`).

Storage: the rows, each slot and the counts are arrays grown by doubling, row ``i`` of each at
position ``i``; a dict maps an id to its position. Memory per row:
``(1 + len(slots)) * dim * itemsize + 8`` (the count) ``+ 8`` (the id) bytes in the arrays, plus the
dict's entry (about 100 bytes in CPython) and up to 2x of growth room (:meth:`EmbeddingTable.nbytes`
counts the arrays' capacity and the dict).

A push is checked before it changes anything: ids unique (the worker sums a minibatch's gradients
per id), the gradient (n, dim) and finite, the updated rows and slots finite (the update runs on
gathered copies and is written back only then). Pulls and pushes may come from many threads; one
lock per table serialises them.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import EmbeddingError, IdArray, TableSpec, as_ids, initial_rows
from elasticps.ps.optimizers import Optimizer, finite

Array = npt.NDArray[Any]
FIRST_CAPACITY = 1024
IDS = "ids"
STEPS = "steps"
ROWS = "rows"
SLOT = "slot/"


class EmbeddingTable:
    def __init__(self, spec: TableSpec, optimizer: Optimizer, dtype: npt.DTypeLike = np.float32) -> None:
        self.spec = spec
        self.dtype = np.dtype(dtype)
        self._optimizer = optimizer
        self._slot_values = optimizer.row_slots()
        self._lock = threading.Lock()
        self._index: dict[int, int] = {}
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
        return arrays + sys.getsizeof(self._index) + 2 * 28 * len(self._index)  # two int objects per entry

    def pull(self, ids: Any) -> Array:
        """The rows of ``ids`` (len(ids), dim), in their order (an id twice: its row twice); rows
        not held yet are made."""
        ids = as_ids(ids)
        with self._lock:
            at = self._positions(ids)  # may grow the arrays: index them after
            return self._rows[at]

    def push(self, ids: Any, grads: Any, lr: float) -> None:
        """Apply ``grads`` (one row per id, the minibatch's sum for that id) to the rows of
        ``ids``, each row's count + 1. Refused with :class:`EmbeddingError`, changing no row, when
        the ids repeat, the gradient is not (len(ids), dim) or not finite, or the update would
        overflow a row or a slot."""
        ids = as_ids(ids)
        grads = np.asarray(grads)
        self._check_push(ids, grads)
        if not ids.size:
            return
        with self._lock:
            at = self._positions(ids)
            rows = self._rows[at]
            slots = {s: a[at] for s, a in self._slots.items()}
            steps = self._steps[at] + 1
            with np.errstate(all="ignore"):
                self._optimizer.update_rows(rows, slots, steps, grads, lr)
            if not (finite(rows) and all(finite(a) for a in slots.values())):
                raise EmbeddingError(f"embedding table {self.spec.name!r}: the update would overflow a row or a slot; "
                                     "nothing applied (lower the learning rate or clip the gradients)")
            self._rows[at] = rows
            for s, a in slots.items():
                self._slots[s][at] = a
            self._steps[at] = steps

    def _check_push(self, ids: IdArray, grads: Array) -> None:
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
        at = np.fromiter((index.get(i, -1) for i in ids.tolist()), dtype=np.intp, count=ids.size)
        missing = at < 0
        if missing.any():
            new = np.unique(ids[missing])
            start = len(index)
            if start + new.size > self._ids.size:
                self._grow(max(2 * self._ids.size, start + new.size))
            end = start + new.size
            self._ids[start:end] = new
            self._rows[start:end] = initial_rows(self.spec, new, self.dtype)
            for s, value in self._slot_values.items():
                self._slots[s][start:end] = value
            self._steps[start:end] = 0
            index.update(zip(new.tolist(), range(start, end)))
            at[missing] = np.fromiter((index[i] for i in ids[missing].tolist()), dtype=np.intp, count=int(missing.sum()))
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
            self._index = dict(zip(ids.tolist(), range(n)))
