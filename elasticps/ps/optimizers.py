"""Gradient application on the parameter server, in pure numpy.

The PS owns the model variables and applies the gradients that workers push,
so it needs the optimizer, but a PS process must never import TensorFlow or
Keras (it is a small numpy/gRPC process; see the import-linter contract in
pyproject.toml).  This module therefore re-implements the Keras 3 optimizers
that the PS supports -- SGD (momentum, Nesterov), Adam (AMSGrad), Adagrad and
RMSprop (momentum, centered) -- following Keras's ``build``/``update_step``
formulas operation by operation, in the variable's dtype, so a model trained
through the PS matches one trained with ``model.fit`` to float32 rounding.

Two deliberate departures from Keras, both needed by an asynchronous PS:

* Step counts are per variable.  Keras has one ``iterations`` counter per
  optimizer, incremented once per ``apply_gradients`` over all variables; the
  PS applies each variable's gradient on its own (possibly from several
  threads, and a worker's push may skip variables), so Adam's bias correction
  uses the number of updates *that variable* has received.  When every push
  updates every variable the two coincide.
* The learning rate is an argument of :meth:`Optimizer.apply`, not state: the
  PS scales it per push (staleness), and storing-then-mutating a shared value
  would race between concurrent pushes. So is ``implicit_momentum``, the
  momentum a push's staleness already carries (``staleness.py``): the update
  uses ``max(0, momentum - implicit_momentum)`` as its momentum coefficient
  (SGD's and RMSprop's momentum; Adam and Adagrad keep theirs: see
  :attr:`Optimizer.CORRECTS_MOMENTUM`). At 0, the default, the update is
  Keras's, bit for bit.

Checked updates (what the PS uses): :meth:`Optimizer.stage` computes a variable's new value and
new slots into a :class:`Scratch` (allocated once, reused push after push), says whether all of
them are finite, and changes nothing; :meth:`Optimizer.commit` then copies them in and counts the
step. So a caller can check every variable of a push before it changes any (``tables.py``), and a
finite gradient that would overflow a variable or a slot (3e38 at learning rate 10) is refused
instead of leaving Inf or NaN behind. :meth:`Optimizer.apply` updates in place, unchecked.

Copying aside costs a push two to three times main's time, so the PS first tries to prove the
update finite from reads alone (:meth:`Optimizer.proves_finite`): an upper bound of every
magnitude involved (the gradient, the variable, each slot: one ``dot(x, x)`` pass each, see
:func:`magnitude`) is pushed through the optimizer's formulas in float64, with the divisions
bounded by epsilon, and when every intermediate and new value stays below the dtype's largest
value by a factor 2**10 (rounding and up to :data:`APPLY_ROOMS` overlapping
unlocked updates fit in that margin) the update is applied in place, exactly as :meth:`apply`
does. Only a push the bound cannot prove (huge values, float16, epsilon 0, centered RMSprop, a
slot loaded negative from a checkpoint) takes the scratch path, which decides exactly. The bounds
the proof computes for the new values are kept and the next proof starts from them, measuring
again only when they no longer prove it, so a push costs one pass over its gradient (its check):
serialised updates (``tracked``) take them on when applied (:meth:`Optimizer.apply_proven`),
overlapping unlocked ones reserve them before (see :meth:`Optimizer.proves_finite`); any other
write (apply, commit, load_state) drops them.

Thread safety: all per-variable state (slots and step count) is created by
:meth:`Optimizer.register` before training starts and is afterwards only
touched through that variable's name, so applies to *different* variables may
run concurrently without locks.  Applies to the *same* variable must be
serialised by the caller (the PS already serialises writes to a variable).
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from elasticps.api.optimizer import HYPER_PARAMETERS, OptimizerConfig, OptimizerError, Param, normalized

__all__ = ["Optimizer", "OptimizerConfig", "OptimizerError", "make_optimizer"]

Array = npt.NDArray[Any]

_SLOT_PREFIX = "slot/"
_STEP_PREFIX = "step/"


class _VariableState:
    """One variable's optimizer state; touched only by applies to that variable."""

    __slots__ = ("shape", "dtype", "slots", "step", "signs_known", "bounds", "pending", "reserving")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any], slots: dict[str, Array]) -> None:
        self.shape = shape
        self.dtype = dtype
        self.slots = slots
        self.step = 0
        # The slots that must never be negative (Optimizer._NON_NEGATIVE, under a square root) are
        # known not to be: true from register (they start at 0 or a value >= 0) and the updates
        # keep it; a checkpoint's values are checked when loaded (load_state).
        self.signs_known = True
        # Tracked bounds of |param| and |slot| (None: unknown, measure), kept only while every
        # update of the variable is serialised (proves_finite's ``tracked``); ``pending``: the
        # bounds after the update proven last, taken on by apply_proven.
        self.bounds: _Bounds | None = None
        self.pending: _Bounds | None = None
        self.reserving = threading.Lock()  # unlocked updates: guards reading and widening ``bounds``


