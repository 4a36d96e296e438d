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
  would race between concurrent pushes.

Checked updates (what the PS uses): :meth:`Optimizer.stage` computes a variable's new value and
new slots into a :class:`Scratch` (allocated once, reused push after push), says whether all of
them are finite, and changes nothing; :meth:`Optimizer.commit` then copies them in and counts the
step. So a caller can check every variable of a push before it changes any (``tables.py``), and a
finite gradient that would overflow a variable or a slot (3e38 at learning rate 10) is refused
instead of leaving Inf or NaN behind. :meth:`Optimizer.apply` updates in place, unchecked (tests).

Thread safety: all per-variable state (slots and step count) is created by
:meth:`Optimizer.register` before training starts and is afterwards only
touched through that variable's name, so applies to *different* variables may
run concurrently without locks.  Applies to the *same* variable must be
serialised by the caller (the PS already serialises writes to a variable).
"""

from __future__ import annotations

import abc
import math
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

    __slots__ = ("shape", "dtype", "slots", "step")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any], slots: dict[str, Array]) -> None:
        self.shape = shape
        self.dtype = dtype
        self.slots = slots
        self.step = 0


class Scratch:
    """Room for one update of every registered variable: its new value and slots. Made by
    :meth:`Optimizer.new_scratch`; one update at a time uses it (the caller keeps a pool)."""

    __slots__ = ("params", "vars")

    def __init__(self, params: dict[str, Array], variables: dict[str, _VariableState]) -> None:
        self.params = params
        self.vars = variables


def finite(array: Array) -> bool:
    """No NaN or infinity in ``array``."""
    # Fast path, one pass and no temporary bool array: a NaN or infinity anywhere makes the sum
    # non-finite. A non-finite sum may also come from large finite values overflowing, so only
    # then the exact (element-wise) check decides.
    wide = np.float32 if array.dtype == np.float16 else None
    with np.errstate(over="ignore", invalid="ignore"):
        if math.isfinite(float(np.sum(array, dtype=wide))):
            return True
    return bool(np.isfinite(array).all())


class Optimizer(abc.ABC):
    """A numpy optimizer updating PS variables in place.

    Lifecycle: :meth:`register` every variable once, then :meth:`apply`
    gradients; :meth:`state` / :meth:`load_state` checkpoint the slots and the
    per-variable step counts.
    """

    # Hyper-parameters with Keras's defaults; filled in by each subclass.
    PARAMS: ClassVar[Mapping[str, Param]]

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
    def _update(self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any]) -> None:
        """Keras's update_step for one variable; ``var.step`` is already incremented."""

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

    def apply(self, name: str, param: Array, grad: Array, lr: float) -> None:
        """Update ``param`` (variable ``name``) in place with ``grad`` at learning rate ``lr``.

        ``grad`` is cast to the variable's dtype, as Keras does; it is never
        modified.  Increments the variable's step count.
        """
        var = self._checked(name, param, grad, lr)
        if grad.dtype != var.dtype:
            grad = grad.astype(var.dtype)
        var.step += 1
        self._run(var, param, grad, lr)

    def _checked(self, name: str, param: Array, grad: Array, lr: float) -> _VariableState:
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
        return var

    def _run(self, var: _VariableState, param: Array, grad: Array, lr: float) -> None:
        """One update of ``param`` and ``var``'s slots, in place, at step ``var.step``."""
        if param.ndim == 0:
            # numpy ufuncs return scalars, not arrays, for 0-d inputs, and the updates write into
            # temporaries with out=: update 1-element views of the same memory instead (a 0-d
            # array is contiguous, so reshape gives a view).
            view = _VariableState((1,), var.dtype, {slot: arr.reshape(1) for slot, arr in var.slots.items()})
            view.step = var.step
            self._update(view, param.reshape(1), grad.reshape(1), var.dtype.type(lr))
            return
        # Keras casts the learning rate to the variable's dtype before use.
        self._update(var, param, grad, var.dtype.type(lr))

    def new_scratch(self) -> Scratch:
        """Room for one checked update of every variable registered now (see :meth:`stage`)."""
        params = {name: np.empty(var.shape, var.dtype) for name, var in self._vars.items()}
        rooms = {
            name: _VariableState(var.shape, var.dtype, {slot: np.empty_like(a) for slot, a in var.slots.items()})
            for name, var in self._vars.items()
        }
        return Scratch(params, rooms)

    def stage(self, name: str, param: Array, grad: Array, lr: float, scratch: Scratch) -> bool:
        """Computes variable ``name``'s update into ``scratch``, changing nothing; True when the
        new value and every new slot are finite (then :meth:`commit` may copy them in)."""
        var = self._checked(name, param, grad, lr)
        if grad.dtype != var.dtype:
            grad = grad.astype(var.dtype)
        room, new = scratch.vars[name], scratch.params[name]
        np.copyto(new, param)
        for slot, arr in var.slots.items():
            np.copyto(room.slots[slot], arr)
        room.step = var.step + 1
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            self._run(room, new, grad, lr)
        return finite(new) and all(finite(arr) for arr in room.slots.values())

    def commit(self, name: str, param: Array, scratch: Scratch) -> None:
        """Copies what :meth:`stage` computed for ``name`` into ``param`` and the slots."""
        var, room = self._vars[name], scratch.vars[name]
        np.copyto(param, scratch.params[name])
        for slot, arr in var.slots.items():
            np.copyto(arr, room.slots[slot])
        var.step = room.step

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

    @staticmethod
    def _lookup(arrays: Mapping[str, Array], key: str) -> Array:
        if key not in arrays:
            raise OptimizerError(f"optimizer state is missing {key!r}")
        return np.asarray(arrays[key])

    def _flag(self, key: str) -> bool:
        return self.config.params[key] == 1.0


