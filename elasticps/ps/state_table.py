"""The model's non-trainable state on a shard (BatchNorm's moving statistics): a table the optimizer
never touches.

Callers: the store (``store.py``) builds a :class:`StateTable` from a pushed model's state tensors
(the ``TensorMeta.state`` ones; see the .proto) and routes each push's state to it under
:data:`STATE` beside the dense gradients; the update rules (``rules.py``) apply it like any table;
the checkpoint schedule (``checkpointing.py``) saves it under ``state/`` and restores it.

The rule, for every mode, without a line of its own in the rules:

* a "gradient" of this table is the pushing worker's current *value* of some or all of its state
  tensors (a push without state leaves the state as it is);
* sync (:class:`~elasticps.ps.rules.RoundAveraging`): the values are staged with the push's
  gradients; when the round commits, each state tensor becomes the mean of the values the round's
  members pushed for it (:class:`StateMean`; tensors no member pushed keep their value);
* async (:class:`~elasticps.ps.rules.AsyncApply`): the latest pushed value replaces the held one;
* neither the optimizer (:meth:`StateTable.register` creates no slots) nor the version sees it:
  the version moves with the gradients it rides along with, as before;
* a state tensor of unknown name, another shape or dtype, or holding NaN or infinity is refused
  by :meth:`StateTable.check` before anything changes (``GradientError``: INVALID_ARGUMENT).

A checkpoint written before shards kept state has no ``state/`` keys: its model restores with an
*adopting* table (``adopts_new``), which takes a state tensor it does not hold from the first push
(async) or committed round (sync) that carries it, checked only for being finite floats. So a job
resumed from such a checkpoint gets its state back from its workers' next pushes; a table built
from a PushModel or from a newer checkpoint refuses unknown names.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from elasticps.ps.errors import GradientError
from elasticps.ps.optimizers import Optimizer
from elasticps.ps.tables import FLOATS, finite

Array = npt.NDArray[Any]

STATE = "state"  # the state table's name in the store


def _check_new(name: str, value: Array, what: str) -> None:
    if value.dtype not in FLOATS:
        raise GradientError(f"state {name!r}: dtype {value.dtype} is not a float type")
    if not finite(value):
        raise GradientError(f"state {name!r}: {what} holds NaN or infinity")


class StateMean:
    """A sync round's state values: per tensor, the sum (in float64) and how many members sent one.

    The mean is taken per tensor over the members that sent it, so :meth:`averaged` ignores the
    round's member count. Built anew for each model, emptied after each round.
    """

    def __init__(self) -> None:
        self._sums: dict[str, Array] = {}
        self._counts: dict[str, int] = {}
        self._dtypes: dict[str, np.dtype[Any]] = {}

    def add(self, values: Mapping[str, Array], take: bool = False) -> bool:
        for name, value in values.items():
            total = self._sums.get(name)
            if total is None:
                self._sums[name] = np.array(value, dtype=np.float64, copy=True)
                self._counts[name] = 1
                self._dtypes[name] = value.dtype
            elif total.shape == value.shape:
                np.add(total, value, out=total)
                self._counts[name] += 1
            # else: an adopting table's new tensor, sent in two shapes by two members of one round
            # (checked against nothing held yet): the first member's is kept.
        return False  # float64 sums of its own: the values are small

    def averaged(self, count: int) -> dict[str, Array]:
        return {
            name: (total / self._counts[name]).astype(self._dtypes[name], copy=False)
            for name, total in self._sums.items()
        }

    def clear(self) -> None:
        self._sums, self._counts, self._dtypes = {}, {}, {}


class StateTable:
    """The shard's state tensors by name. Checkpoint keys: ``state/<name>``.

    Values are replaced in place (a pull may read them while an async push writes: relaxed
    consistency, as for the variables); a tensor adopted by an adopting table is added to a new
    dict, so a reader iterating the old one never sees it change size.
    """

    PREFIX = "state/"

    def __init__(self, values: dict[str, Array] | None = None, shard: int = 0, *, adopts_new: bool = False) -> None:
        self._values: dict[str, Array] = values if values is not None else {}
        self._lock = threading.Lock()  # writers: state is small, so one lock for all of them
        self._shard = shard  # named in error messages
        self.adopts_new = adopts_new

    @classmethod
    def create(cls, tensors: Mapping[str, Array], shard: int = 0) -> StateTable:
        """A table holding copies of a pushed model's state, which must be finite floats."""
        for name, value in tensors.items():
            _check_new(name, value, "initial value")
        return cls({name: np.array(value, copy=True) for name, value in tensors.items()}, shard)

    @classmethod
    def restored(cls, arrays: Mapping[str, Array], shard: int = 0, *, saved: bool = True) -> StateTable:
        """The table written by :meth:`snapshot`, from a checkpoint's arrays (other keys ignored).

        ``saved``: the checkpoint was written with a state table (even an empty one); False for
        one written before shards kept state, whose table then adopts what workers push."""
        values = {
            key.removeprefix(cls.PREFIX): np.array(value, copy=True)
            for key, value in arrays.items()
            if key.startswith(cls.PREFIX)
        }
        return cls(values, shard, adopts_new=not saved)

    @property
    def values(self) -> Mapping[str, Array]:
        return self._values

    def register(self, optimizer: Optimizer) -> None:
        """State has no optimizer slots."""

    def check(self, values: Mapping[str, Array]) -> None:
        held_values = self._values
        for name, value in values.items():
            held = held_values.get(name)
            if held is None:
                if not self.adopts_new:
                    raise GradientError(f"shard {self._shard} holds no state {name!r}")
                _check_new(name, value, "pushed value")
                continue
            if value.shape != held.shape:
                raise GradientError(f"state {name!r}: shape {list(value.shape)} != held shape {list(held.shape)}")
            if value.dtype != held.dtype:
                raise GradientError(f"state {name!r}: dtype {value.dtype} != {held.dtype}")
            if not finite(value):
                raise GradientError(f"state {name!r} holds NaN or infinity")

    def stage(
        self,
        values: Mapping[str, Array],
        optimizer: Optimizer,
        lr: float,
        *,
        locking: bool = False,
        implicit_momentum: float = 0.0,
    ) -> _StateUpdate:
        """The values, checked before (:meth:`check`; a mean of finite values is finite): nothing to compute."""
        return _StateUpdate(self, values)

    def apply(
        self,
        values: Mapping[str, Array],
        optimizer: Optimizer,
        lr: float,
        *,
        locking: bool = False,
        implicit_momentum: float = 0.0,
    ) -> None:
        """Sets each given tensor to its value (checked before); ``optimizer``, ``lr`` and
        ``implicit_momentum`` are unused."""
        with self._lock:
            adopted: dict[str, Array] = {}
            for name, value in values.items():
                held = self._values.get(name)
                if held is None:
                    adopted[name] = np.array(value, copy=True)
                elif held.shape == value.shape:
                    np.copyto(held, value, casting="same_kind")
            if adopted:
                self._values = {**self._values, **adopted}

    def accumulator(self) -> StateMean:
        return StateMean()

    def snapshot(self) -> dict[str, Array]:
        with self._lock:
            return {f"{self.PREFIX}{name}": value.copy() for name, value in self._values.items()}


class _StateUpdate:
    def __init__(self, table: StateTable, values: Mapping[str, Array]) -> None:
        self._table = table
        self._values = values

    def commit(self) -> None:
        self._table.apply(self._values, optimizer=None, lr=0.0)  # type: ignore[arg-type]

    def discard(self) -> None:
        pass