class Scratch:
    """Room for one update of every registered variable: its new value and slots. Made by
    :meth:`Optimizer.new_scratch`; one update at a time uses it (the caller keeps a pool)."""

    __slots__ = ("params", "vars")

    def __init__(self, params: dict[str, Array], variables: dict[str, _VariableState]) -> None:
        self.params = params
        self.vars = variables


# Elements of a variable updated at once (see Optimizer._run): 256 KiB of float32, a block and its
# temporaries stay in a core's cache.
BLOCK_ELEMENTS = 1 << 16

_TEMPORARIES = threading.local()  # .buffers: {(dtype, index): array of BLOCK_ELEMENTS}


def _temporary(like: Array, index: int = 0) -> Array:
    """A temporary array shaped and typed as ``like``: this thread's ``index``-th buffer of
    :data:`BLOCK_ELEMENTS` of that dtype (made once per thread) when ``like`` fits in it, else a
    new array. A formula uses each index for one temporary at a time."""
    if like.size > BLOCK_ELEMENTS:
        return np.empty_like(like)
    buffers: dict[tuple[np.dtype[Any], int], Array] | None = getattr(_TEMPORARIES, "buffers", None)
    if buffers is None:
        buffers = _TEMPORARIES.buffers = {}
    key = (like.dtype, index)
    buffer = buffers.get(key)
    if buffer is None:
        buffer = buffers[key] = np.empty(BLOCK_ELEMENTS, dtype=like.dtype)
    return buffer[: like.size].reshape(like.shape)


# Dense updates computed at once on a shard (the dense table's rooms, ``tables.py``): each holds a
# copy of the variables and slots, and no more unlocked updates than this overlap.
APPLY_ROOMS = 4

_BLAS = {np.dtype(np.float32), np.dtype(np.float64)}


def _squares(array: Array) -> float | None:
    """``dot(x, x)`` over ``array`` (one BLAS pass, no temporary), or None where BLAS does not
    serve it (another dtype, a non-contiguous array: reshaping would copy)."""
    if array.dtype not in _BLAS or not array.flags.c_contiguous:
        return None
    flat = array.reshape(-1)
    return float(np.dot(flat, flat))


def finite(array: Array) -> bool:
    """No NaN or infinity in ``array``."""
    # Fast path, one pass and no temporary bool array: a NaN or infinity anywhere makes the sum
    # (of squares, where BLAS serves it) non-finite. A non-finite sum may also come from large
    # finite values overflowing, so only then the exact (element-wise) check decides.
    with np.errstate(over="ignore", invalid="ignore"):
        squares = _squares(array)
        if squares is None:
            wide = np.float32 if array.dtype == np.float16 else None
            squares = float(np.sum(array, dtype=wide))
        if math.isfinite(squares):
            return True
    return bool(np.isfinite(array).all())


def magnitude(array: Array) -> float:
    """An upper bound of ``max |x|`` over ``array``, from reads only; NaN or infinity when
    ``array`` holds one, or (float32, float64) when its values are too large to bound this way.

    ``sqrt(dot(x, x))`` where BLAS serves it: for non-negative terms each rounded addition is at
    least its larger operand, whatever the order, so the computed sum is at least the largest
    square, itself at least ``max(x)**2 * (1 - eps)``; the factor below covers that rounding.
    Otherwise the exact ``max(|max|, |min|)``."""
    if array.size == 0:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        squares = _squares(array)
        if squares is not None:
            return math.sqrt(squares) * (1.0 + 2.0**-20) if squares >= 0 else math.nan
        return max(abs(float(array.max())), abs(float(array.min())))


_Bounds = tuple[float, dict[str, float]]  # of |param| and of each |slot|


def _proven(limit: float, values: list[float], new: _Bounds) -> _Bounds | None:
    """``new`` when every value (intermediates and new bounds) is <= limit, else None."""
    return new if _within(limit, *values, new[0], *new[1].values()) else None


def _scaled(bounds: _Bounds, factor: float) -> _Bounds:
    return bounds[0] * factor, {slot: value * factor for slot, value in bounds[1].items()}


def _within(limit: float, *values: float) -> bool:
    """Every value <= limit (NaN never is)."""
    return all(value <= limit for value in values)


