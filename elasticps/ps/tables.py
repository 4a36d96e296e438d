"""The tables a parameter-store shard holds, behind one interface, and the dense table.

Callers: the store (``store.py``) builds a :class:`DenseTable` from a pushed model, the model
(``model.py``) routes each table its gradient, the update rules (``rules.py``) apply direct or
averaged gradients through :meth:`Table.apply`, and the checkpoint schedule (``checkpointing.py``)
saves and restores each table's arrays under the table's own key prefix.

A table owns its parameters, what it accepts as a gradient (and the checks, which raise
:class:`~elasticps.ps.errors.GradientError` before anything changes), how a sync round sums its
gradients (:meth:`Table.accumulator`) and how it writes itself into a checkpoint. The gradient's
type is the table's own: the dense table takes one array per variable; an embedding table would take
row ids with row gradients, create rows lazily on first pull, and apply them with a row-wise
optimizer call (``Optimizer.apply_rows``), all without touching the dense path. The model's
non-trainable state is such a table (``state_table.py``): its "gradient" is a worker's current
values, applied by assignment, averaged per sync round.

An update is applied in two steps, so a push is refused as a whole or applied as a whole:
:meth:`Table.stage` computes the table's new values aside and raises GradientError, changing
nothing, when any would be NaN or infinite (a finite gradient can overflow a variable or an
optimizer slot); the :class:`Staged` update it returns is then committed or discarded.
The dense table first asks the optimizer to prove the update finite from bounds read off the
gradient, variables and slots (``Optimizer.proves_finite``, a few read-only passes): the common
case, then committed in place exactly as main's unchecked apply. Only when the bounds cannot prove
it does it compute the update into a :class:`~elasticps.ps.optimizers.Scratch` from a small pool
(made on first use and reused push after push), check it exactly and copy it in on commit. At most
:data:`APPLY_ROOMS` dense updates run at once either way (the others wait), so the scratch memory
is bounded, and so is how many unlocked updates can overlap (the proof's margin counts on it); an
unlocked update that takes the exact path takes every room, so it never overlaps an in-place one.

All tables of a shard share its one optimizer, whose state is keyed by name: a table other than the
dense one names its optimizer state after itself (e.g. ``<table>/<id>``) and its checkpoint keys
after itself too, so neither collides with a dense variable.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import IdArray, TableSpec
from elasticps.ps.errors import GradientError
from elasticps.ps.optimizers import APPLY_ROOMS, Optimizer, Scratch, finite, magnitude

__all__ = ["APPLY_ROOMS", "DENSE", "FLOATS", "Accumulator", "DenseSum", "DenseTable", "RowTable", "Staged", "Table", "finite"]

Array = npt.NDArray[Any]
G = TypeVar("G")

DENSE = "dense"  # the dense table's name in the store
FLOATS = frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})  # what parameters may be


class Staged(Protocol):
    """A table's update, computed and checked, not applied yet: commit it or discard it (once)."""

    def commit(self) -> None: ...

    def discard(self) -> None: ...


class Accumulator(Protocol[G]):
    """Sums a sync round's gradients for one table."""

    def add(self, gradient: G, take: bool = False) -> bool:
        """Adds ``gradient`` to the sum. ``take``: the sum may be made in the gradient's own memory
        (it is the PS's, and the round drops it after); True when it was, and the gradient no
        longer holds what was pushed."""
        ...

    def averaged(self, count: int) -> G:
        """The mean of the ``count`` gradients added (may reuse the sums' memory)."""
        ...

    def clear(self) -> None: ...


class Table(Protocol[G]):
    """One named set of parameters on a shard, with the gradients of type ``G`` it accepts."""

    def register(self, optimizer: Optimizer) -> None:
        """Creates the optimizer state of the parameters that exist now (once per installed model)."""
        ...

    def check(self, gradient: G) -> None:
        """Raises GradientError when the gradient cannot be applied; never changes anything."""
        ...

    def stage(
        self, gradient: G, optimizer: Optimizer, lr: float, *, locking: bool = False, implicit_momentum: float = 0.0
    ) -> Staged:
        """The update, checked (proven finite, or computed aside); GradientError (nothing held,
        nothing changed) when any new value would not be finite. ``locking``: one writer per
        parameter from now to the commit. ``implicit_momentum``: the push's, taken off the
        optimizer's momentum (``staleness.py``; dense variables only: an embedding row is
        updated only by the pushes that name it, so the push's staleness says little of it)."""
        ...

    def apply(
        self, gradient: G, optimizer: Optimizer, lr: float, *, locking: bool = False, implicit_momentum: float = 0.0
    ) -> None:
        """:meth:`stage`, then commit."""
        ...

    def accumulator(self) -> Accumulator[G]: ...

    def snapshot(self) -> dict[str, Array]:
        """Copies of the parameters, keyed in the table's own checkpoint namespace."""
        ...