class _SGD(Optimizer):
    PARAMS = HYPER_PARAMETERS["sgd"]

    def _slot_names(self) -> tuple[str, ...]:
        # Keras creates the momentum slot only when momentum != 0, and then
        # ignores nesterov: plain SGD.
        return ("momentum",) if self.config.params["momentum"] != 0.0 else ()

    def _update(self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any]) -> None:
        scaled = np.multiply(grad, lr)  # gradient * learning_rate
        if "momentum" not in var.slots:
            np.subtract(param, scaled, out=param)
            return
        m = var.slots["momentum"]
        momentum = var.dtype.type(self.config.params["momentum"])
        # m = m * momentum - gradient * learning_rate
        np.multiply(m, momentum, out=m)
        np.subtract(m, scaled, out=m)
        if self._flag("nesterov"):
            # param += m * momentum - gradient * learning_rate (Keras's order
            # of operations, kept for bit-compatibility).
            step = np.multiply(m, momentum)
            np.subtract(step, scaled, out=step)
            np.add(param, step, out=param)
        else:
            np.add(param, m, out=param)


class _Adam(Optimizer):
    PARAMS = HYPER_PARAMETERS["adam"]

    def _slot_names(self) -> tuple[str, ...]:
        return ("m", "v", "v_hat") if self._flag("amsgrad") else ("m", "v")

    def _update(self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any]) -> None:
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
        tmp = np.subtract(grad, m)
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
        step = np.multiply(m, alpha)
        np.divide(step, tmp, out=step)
        np.subtract(param, step, out=param)


class _Adagrad(Optimizer):
    PARAMS = HYPER_PARAMETERS["adagrad"]

    def _slot_names(self) -> tuple[str, ...]:
        return ("accumulator",)

    def _slot_initial_value(self, slot: str) -> float:
        return self.config.params["initial_accumulator_value"]

    def _update(self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any]) -> None:
        acc = var.slots["accumulator"]
        # acc += g^2
        tmp = np.square(grad)
        np.add(acc, tmp, out=acc)
        # param -= (lr * g) / sqrt(acc + epsilon); epsilon inside the sqrt.
        np.add(acc, var.dtype.type(self.config.params["epsilon"]), out=tmp)
        np.sqrt(tmp, out=tmp)
        step = np.multiply(grad, lr)
        np.divide(step, tmp, out=step)
        np.subtract(param, step, out=param)


class _RMSprop(Optimizer):
    PARAMS = HYPER_PARAMETERS["rmsprop"]

    def _slot_names(self) -> tuple[str, ...]:
        names = ["velocity"]
        if self.config.params["momentum"] > 0.0:
            names.append("momentum")
        if self._flag("centered"):
            names.append("average_gradient")
        return tuple(names)

    def _update(self, var: _VariableState, param: Array, grad: Array, lr: np.floating[Any]) -> None:
        p = self.config.params
        f = var.dtype.type
        rho, one_minus_rho = f(p["rho"]), f(1 - p["rho"])
        velocity = var.slots["velocity"]
        # velocity = rho * velocity + (1 - rho) * g^2
        tmp = np.square(grad)
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
        increment = np.multiply(grad, lr)
        np.divide(increment, tmp, out=increment)
        if "momentum" in var.slots:
            # Heavy-ball momentum on the increment: mom = momentum * mom + increment.
            mom = var.slots["momentum"]
            np.multiply(mom, f(p["momentum"]), out=mom)
            np.add(mom, increment, out=mom)
            increment = mom
        np.subtract(param, increment, out=param)


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