class Optimizer(abc.ABC):
    """A numpy optimizer updating PS variables in place.

    Lifecycle: :meth:`register` every variable once, then :meth:`apply`
    gradients; :meth:`state` / :meth:`load_state` checkpoint the slots and the
    per-variable step counts.
    """

    # Hyper-parameters with Keras's defaults; filled in by each subclass.
    PARAMS: ClassVar[Mapping[str, Param]]
    # Slots under a square root: proves_finite needs them >= 0 (see _VariableState.signs_known).
    _NON_NEGATIVE: ClassVar[tuple[str, ...]] = ()
    # Whether a push's implicit momentum lowers this optimizer's momentum coefficient (heavy-ball
    # momentum: SGD, RMSprop). Adam's first moment is an average whose bias correction assumes a
    # fixed beta_1, and Adagrad has none: both apply every push as configured.
    CORRECTS_MOMENTUM: ClassVar[bool] = False
    @property
    def serialises(self) -> bool:
        """Whether proves_finite holds only when updates of a variable never overlap: the caller
        then serialises them, whatever use_locking says (Adam with a small ``beta_2``)."""
        return False

    config: OptimizerConfig
    learning_rate: float

    def __init__(self, config: OptimizerConfig) -> None:
        # make_optimizer has normalised and checked it against PARAMS.
        self.config = config
        self.learning_rate = config.params["learning_rate"]
        self._vars: dict[str, _VariableState] = {}

    @abc.abstractmethod
    def _slot_names(self) -> tuple[str, ...]:
        """Slots each variable gets, given this optimizer's options."""

    def _slot_initial_value(self, slot: str) -> float:
        # Every Keras slot starts at zero except Adagrad's accumulator.
        return 0.0

    @abc.abstractmethod
    def _update(
        self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any], implicit_momentum: float
    ) -> None:
        """Keras's update_step for one variable; ``var.step`` is already incremented;
        ``implicit_momentum`` taken off the momentum coefficient (where :attr:`CORRECTS_MOMENTUM`)."""

    def _momentum(self, key: str, implicit_momentum: float) -> float:
        """The momentum coefficient ``key`` of one update: the configured one less the implicit
        momentum of its push, never below 0; exactly the configured one when that is 0."""
        configured = self.config.params[key]
        return configured if implicit_momentum == 0.0 else max(0.0, configured - implicit_momentum)

    def row_slots(self) -> dict[str, float]:
        """The slots every row of an embedding table gets, with their first value."""
        return {slot: self._slot_initial_value(slot) for slot in self._slot_names()}

    def update_rows(self, rows: Array, slots: Mapping[str, Array], steps: Array, grad: Array, lr: float) -> None:
        """A lazy sparse update of an embedding table's rows (``embeddings.py``), in place:
        ``rows`` (n, dim) and their ``slots`` (each (n, dim)) gathered from the table, ``steps``
        (n,) each row's own update count including this one, ``grad`` (n, dim). Keras's
        update_step formulas, with each row's own count where Keras has the optimizer's
        ``iterations``: a row not in a minibatch is not touched, as in TensorFlow's lazy Adam."""
        if not (math.isfinite(lr) and lr >= 0.0):
            raise OptimizerError(f"learning rate {lr!r} must be finite and >= 0")
        var = _VariableState(rows.shape, rows.dtype, dict(slots))
        var.step = steps.reshape(-1, 1)  # type: ignore[assignment]  # broadcast over each row
        # A row's momentum is its own pushes' (``embeddings.py``): no staleness correction.
        self._update(var, rows, grad.astype(rows.dtype, copy=False), rows.dtype.type(lr), 0.0)

    def register(self, name: str, shape: tuple[int, ...], dtype: npt.DTypeLike) -> None:
        """Create the slots and the step count (0) of variable ``name``."""
        if name in self._vars:
            raise OptimizerError(f"variable {name!r} is already registered with the optimizer")
        dt = np.dtype(dtype)
        if not np.issubdtype(dt, np.floating):
            raise OptimizerError(f"variable {name!r} has dtype {dt}; the optimizer updates floating-point variables only")
        shape = tuple(int(d) for d in shape)
        slots = {slot: np.full(shape, self._slot_initial_value(slot), dtype=dt) for slot in self._slot_names()}
        self._vars[name] = _VariableState(shape, dt, slots)

    def apply(self, name: str, param: Array, grad: Array, lr: float, *, implicit_momentum: float = 0.0) -> None:
        """Update ``param`` (variable ``name``) in place with ``grad`` at learning rate ``lr``.

        ``grad`` is cast to the variable's dtype, as Keras does; it is never
        modified.  Increments the variable's step count. ``implicit_momentum``: see the module.
        """
        var = self._checked(name, param, grad, lr, implicit_momentum)
        if grad.dtype != var.dtype:
            grad = grad.astype(var.dtype)
        var.step += 1
        var.bounds = None  # unknown now (apply_proven sets them after)
        self._run(var, param, grad, lr, implicit_momentum)

    def _checked(
        self, name: str, param: Array, grad: Array, lr: float, implicit_momentum: float = 0.0
    ) -> _VariableState:
        var = self._vars.get(name)
        if var is None:
            raise OptimizerError(f"variable {name!r} was never registered with the optimizer")
        if param.shape != var.shape or param.dtype != var.dtype:
            raise OptimizerError(
                f"variable {name!r}: parameter is {param.dtype}{list(param.shape)}, registered as {var.dtype}{list(var.shape)}"
            )
        if grad.shape != var.shape:
            raise OptimizerError(
                f"variable {name!r}: gradient shape {list(grad.shape)} differs from the variable's {list(var.shape)}"
            )
        if not (math.isfinite(lr) and lr >= 0.0):
            raise OptimizerError(f"variable {name!r}: learning rate {lr!r} must be finite and >= 0")
        if not 0.0 <= implicit_momentum <= 1.0:  # also NaN
            raise OptimizerError(f"variable {name!r}: implicit momentum {implicit_momentum!r} must be in [0, 1]")
        return var

    def _run(self, var: _VariableState, param: Array, grad: Array, lr: float, implicit_momentum: float) -> None:
        """One update of ``param`` and ``var``'s slots, in place, at step ``var.step``.

        A large contiguous variable is updated :data:`BLOCK_ELEMENTS` at a time (flat views of the
        variable, its gradient and its slots): the formulas' temporaries are then this thread's
        block-sized buffers (:func:`_temporary`), allocated once, so a push allocates nothing in
        proportion to the model, and each block's passes run while it is in the cache. Element-wise
        formulas: the values are those of one whole-array update, bit for bit."""
        arrays = (param, grad, *var.slots.values())
        if param.size > BLOCK_ELEMENTS and all(a.flags.c_contiguous for a in arrays):
            flat_param, flat_grad = param.reshape(-1), grad.reshape(-1)
            flat_slots = {slot: arr.reshape(-1) for slot, arr in var.slots.items()}
            rate = var.dtype.type(lr)
            for start in range(0, param.size, BLOCK_ELEMENTS):
                end = start + BLOCK_ELEMENTS
                block = _VariableState(
                    (min(end, param.size) - start,),
                    var.dtype,
                    {slot: arr[start:end] for slot, arr in flat_slots.items()},
                )
                block.step = var.step
                self._update(block, flat_param[start:end], flat_grad[start:end], rate, implicit_momentum)
            return
        if param.ndim == 0:
            # numpy ufuncs return scalars, not arrays, for 0-d inputs, and the updates write into
            # temporaries with out=: update 1-element views of the same memory instead (a 0-d
            # array is contiguous, so reshape gives a view).
            view = _VariableState((1,), var.dtype, {slot: arr.reshape(1) for slot, arr in var.slots.items()})
            view.step = var.step
            self._update(view, param.reshape(1), grad.reshape(1), var.dtype.type(lr), implicit_momentum)
            return
        # Keras casts the learning rate to the variable's dtype before use.
        self._update(var, param, grad, var.dtype.type(lr), implicit_momentum)

    def proves_finite(
        self,
        name: str,
        param: Array,
        grad: Array,
        lr: float,
        grad_bound: float | None = None,
        *,
        tracked: bool = False,
    ) -> bool:
        """True when bounds of ``param``, ``grad`` and the slots prove that :meth:`apply` would
        leave the variable and every slot finite (see the module's docstring); False when they
        cannot (the update may still be finite: :meth:`stage` decides). Changes no array.
        ``grad_bound``: :func:`magnitude` of ``grad`` when the caller measured it already.

        The bounds of the variable and its slots are carried from update to update and measured
        only when unknown or too loose to prove this one. ``tracked``: the caller serialises every
        update of this variable from this call to :meth:`apply_proven` (a lock), so the bounds
        after this update are taken on when it is applied. Otherwise (unlocked updates that may
        overlap) they are reserved at once under the variable's own small lock, and only widened
        until the next measurement: an update overlapping this one starts from bounds that
        already count this one, and one lost to a race (Hogwild) leaves values below them. What
        the values can exceed them by is the few updates in flight (at most
        :data:`APPLY_ROOMS`) while an update reads or a measurement is taken,
        which the proof's margin covers; a measurement reads whatever earlier ones left.
        The proof takes the configured momentum, an upper bound of any push's corrected one."""
        var = self._checked(name, param, grad, lr)
        if not var.signs_known:
            return False
        limit = float(np.finfo(var.dtype).max) * 2.0**-10
        bound = magnitude(grad) if grad_bound is None else grad_bound
        if not _within(limit, bound):  # also a gradient that does not fit the variable's dtype
            return False
        # Room for the rounding of each update, so that bounds carried push after push stay bounds.
        grow = 1.0 + 8 * float(np.finfo(var.dtype).eps)
        if tracked:
            var.pending = None
            new, _ = self._bounded(var, limit, param, bound, lr)
            if new is not None:
                var.pending = _scaled(new, grow)
            return new is not None
        with var.reserving:
            known = var.bounds
            new, measured = self._bounded(var, limit, param, bound, lr)
            if new is None:
                return False
            new = _scaled(new, grow)
            if known is not None and not measured:  # never narrowed: a decay lost to a race must not count
                new = (max(new[0], known[0]), {slot: max(value, known[1][slot]) for slot, value in new[1].items()})
            var.bounds = new
        return True

    def _bounded(
        self, var: _VariableState, limit: float, param: Array, grad: float, lr: float
    ) -> tuple[_Bounds | None, bool]:
        """The proof from the carried bounds, or else from bounds measured now (then True)."""
        if var.bounds is not None:
            new = self._proves(var, limit, var.bounds[0], grad, lr, var.bounds[1])
            if new is not None:
                return new, False
        slots = {slot: magnitude(arr) for slot, arr in var.slots.items()}
        return self._proves(var, limit, magnitude(param), grad, lr, slots), True

    def apply_proven(
        self, name: str, param: Array, grad: Array, lr: float, *, tracked: bool = False, implicit_momentum: float = 0.0
    ) -> None:
        """:meth:`apply` after :meth:`proves_finite` said True (with the same ``tracked``);
        tracked, the variable's bounds become those the proof computed."""
        var = self._checked(name, param, grad, lr, implicit_momentum)
        if grad.dtype != var.dtype:
            grad = grad.astype(var.dtype)
        var.step += 1
        self._run(var, param, grad, lr, implicit_momentum)
        if tracked:
            var.bounds, var.pending = var.pending, None

    def _proves(
        self, var: _VariableState, limit: float, param: float, grad: float, lr: float, slots: Mapping[str, float]
    ) -> _Bounds | None:
        """The bounds of ``|param|`` and each slot after an update with these bounds of
        ``|param|``, ``|grad|`` and each slot, when it keeps every intermediate and new value
        <= ``limit``; None unless a subclass proves it."""
        return None

    def new_scratch(self) -> Scratch:
        """Room for one checked update of every variable registered now (see :meth:`stage`)."""
        params = {name: np.empty(var.shape, var.dtype) for name, var in self._vars.items()}
        rooms = {
            name: _VariableState(var.shape, var.dtype, {slot: np.empty_like(a) for slot, a in var.slots.items()})
            for name, var in self._vars.items()
        }
        return Scratch(params, rooms)

    def stage(
        self, name: str, param: Array, grad: Array, lr: float, scratch: Scratch, *, implicit_momentum: float = 0.0
    ) -> bool:
        """Computes variable ``name``'s update into ``scratch``, changing nothing; True when the
        new value and every new slot are finite (then :meth:`commit` may copy them in)."""
        var = self._checked(name, param, grad, lr, implicit_momentum)
        if grad.dtype != var.dtype:
            grad = grad.astype(var.dtype)
        room, new = scratch.vars[name], scratch.params[name]
        np.copyto(new, param)
        for slot, arr in var.slots.items():
            np.copyto(room.slots[slot], arr)
        room.step = var.step + 1
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            self._run(room, new, grad, lr, implicit_momentum)
        return finite(new) and all(finite(arr) for arr in room.slots.values())

    def commit(self, name: str, param: Array, scratch: Scratch) -> None:
        """Copies what :meth:`stage` computed for ``name`` into ``param`` and the slots."""
        var, room = self._vars[name], scratch.vars[name]
        np.copyto(param, scratch.params[name])
        for slot, arr in var.slots.items():
            np.copyto(arr, room.slots[slot])
        var.step = room.step
        var.bounds = None

    def state(self) -> dict[str, Array]:
        """Copies of every slot (``slot/<slot>/<var>``) and step count (``step/<var>``, int64 0-d).

        Copies, so that a checkpoint writer holding them is not affected by
        later applies.
        """
        out: dict[str, Array] = {}
        for name, var in self._vars.items():
            for slot, arr in var.slots.items():
                out[f"{_SLOT_PREFIX}{slot}/{name}"] = arr.copy()
            out[f"{_STEP_PREFIX}{name}"] = np.array(var.step, dtype=np.int64)
        return out

    def load_state(self, arrays: Mapping[str, Array]) -> None:
        """Restore what :meth:`state` returned, for the registered variables.

        Every expected key must be present with the registered shape.  Keys
        under ``slot/`` or ``step/`` that this optimizer does not expect are an
        error too (a checkpoint written with other options, e.g. momentum, or
        other variables); keys outside those two namespaces are ignored, so a
        checkpoint may hold the parameters alongside.  Nothing is changed when
        an error is raised.
        """
        expected: set[str] = set()
        steps: dict[str, int] = {}
        for name, var in self._vars.items():
            for slot in var.slots:
                key = f"{_SLOT_PREFIX}{slot}/{name}"
                expected.add(key)
                value = self._lookup(arrays, key)
                if value.shape != var.shape:
                    raise OptimizerError(
                        f"optimizer state {key!r} has shape {list(value.shape)}, the variable has {list(var.shape)}"
                    )
            key = f"{_STEP_PREFIX}{name}"
            expected.add(key)
            value = self._lookup(arrays, key)
            if value.shape != () or not np.issubdtype(value.dtype, np.integer) or int(value) < 0:
                raise OptimizerError(f"optimizer state {key!r} must be a non-negative integer scalar")
            steps[name] = int(value)
        unexpected = sorted(k for k in arrays if k.startswith((_SLOT_PREFIX, _STEP_PREFIX)) and k not in expected)
        if unexpected:
            raise OptimizerError(f"optimizer state has unexpected keys (another optimizer or options?): {unexpected[:5]}")
        # All checked: now copy into the existing arrays (they may be shared by
        # reference elsewhere, so never replace them).
        for name, var in self._vars.items():
            for slot, arr in var.slots.items():
                np.copyto(arr, arrays[f"{_SLOT_PREFIX}{slot}/{name}"], casting="same_kind")
            var.step = steps[name]
            var.bounds = None
            var.signs_known = all(
                bool((var.slots[slot] >= 0).all()) for slot in self._NON_NEGATIVE if slot in var.slots
            )

    @staticmethod
    def _lookup(arrays: Mapping[str, Array], key: str) -> Array:
        if key not in arrays:
            raise OptimizerError(f"optimizer state is missing {key!r}")
        return np.asarray(arrays[key])

    def _flag(self, key: str) -> bool:
        return self.config.params[key] == 1.0