@dataclass(frozen=True)
class RowStats:
    """One table's rows on its shard: held now and their memory; made, evicted, and the ids that
    got no row (not admitted yet, or past the cap: pulls answered with first values, gradient rows
    dropped), counted since the process started."""

    rows: int = 0
    bytes: int = 0
    made: int = 0
    evicted: int = 0
    rowless_reads: int = 0
    dropped_gradients: int = 0

    def __add__(self, other: RowStats) -> RowStats:
        return RowStats(*(a + b for a, b in zip(astuple(self), astuple(other))))


@runtime_checkable
class RowTable(Protocol):
    """A declared table (``TableSpec``) whose rows are keyed by id, split over the job's shards:
    what the store serves its pulls with and a checkpoint records its spec from (the embedding
    table; any kind of rows pulled by id, besides being a :class:`Table`)."""

    spec: TableSpec
    shards: int

    @property
    def rows_held(self) -> int: ...

    def nbytes(self) -> int: ...

    def stats(self) -> RowStats:
        """Its rows now and what its policy did with them (``api/row_policy.py``)."""
        ...

    @property
    def clock(self) -> int:
        """Updates applied to it on this shard (what a checkpoint's delta is counted from)."""
        ...

    def delta(self, since: int) -> dict[str, Array]:
        """Its rows used since clock ``since``, and the ids evicted since, keyed as its snapshot."""
        ...

    def log_evictions(self) -> None:
        """Keep the ids evicted from now on, for deltas (incremental checkpoints)."""
        ...

    def forget_evictions(self, through: int) -> None:
        """A whole checkpoint at clock ``through`` is written: evictions before it are no delta's."""
        ...

    def pull(self, ids: Any, make: bool = True) -> Array:
        """The rows of ``ids``, in their order; rows not held yet are made (``make``: as the
        table's policy admits them; else their first values are read)."""
        ...

    def held(self) -> tuple[IdArray, Array]:
        """Every row held, sorted by id: the ids and the rows."""
        ...


class DenseSum:
    """A sync round's sum of dense gradients, one array per variable.

    The sum is made in the memory of the round's first gradient when the rule lets it (``take``: a
    push received into the PS's own buffers, which the round drops once it commits): the round then
    holds no sum array of its own, one shard's bytes less at the PS's peak. Otherwise it is made in
    arrays of its own, allocated the first time one is needed and kept between rounds (every pass
    writes into them, ``out=``). A sum that holds nothing yet takes its first gradient (or copies
    it), not adding it to zeros, so clearing costs no pass over the arrays; a round of one gradient
    is not scaled (by 1)."""

    def __init__(self, variables: Mapping[str, Array]) -> None:
        self._variables = variables  # their shapes and dtypes, for the arrays of its own
        self._own: dict[str, Array] = {}
        self._sums: dict[str, Array] = {}  # this round's, by name: its own arrays or a gradient's

    def add(self, gradient: Mapping[str, Array], take: bool = False) -> bool:
        """Adds ``gradient``; True when the sum was made in its memory (``take`` and writable
        arrays): it no longer holds the pushed values."""
        took = False
        for name, value in gradient.items():
            total = self._sums.get(name)
            if total is not None:
                with np.errstate(over="ignore"):  # an overflowing sum is refused by the stage's check
                    np.add(total, value, out=total)
            elif take and value.flags.writeable:
                # A view, another object: the bound a check measured for ``value`` (``_bound``,
                # by identity) is not the sum's.
                self._sums[name] = value.view()
                took = True
            else:
                self._sums[name] = total = self._own_array(name)
                np.copyto(total, value)
        return took

    def receive(self, name: str, start: int, values: Array) -> None:
        """Adds ``values``, a piece of a gradient as it arrives, to variable ``name``'s sum from
        its flat element ``start`` (``arrivals.py``). The sum is made in arrays of its own, set
        to zero the first time a round touches them (a round's sum holds no gradient's memory)."""
        total = self._sums.get(name)
        if total is None:
            self._sums[name] = total = self._own_array(name)
            total.fill(0)
        flat = total.reshape(-1)[start : start + len(values)]
        with np.errstate(over="ignore"):  # an overflowing sum is refused by the stage's check
            np.add(flat, values, out=flat)

    def _own_array(self, name: str) -> Array:
        own = self._own.get(name)
        if own is None:
            own = self._own[name] = np.empty_like(self._variables[name])
        return own

    def averaged(self, count: int) -> Mapping[str, Array]:
        for name in self._variables.keys() - self._sums.keys():
            self._sums[name] = zero = self._own_array(name)
            zero.fill(0)
        if count != 1:
            scale = 1.0 / count
            for total in self._sums.values():
                np.multiply(total, scale, out=total)
        return self._sums

    def clear(self) -> None:
        self._sums = {}  # a gradient's memory it was made in goes with the gradient


