"""One PS shard's rows of an embedding table (issue 17), in pure numpy.

The shard holds only the rows of its ids (``id mod N``, ``api/embedding.py``) that training pulled
or pushed: a row is made on first use with its seeded first values, so a table of 10 million
possible ids costs memory only for the ids the data has; the table's policy (``api/row_policy.py``)
may admit an id only after some sightings, and evict rows past a TTL or over a cap. Each row has its own optimizer slots and
its own update count (lazy semantics, as TensorFlow's lazy Adam): a push updates exactly the rows
it names, with the job's optimizer formulas (:meth:`Optimizer.update_rows`).

Storage: arrays grown by doubling, row ``i`` at position ``i`` of each: the ids, the counts, and
one wide array holding each row beside its optimizer slots (``[row | slot 1 | slot 2]``, so an
update reads and writes a row and its slots in one gather and one scatter, adjacent in memory);
an :class:`~elasticps.ps.id_index.IdIndex` (a hash table) maps ids to positions, a whole
minibatch's ids at once, no Python object per id. Memory per row:
``(1 + len(slots)) * dim * itemsize + 8`` (the count) ``+ 8`` (the id) bytes in the arrays, 32-64
in the index, and up to 2x of growth room (:meth:`EmbeddingTable.nbytes` counts the capacity).

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
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import EmbeddingError, IdArray, TableSpec, as_ids, initial_rows, summed_by_id
from elasticps.api.row_policy import RowPolicy
from elasticps.ps.admission import AdmissionFilter
from elasticps.ps.checkpoint_deltas import CLOCK, GONE, IDS, PREFIX, table_key
from elasticps.ps.errors import GradientError
from elasticps.ps.eviction import expired, victims
from elasticps.ps.id_index import IdIndex
from elasticps.ps.optimizers import Optimizer, finite
from elasticps.ps.tables import RowStats

log = logging.getLogger(__name__)

Array = npt.NDArray[Any]
FIRST_CAPACITY = 1024
STEPS = "steps"
ROWS = "rows"
UPDATED = "updated"  # the table's update count when each row was last used (TTL, LRU); absent in older files
SLOT = "slot/"
CAP_ROOM = 0.9  # a table over its cap evicts down to this share of it


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


class EmbeddingTable:
    def __init__(self, spec: TableSpec, optimizer: Optimizer, dtype: npt.DTypeLike = np.float32,
                 shard: int = 0, shards: int = 1, policy: RowPolicy = RowPolicy()) -> None:
        if not 0 <= shard < shards:
            raise EmbeddingError(f"embedding table {spec.name!r}: shard {shard} of {shards} does not exist")
        self.spec = spec
        self.dtype = np.dtype(dtype)
        self.shard, self.shards = shard, shards
        self.policy = policy
        self._optimizer = optimizer
        self._slot_values = optimizer.row_slots()
        self._lock = threading.Lock()
        self._index = IdIndex()
        self._filter = AdmissionFilter(policy.admit_after, policy.filter_width) if policy.admit_after > 1 else None
        self._ids: IdArray
        self._wide: Array  # (capacity, (1 + slots) * dim): each row, then its slots
        self._rows: Array  # views of it
        self._slots: dict[str, Array]
        self._steps: npt.NDArray[np.int64]
        # When each row was last used, counted in the table's updates: the clock after the update that
        # changed it, or the next update's for a row made or pulled to train (its push is coming).
        self._updated: npt.NDArray[np.int64]
        self._clock = 0  # updates applied to the table on this shard
        self._swept = 0  # the clock at the last TTL sweep
        self._generation = 0  # + 1 whenever rows move (eviction, a load): staged positions are stale
        self._overflowed = False  # a request asked for more rows than the cap (said once)
        self._gone: list[tuple[int, IdArray]] = []  # (clock, ids) of evictions since the last whole checkpoint
        self._logging = False  # evictions are logged only once incremental checkpoints ask (log_evictions)
        self._counts = RowStats()
        self._allocate(FIRST_CAPACITY)

    @property
    def rows_held(self) -> int:
        return len(self._index)

    def nbytes(self) -> int:
        """The table's memory: its arrays' capacity, the id index and the admission filter."""
        arrays = self._ids.nbytes + self._wide.nbytes + self._steps.nbytes + self._updated.nbytes
        return int(arrays) + self._index.nbytes + (self._filter.nbytes if self._filter is not None else 0)

    def stats(self) -> RowStats:
        with self._lock:
            return replace(self._counts, rows=len(self._index), bytes=self.nbytes())

    def pull(self, ids: Any, make: bool = True) -> Array:
        """The rows of ``ids`` (len(ids), dim), in their order (an id twice: its row twice); rows
        not held yet are made, of the ids the admission filter admits (counting this sighting)
        and the cap has room for; an id without a row reads its first values. ``make`` false
        (evaluation, prediction): no row is made, nothing counted. Ids of another shard are refused
        (EmbeddingError)."""
        ids = as_ids(ids)
        self._check_ids(ids)
        with self._lock:
            at = self._positions(ids, sighting=True) if make else self._index.find(ids)  # may grow the arrays
            if make:  # used for the next update: a row pulled for a step is not the least recent while its push travels
                self._updated[at[at >= 0]] = self._clock + 1
            if (at >= 0).all():
                return self._rows[at]
            held = at >= 0
            rows = np.empty((ids.size, self.spec.dim), self.dtype)
            rows[held] = self._rows[at[held]]
            rows[~held] = initial_rows(self.spec, ids[~held], self.dtype)
            if make:
                self._counts = replace(self._counts, rowless_reads=self._counts.rowless_reads + int((~held).sum()))
            return rows

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
        if _repeat(ids):
            raise EmbeddingError(f"embedding table {name!r}: ids repeat in one push; sum each id's gradients first")
        if not finite(grads):
            raise EmbeddingError(f"embedding table {name!r}: gradient holds NaN or infinity; nothing applied")

    def _positions(self, ids: IdArray, sighting: bool) -> npt.NDArray[np.intp]:
        """Each id's position, making the rows of ids not held that the admission filter admits
        (``sighting``: a pull, counted by the filter) and the cap has room for, -1 for the others
        (caller holds the lock)."""
        index = self._index
        at = index.find(ids)
        missing = at < 0
        if not missing.any():
            return at
        new = ids[missing]
        if _increasing(new):  # the usual request: a minibatch's distinct ids, sorted
            slot = np.arange(new.size)
        else:
            new, slot = np.unique(new, return_inverse=True)
            slot = slot.reshape(-1)  # each missing id's place in new
        if self._filter is not None:
            admitted = self._filter.count(new) if sighting else self._filter.admitted(new)
            if not admitted.all():
                slot = np.where(admitted[slot], (np.cumsum(admitted) - 1)[slot], -1)
                new = new[admitted]
        start, made = self._make(new, at) if new.size else (0, 0)
        at[missing] = np.where((slot >= 0) & (slot < made), start + slot, -1)
        return at

    def _make(self, new: IdArray, at: npt.NDArray[np.intp]) -> tuple[int, int]:
        """Rows for ``new`` (distinct ids not held), after evicting to stay under the cap (none of
        the rows at ``at``'s held positions, which are renumbered in place): the position of the
        first and how many were made. A request asking for more rows than the cap holds gets rows
        for the first of its new ids that fit (the others read first values and drop their
        gradients, as ids not admitted), said once."""
        cap = self.policy.max_rows
        if cap and len(self._index) + new.size > cap:
            asked = at[at >= 0]
            if asked.size + new.size > cap and not self._overflowed:
                self._overflowed = True
                log.warning("embedding table %r: one request asks for %d rows of a shard that holds at most %d "
                            "(maxRows): the ids past the cap read first values and drop their gradients; a cap "
                            "above the rows of a minibatch (of every worker's, sync) keeps them", self.spec.name,
                            asked.size + new.size, cap)  # fmt: skip
            count = len(self._index) + new.size - max(int(CAP_ROOM * cap), asked.size + new.size)
            n = len(self._index)
            gone = victims(self._updated[:n], self._steps[:n], self.policy.evict, min(count, n), asked)
            renumbered = self._evict(gone)
            at[at >= 0] = renumbered[at[at >= 0]]
            new = new[: max(0, cap - len(self._index))]
        index = self._index
        start = len(index)
        if start + new.size > self._ids.size:
            grown = max(2 * self._ids.size, start + new.size)
            self._grow(min(grown, cap) if cap else grown)
        end = start + new.size
        self._ids[start:end] = new
        self._rows[start:end] = initial_rows(self.spec, new, self.dtype)
        for s, value in self._slot_values.items():
            self._slots[s][start:end] = value
        self._steps[start:end] = 0
        self._updated[start:end] = self._clock + 1  # used for the next update
        index.add(new, np.arange(start, end, dtype=np.intp))
        self._counts = replace(self._counts, made=self._counts.made + new.size)
        return start, int(new.size)

    def _evict(self, gone: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
        """Removes the rows at ``gone``: the rows past the new end move into the places they leave
        below it (memory for the rows moved, not a copy of the table); each old position's new one
        (-1 for the rows gone). Staged updates see the generation move and compute again."""
        n = len(self._index)
        renumbered = np.arange(n, dtype=np.intp)
        gone = np.unique(gone)
        if not gone.size:
            return renumbered
        end = n - gone.size
        renumbered[gone] = -1
        holes = gone[gone < end]
        movers = end + np.flatnonzero(renumbered[end:] >= 0)  # as many as the holes
        gone_ids, moved_ids = self._ids[gone], self._ids[movers]
        if self._logging:
            self._gone.append((self._clock + 1, gone_ids))  # as a use: of the next update
        for array in (self._ids, self._wide, self._steps, self._updated):
            array[holes] = array[movers]
        renumbered[movers] = holes
        self._index.discard(gone_ids)
        self._index.move(moved_ids, holes)
        self._generation += 1
        self._counts = replace(self._counts, evicted=self._counts.evicted + int(gone.size))
        return renumbered

    def _ticked(self, at: npt.NDArray[np.intp], dropped: int) -> None:
        """An update was applied to the rows at ``at`` (``dropped`` gradient rows left out): the
        clock moves and dates them; rows past their TTL go, swept every sixteenth of it (caller
        holds the lock)."""
        self._clock += 1
        self._updated[at] = self._clock
        if dropped:
            self._counts = replace(self._counts, dropped_gradients=self._counts.dropped_gradients + dropped)
        ttl = self.policy.ttl
        if ttl and self._clock - self._swept >= max(1, ttl // 16):
            self._swept = self._clock
            n = len(self._index)
            self._evict(expired(self._updated[:n], self._clock, ttl))

    def _allocate(self, capacity: int, fit: int = 0) -> None:
        """Empty arrays for ``capacity`` rows, at most the cap's, at least ``fit``."""
        capacity = max(min(capacity, self.policy.max_rows) if self.policy.max_rows else capacity, fit)
        self._ids = np.empty(capacity, np.int64)
        self._wide = np.empty((capacity, (1 + len(self._slot_values)) * self.spec.dim), self.dtype)
        self._steps = np.empty(capacity, np.int64)
        self._updated = np.empty(capacity, np.int64)
        self._views()

    def _views(self) -> None:
        """The rows and each slot: column ranges of the wide array."""
        self._rows, self._slots = _split(self._wide, self.spec.dim, self._slot_values)

    def _grow(self, capacity: int) -> None:
        """The arrays resized in place (``realloc``: a large array's pages are remapped, not
        copied); the views of the wide array made again. Every reader takes the lock and keeps
        no view past it, so no view of the old memory remains."""
        for array in (self._ids, self._wide, self._steps, self._updated):
            array.resize((capacity, *array.shape[1:]), refcheck=False)
        self._views()

    # -- checkpoints ---------------------------------------------------------------------------------

    def state(self) -> dict[str, Array]:
        """Every row held: ids, rows, counts, last updates and slots (copies, in the order of their
        positions), and the table's clock."""
        with self._lock:
            n = len(self._index)
            out = {IDS: self._ids[:n].copy(), ROWS: self._rows[:n].copy(), STEPS: self._steps[:n].copy(),
                   UPDATED: self._updated[:n].copy(), CLOCK: np.array([self._clock], np.int64)}  # fmt: skip
            out.update({SLOT + s: a[:n].copy() for s, a in self._slots.items()})
            return out

    def load_state(self, state: Mapping[str, Array]) -> None:
        """Replace every row with ``state``'s (a :meth:`state` of a table of the same spec and
        optimizer; one saved before row policies has no last updates and clock: all 0), or
        :class:`EmbeddingError` saying what does not fit, changing nothing. More rows than the
        policy's cap: the policy's choice of them goes at once."""
        name, dim = self.spec.name, self.spec.dim
        expected = {IDS, ROWS, STEPS, *(SLOT + s for s in self._slot_values)}
        if set(state) - {UPDATED, CLOCK} != expected or len({UPDATED, CLOCK} & set(state)) == 1:
            raise EmbeddingError(f"embedding table {name!r}: saved state has {sorted(state)}, expected {sorted(expected)}"
                                 f" (and {UPDATED!r}, {CLOCK!r})")  # fmt: skip
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
        if _repeat(ids):
            raise EmbeddingError(f"embedding table {name!r}: saved ids repeat")
        clock = np.asarray(state.get(CLOCK, np.zeros(1, np.int64)))
        updated = np.asarray(state.get(UPDATED, np.zeros(n, np.int64)))
        if clock.shape != (1,) or clock.dtype.kind not in "iu" or updated.shape != (n,) or updated.dtype.kind not in "iu" \
                or (updated > clock[0] + 1).any() or clock[0] < 0:
            raise EmbeddingError(f"embedding table {name!r}: saved {UPDATED} must be {n} counts at most its {CLOCK} + 1")
        with self._lock:
            self._allocate(max(FIRST_CAPACITY, n), fit=n)
            self._ids[:n] = ids
            self._rows[:n] = state[ROWS]
            self._steps[:n] = steps
            self._updated[:n] = updated
            self._clock = self._swept = int(clock[0])
            for s in self._slot_values:
                self._slots[s][:n] = state[SLOT + s]
            self._index = IdIndex()
            self._index.add(ids, np.arange(n, dtype=np.intp))
            self._generation += 1
            cap = self.policy.max_rows
            if cap and n > cap:
                self._evict(victims(self._updated[:n], self._steps[:n], self.policy.evict, n - int(CAP_ROOM * cap),
                                    np.empty(0, np.intp)))  # fmt: skip

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

    @property
    def clock(self) -> int:
        """Updates applied to the table on this shard (what a delta is counted from)."""
        return self._clock

    def delta(self, since: int) -> dict[str, Array]:
        """What changed after clock ``since`` (a whole checkpoint's): the rows used after it (made,
        pulled to train, updated; a superset of those whose values changed), with their counts,
        last uses and slots, the ids evicted after it and not held again (``gone``), and the clock;
        keyed as :meth:`snapshot`. :func:`merged` puts a whole checkpoint's arrays and a delta
        together again."""
        with self._lock:
            n = len(self._index)
            used = np.flatnonzero(self._updated[:n] > since)
            gone = [ids for clock, ids in self._gone if clock > since]
            evicted = np.unique(np.concatenate(gone)) if gone else np.empty(0, np.int64)
            if evicted.size:
                evicted = evicted[self._index.find(evicted) < 0]  # made again since: among the rows
            out = {IDS: self._ids[used], ROWS: self._rows[used], STEPS: self._steps[used], UPDATED: self._updated[used],
                   CLOCK: np.array([self._clock], np.int64), GONE: evicted}  # fmt: skip
            out.update({SLOT + s: a[used] for s, a in self._slots.items()})
        prefix = f"{table_key(self.spec.name)}/"
        return {prefix + key: value for key, value in out.items()}

    def log_evictions(self) -> None:
        """From now on the ids evicted are kept for :meth:`delta` (incremental checkpoints: a
        whole one is being taken, deltas of it will follow); :meth:`forget_evictions` trims them."""
        with self._lock:
            self._logging = True

    def forget_evictions(self, through: int) -> None:
        """A whole checkpoint at clock ``through`` is on disk: evictions up to it no delta needs."""
        with self._lock:
            self._gone = [(clock, ids) for clock, ids in self._gone if clock > through]

    @classmethod
    def restored(cls, spec: TableSpec, optimizer: Optimizer, arrays: Mapping[str, Array], shard: int = 0,
                 shards: int = 1, policy: RowPolicy = RowPolicy()) -> EmbeddingTable:
        """The table :meth:`snapshot` wrote, from a checkpoint's arrays (EmbeddingError when they
        do not fit the spec and optimizer)."""
        prefix = f"{table_key(spec.name)}/"
        state = {key.removeprefix(prefix): value for key, value in arrays.items() if key.startswith(prefix)}
        table = cls(spec, optimizer, np.asarray(state.get(ROWS, np.empty(0, np.float32))).dtype, shard, shards, policy)
        table.load_state(state)
        return table


def _increasing(ids: IdArray) -> bool:
    """Whether ``ids`` are sorted and distinct (one pass)."""
    return bool((ids[1:] > ids[:-1]).all())


def _repeat(ids: IdArray) -> bool:
    """Whether an id comes twice (one pass for sorted ids, as requests send them; else a sort,
    cheaper than ``np.unique`` for a minibatch's ids)."""
    if _increasing(ids):
        return False
    ordered = np.sort(ids)
    return bool((ordered[1:] == ordered[:-1]).any())


def _split(wide: Array, dim: int, slots: Mapping[str, float]) -> tuple[Array, dict[str, Array]]:
    """The rows and each slot of a wide array (views: its column ranges, in the order of ``slots``)."""
    return wide[:, :dim], {s: wide[:, (k + 1) * dim:(k + 2) * dim] for k, s in enumerate(slots)}


class _RowUpdate:
    """A staged update of some rows: their new values, slots and counts, and the counts and the
    table's generation they were computed from (a commit that finds other counts, or rows moved
    by an eviction, computes the update again). Rows of ids the admission filter has not admitted
    are left out, their gradients dropped and counted at the commit."""

    def __init__(self, table: EmbeddingTable, gradient: RowGradient, lr: float) -> None:
        self._table, self._lr = table, lr
        self._ids = as_ids(gradient.ids)
        self._grads = np.asarray(gradient.grads)
        self._open = True
        self._dropped = 0
        self._generation = -1

    def compute(self) -> bool:
        """Under the table's lock: the new values from the rows as they are; whether all are finite."""
        table = self._table
        at = table._positions(self._ids, sighting=False) if self._ids.size else np.empty(0, np.intp)
        self._generation = table._generation  # after any eviction the positions made
        held = at >= 0
        grads = self._grads if held.all() else self._grads[held]
        self._at = at = at[held]
        self._dropped = int(self._ids.size - at.size)
        if not at.size:
            return True
        self._before = table._steps[at].copy()
        self._wide = table._wide[at]  # the rows and their slots, in one gather
        rows, slots = _split(self._wide, table.spec.dim, table._slot_values)
        self._steps = self._before + 1
        with np.errstate(all="ignore"):
            table._optimizer.update_rows(rows, slots, self._steps, grads, self._lr)
        return finite(self._wide)

    def commit(self) -> None:
        if not self._open:
            raise RuntimeError("this update was committed or discarded already")
        self._open = False
        table = self._table
        with table._lock:
            moved = table._generation != self._generation
            written = bool(self._at.size) and not np.array_equal(table._steps[self._at], self._before)
            if (moved or written) and not self.compute():
                # Another update wrote these rows since (async pushes sharing ids) and this one,
                # applied on top of it, would overflow: dropped, as the PS drops a refused push.
                log.warning("embedding table %r: an update concurrent with another would overflow a row; dropped",
                            table.spec.name)
                return
            at = self._at
            if at.size:
                table._wide[at] = self._wide
                table._steps[at] = self._steps
            table._ticked(at, self._dropped)

    def discard(self) -> None:
        self._open = False