class _SGD(Optimizer):
    PARAMS = HYPER_PARAMETERS["sgd"]
    CORRECTS_MOMENTUM = True

    def _slot_names(self) -> tuple[str, ...]:
        # Keras creates the momentum slot only when momentum != 0, and then
        # ignores nesterov: plain SGD.
        return ("momentum",) if self.config.params["momentum"] != 0.0 else ()

    def _update(
        self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any], implicit_momentum: float
    ) -> None:
        scaled = np.multiply(grad, lr, out=_temporary(grad))  # gradient * learning_rate
        if "momentum" not in var.slots:
            np.subtract(param, scaled, out=param)
            return
        m = var.slots["momentum"]
        momentum = var.dtype.type(self._momentum("momentum", implicit_momentum))
        # m = m * momentum - gradient * learning_rate
        np.multiply(m, momentum, out=m)
        np.subtract(m, scaled, out=m)
        if self._flag("nesterov"):
            # param += m * momentum - gradient * learning_rate (Keras's order
            # of operations, kept for bit-compatibility).
            step = np.multiply(m, momentum, out=_temporary(m, 1))
            np.subtract(step, scaled, out=step)
            np.add(param, step, out=param)
        else:
            np.add(param, m, out=param)

    def _proves(
        self, var: _VariableState, limit: float, param: float, grad: float, lr: float, slots: Mapping[str, float]
    ) -> _Bounds | None:
        scaled = grad * lr
        if "momentum" not in slots:
            return _proven(limit, [scaled], (param + scaled, {}))
        momentum = self.config.params["momentum"]  # in [0, 1]
        m = slots["momentum"] * momentum + scaled
        step = m * momentum + scaled if self._flag("nesterov") else m
        return _proven(limit, [slots["momentum"], scaled, step], (param + step, {"momentum": m}))