class DenseTable:
    """The model's named dense variables; every push carries a gradient for each of them.

    The variables are the live arrays: updated in place, read in place by pulls (the rule decides
    whether pulls and updates exclude each other). Checkpoint keys: ``var/<name>``.
    """

    PREFIX = "var/"

    def __init__(self, variables: dict[str, Array], shard: int = 0) -> None:
        self._variables = variables
        self._locks = {name: threading.Lock() for name in variables}
        self._shard = shard  # named in error messages
        self._spare: list[Scratch] = []  # rooms not in use (list.pop and append are atomic)
        self._rooms = threading.BoundedSemaphore(APPLY_ROOMS)
        self._gathering = threading.Lock()  # one unlocked exact update at a time takes every room
        self._checked = threading.local()  # .bounds: what this thread's last check measured

    @classmethod
    def create(cls, tensors: Mapping[str, Array], shard: int = 0, *, received: bool = False) -> DenseTable:
        """A table holding a pushed model, whose variables must be finite floats: copies, or with
        ``received`` (the arrays are the PS's own, received into its buffers for this model alone)
        the arrays themselves where they are writable and aligned: no second copy of the shard."""
        for name, value in tensors.items():
            if value.dtype not in FLOATS:
                raise GradientError(f"variable {name!r}: dtype {value.dtype} is not a float type")
            if not finite(value):
                raise GradientError(f"variable {name!r}: initial value is not finite")
        return cls({name: _held(value, received) for name, value in tensors.items()}, shard)

    @classmethod
    def restored(cls, arrays: Mapping[str, Array], shard: int = 0) -> DenseTable:
        """The table written by :meth:`snapshot`, from a checkpoint's arrays (other keys ignored)."""
        variables = {
            key.removeprefix(cls.PREFIX): np.array(value, copy=True)
            for key, value in arrays.items()
            if key.startswith(cls.PREFIX)
        }
        return cls(variables, shard)

    @property
    def variables(self) -> Mapping[str, Array]:
        return self._variables

    def register(self, optimizer: Optimizer) -> None:
        for name, value in self._variables.items():
            optimizer.register(name, value.shape, value.dtype)

    def check(self, gradient: Mapping[str, Array]) -> None:
        unknown = sorted(set(gradient) - set(self._variables))
        if unknown:
            raise GradientError(f"shard {self._shard} holds no variable {unknown[0]!r}")
        missing = sorted(set(self._variables) - set(gradient))
        if missing:
            raise GradientError(f"no gradient for variable {missing[0]!r}")
        self._checked.bounds = bounds = {}
        for name, value in gradient.items():
            variable = self._variables[name]
            if value.shape != variable.shape:
                raise GradientError(
                    f"gradient {name!r}: shape {list(value.shape)} != variable shape {list(variable.shape)}"
                )
            if value.dtype != variable.dtype:
                raise GradientError(f"gradient {name!r}: dtype {value.dtype} != {variable.dtype}")
            # One pass gives both the check and the bound of |gradient| that the proof of the
            # update needs: kept for this thread's next stage of these very arrays (a push's).
            bound = magnitude(value)
            if not math.isfinite(bound) and not finite(value):
                raise GradientError(f"gradient {name!r} holds NaN or infinity")
            if isinstance(value, np.ndarray):
                bounds[name] = (weakref.ref(value), bound)

    def _bound(self, name: str, value: Array) -> float | None:
        """The bound of ``|value|`` measured by this thread's last :meth:`check`, if of ``value``
        (a pushed gradient is read-only, but for a sync round's sum made in it, staged as another
        object: ``DenseSum``)."""
        ref, bound = self._checked.__dict__.get("bounds", {}).get(name, (None, None))
        return bound if ref is not None and ref() is value else None

    def stage(
        self,
        gradient: Mapping[str, Array],
        optimizer: Optimizer,
        lr: float,
        *,
        locking: bool = False,
        implicit_momentum: float = 0.0,
    ) -> _DenseUpdate:
        # One writer per variable from here to the commit with useLocking, and always for an
        # optimizer whose finiteness proof needs it (Optimizer.serialises: Adam with a small beta_2).
        exclusive = locking or optimizer.serialises
        # Locks in name order, whatever order the push came in: two pushes never wait on each other.
        locks = [self._locks[name] for name in sorted(gradient)] if exclusive else []
        self._rooms.acquire()
        update = _DenseUpdate(self, optimizer, gradient, lr, locks, implicit_momentum)
        for lock in locks:
            lock.acquire()
        try:
            variables = self._variables
            bounds = {name: self._bound(name, value) for name, value in gradient.items()}
            self._checked.bounds = {}  # used once
            if all(
                optimizer.proves_finite(name, variables[name], value, lr, bounds[name], tracked=exclusive)
                for name, value in gradient.items()
            ):
                return update  # the common case: the commit updates in place, as Optimizer.apply
            if not exclusive:
                # Unlocked (Hogwild), an exact update would copy in values the bounds of an
                # overlapping in-place one never saw (up to the dtype's largest): it takes every
                # room instead, so it runs alone. It holds no variable lock, so waiting is safe.
                self._rooms.release()
                update.rooms = 0
                with self._gathering:
                    for _ in range(APPLY_ROOMS):
                        self._rooms.acquire()
                        update.rooms += 1
            try:
                scratch = self._spare.pop()
            except IndexError:
                scratch = optimizer.new_scratch()
            update.scratch = scratch
            for name, value in gradient.items():
                if not optimizer.stage(name, variables[name], value, lr, scratch, implicit_momentum=implicit_momentum):
                    raise GradientError(
                        f"gradient {name!r} at learning rate {lr:g} would make variable {name!r} or its "
                        "optimizer state NaN or infinite"
                    )
        except BaseException:
            update.discard()
            raise
        return update

    def apply(
        self,
        gradient: Mapping[str, Array],
        optimizer: Optimizer,
        lr: float,
        *,
        locking: bool = False,
        implicit_momentum: float = 0.0,
    ) -> None:
        self.stage(gradient, optimizer, lr, locking=locking, implicit_momentum=implicit_momentum).commit()

    def _give_back(self, scratch: Scratch | None, rooms: int) -> None:
        if scratch is not None:
            self._spare.append(scratch)
        for _ in range(rooms):
            self._rooms.release()

    def accumulator(self) -> DenseSum:
        return DenseSum(self._variables)

    def snapshot(self) -> dict[str, Array]:
        return {f"{self.PREFIX}{name}": value.copy() for name, value in self._variables.items()}