class _Adam(Optimizer):
    PARAMS = HYPER_PARAMETERS["adam"]
    _NON_NEGATIVE = ("v", "v_hat")

    @property
    def serialises(self) -> bool:
        # The second moment is updated as v + (g^2 - v) * c, c = 1 - beta_2, reading v twice: an
        # update overlapping between the reads can lower v in between, and the result can go
        # negative (then sqrt gives NaN). Each such write is at least v_b - c * v_a; by induction
        # over the at most APPLY_ROOMS updates in flight, every write stays >= q**j * v_a with
        # q = 1 - 2c while q**APPLY_ROOMS >= 1/2: true for beta_2 >= 0.921 (Keras's 0.999 among
        # them), so only a smaller beta_2 serialises.
        c = 1.0 - float(self.config.params["beta_2"])
        return not (1.0 - 2.0 * c) ** APPLY_ROOMS >= 0.5

    def _slot_names(self) -> tuple[str, ...]:
        return ("m", "v", "v_hat") if self._flag("amsgrad") else ("m", "v")

    def _update(
        self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any], implicit_momentum: float
    ) -> None:
        p = self.config.params
        f = var.dtype.type
        m, v = var.slots["m"], var.slots["v"]
        # Bias correction folded into the step size, computed in the variable's
        # dtype like Keras: alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t),
        # with t this variable's own step count.
        t = f(var.step)
        beta_1_power = np.power(f(p["beta_1"]), t)
        beta_2_power = np.power(f(p["beta_2"]), t)
        alpha = lr * np.sqrt(f(1) - beta_2_power) / (f(1) - beta_1_power)
        # m += (g - m) * (1 - beta_1); the (1 - beta) factors are computed in
        # Python floats and then cast, as Keras does.
        tmp = np.subtract(grad, m, out=_temporary(grad))
        np.multiply(tmp, f(1 - p["beta_1"]), out=tmp)
        np.add(m, tmp, out=m)
        # v += (g^2 - v) * (1 - beta_2)
        np.square(grad, out=tmp)
        np.subtract(tmp, v, out=tmp)
        np.multiply(tmp, f(1 - p["beta_2"]), out=tmp)
        np.add(v, tmp, out=v)
        if "v_hat" in var.slots:
            v_hat = var.slots["v_hat"]
            np.maximum(v_hat, v, out=v_hat)
            v = v_hat
        # param -= (m * alpha) / (sqrt(v) + epsilon); epsilon is outside the
        # sqrt here ("epsilon hat"), unlike Adagrad and RMSprop.
        np.sqrt(v, out=tmp)
        np.add(tmp, f(p["epsilon"]), out=tmp)
        step = np.multiply(m, alpha, out=_temporary(m, 1))
        np.divide(step, tmp, out=step)
        np.subtract(param, step, out=param)

    def _proves(
        self, var: _VariableState, limit: float, param: float, grad: float, lr: float, slots: Mapping[str, float]
    ) -> _Bounds | None:
        p = self.config.params
        f, tiny = var.dtype.type, float(np.finfo(var.dtype).eps)
        # alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) <= lr / (1 - beta_1) for any t >= 1
        # (so whatever step a racing update reached), with room for the dtype's rounding.
        beta_1, epsilon = float(f(p["beta_1"])), float(f(p["epsilon"]))
        if not (1.0 - beta_1 > 8 * tiny and epsilon > 0.0):
            return None
        alpha = lr * 1.01 / (1.0 - beta_1 - 4 * tiny)
        m, v = slots["m"], slots["v"]
        new_m = m + (grad + m) * (1.0 - p["beta_1"])
        new_v = v + (grad * grad + v) * (1.0 - p["beta_2"])  # >= 0: v >= 0 and 1 - beta_2 in (0, 1]
        new = {"m": new_m, "v": new_v}
        if "v_hat" in slots:
            new["v_hat"] = new_v = max(slots["v_hat"], new_v)
        step = new_m * alpha / epsilon  # the denominator sqrt(v) + epsilon is >= epsilon
        return _proven(limit, [grad * grad, grad + m, grad * grad + v, new_m * alpha, step], (param + step, new))


class _Adagrad(Optimizer):
    PARAMS = HYPER_PARAMETERS["adagrad"]
    _NON_NEGATIVE = ("accumulator",)

    def _slot_names(self) -> tuple[str, ...]:
        return ("accumulator",)

    def _slot_initial_value(self, slot: str) -> float:
        return self.config.params["initial_accumulator_value"]

    def _update(
        self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any], implicit_momentum: float
    ) -> None:
        acc = var.slots["accumulator"]
        # acc += g^2
        tmp = np.square(grad, out=_temporary(grad))
        np.add(acc, tmp, out=acc)
        # param -= (lr * g) / sqrt(acc + epsilon); epsilon inside the sqrt.
        np.add(acc, var.dtype.type(self.config.params["epsilon"]), out=tmp)
        np.sqrt(tmp, out=tmp)
        step = np.multiply(grad, lr, out=_temporary(grad, 1))
        np.divide(step, tmp, out=step)
        np.subtract(param, step, out=param)

    def _proves(
        self, var: _VariableState, limit: float, param: float, grad: float, lr: float, slots: Mapping[str, float]
    ) -> _Bounds | None:
        epsilon = float(var.dtype.type(self.config.params["epsilon"]))
        if not epsilon > 0.0:
            return None
        # acc >= 0 only grows, so sqrt(acc + epsilon) >= sqrt(epsilon) (1.01: its rounding).
        acc = slots["accumulator"] + grad * grad
        step = grad * lr * 1.01 / math.sqrt(epsilon)
        return _proven(limit, [grad * grad, acc + epsilon, grad * lr, step], (param + step, {"accumulator": acc}))