def _held(value: Array, received: bool) -> Array:
    adopt = received and value.flags.writeable and value.flags.aligned and value.flags.c_contiguous
    return value if adopt else np.array(value, copy=True)


class _DenseUpdate:
    """A dense update, checked (see :meth:`DenseTable.stage`): proven finite by bounds, to be
    applied in place (``scratch`` None), or computed into a scratch room, to be copied in."""

    def __init__(
        self,
        table: DenseTable,
        optimizer: Optimizer,
        gradient: Mapping[str, Array],
        lr: float,
        locks: list[threading.Lock],
        implicit_momentum: float = 0.0,
    ) -> None:
        self._table = table
        self._optimizer = optimizer
        self._gradient = gradient
        self._lr = lr
        self._implicit_momentum = implicit_momentum
        self._locks = locks
        self._tracked = bool(locks)
        self.scratch: Scratch | None = None
        self.rooms = 1  # of DenseTable._rooms, held until finished
        self._open = True

    def commit(self) -> None:
        if not self._open:
            raise RuntimeError("this update was committed or discarded already")
        variables, optimizer, scratch = self._table.variables, self._optimizer, self.scratch
        try:
            if scratch is None:
                for name, value in self._gradient.items():
                    optimizer.apply_proven(
                        name,
                        variables[name],
                        value,
                        self._lr,
                        tracked=self._tracked,
                        implicit_momentum=self._implicit_momentum,
                    )
            else:
                for name in self._gradient:
                    optimizer.commit(name, variables[name], scratch)
        finally:
            self.discard()

    def discard(self) -> None:
        if not self._open:
            return
        self._open = False
        for lock in self._locks:
            lock.release()
        scratch, self.scratch = self.scratch, None
        self._table._give_back(scratch, self.rooms)