class _RMSprop(Optimizer):
    PARAMS = HYPER_PARAMETERS["rmsprop"]
    CORRECTS_MOMENTUM = True
    _NON_NEGATIVE = ("velocity",)

    def _slot_names(self) -> tuple[str, ...]:
        names = ["velocity"]
        if self.config.params["momentum"] > 0.0:
            names.append("momentum")
        if self._flag("centered"):
            names.append("average_gradient")
        return tuple(names)

    def _update(
        self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any], implicit_momentum: float
    ) -> None:
        p = self.config.params
        f = var.dtype.type
        rho, one_minus_rho = f(p["rho"]), f(1 - p["rho"])
        velocity = var.slots["velocity"]
        # velocity = rho * velocity + (1 - rho) * g^2
        tmp = np.square(grad, out=_temporary(grad))
        np.multiply(tmp, one_minus_rho, out=tmp)
        np.multiply(velocity, rho, out=velocity)
        np.add(velocity, tmp, out=velocity)
        if "average_gradient" in var.slots:
            avg = var.slots["average_gradient"]
            # avg = rho * avg + (1 - rho) * g
            np.multiply(grad, one_minus_rho, out=tmp)
            np.multiply(avg, rho, out=avg)
            np.add(avg, tmp, out=avg)
            # denominator = velocity - avg^2 + epsilon
            np.square(avg, out=tmp)
            np.subtract(velocity, tmp, out=tmp)
        else:
            # denominator = velocity + epsilon
            np.copyto(tmp, velocity)
        np.add(tmp, f(p["epsilon"]), out=tmp)
        # increment = (lr * g) / sqrt(denominator); epsilon inside the sqrt.
        np.sqrt(tmp, out=tmp)
        increment = np.multiply(grad, lr, out=_temporary(grad, 1))
        np.divide(increment, tmp, out=increment)
        if "momentum" in var.slots:
            # Heavy-ball momentum on the increment: mom = momentum * mom + increment.
            mom = var.slots["momentum"]
            np.multiply(mom, f(self._momentum("momentum", implicit_momentum)), out=mom)
            np.add(mom, increment, out=mom)
            increment = mom
        np.subtract(param, increment, out=param)

    def _proves(
        self, var: _VariableState, limit: float, param: float, grad: float, lr: float, slots: Mapping[str, float]
    ) -> _Bounds | None:
        p = self.config.params
        epsilon = float(var.dtype.type(p["epsilon"]))
        if self._flag("centered") or not epsilon > 0.0:
            # Centered: sqrt(velocity - average^2 + epsilon), whose sign no bound gives cheaply.
            return None
        # velocity = rho * velocity + (1 - rho) * g^2 stays >= 0, so the denominator
        # sqrt(velocity + epsilon) is >= sqrt(epsilon) (1.01: its rounding).
        velocity = slots["velocity"] * p["rho"] + grad * grad * (1.0 - p["rho"])
        increment = grad * lr * 1.01 / math.sqrt(epsilon)
        values = [grad * grad, velocity + epsilon, grad * lr, increment]
        new = {"velocity": velocity}
        if "momentum" in slots:
            new["momentum"] = increment = slots["momentum"] * p["momentum"] + increment
            values.append(slots["momentum"])
        return _proven(limit, values, (param + increment, new))


_OPTIMIZERS: dict[str, type[Optimizer]] = {
    "sgd": _SGD,
    "adam": _Adam,
    "adagrad": _Adagrad,
    "rmsprop": _RMSprop,
}


def make_optimizer(config: OptimizerConfig) -> Optimizer:
    """Validate ``config`` (``api.optimizer.normalized``) and build the optimizer, without variables yet."""
    config = normalized(config)
    return _OPTIMIZERS[config.name](config)
