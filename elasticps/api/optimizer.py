"""The optimizer a job trains with, as both roles know it: its name and Keras-named hyper-parameters.

Callers: the worker translates the model module's Keras optimizer into an :class:`OptimizerConfig`
(``elasticps/backends/keras/optimizer_spec.py``) and pushes it with the model; the PS builds its numpy optimizer from
it (``ps/optimizers.py``). Both validate through :func:`normalized`, so a bad value fails on the
worker at start-up with the same message the PS would give. Pure: no numpy state, no TensorFlow.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["HYPER_PARAMETERS", "MAX_LEARNING_RATE", "OptimizerConfig", "OptimizerError", "normalized"]


class OptimizerError(ValueError):
    """An optimizer configuration or state the PS cannot use.

    The message names the offending optimizer, hyper-parameter, variable or
    checkpoint key, since it usually ends up in a worker's or PS's log.
    """


@dataclass(frozen=True)
class OptimizerConfig:
    """Which optimizer the PS runs, with Keras's hyper-parameter names.

    ``name`` is one of ``"sgd"``, ``"adam"``, ``"adagrad"``, ``"rmsprop"``.
    ``params`` holds floats only, because it travels in the protobuf
    ``map<string, double>``: booleans (``nesterov``, ``amsgrad``, ``centered``)
    are 0.0 or 1.0.  Missing hyper-parameters take Keras's defaults;
    :func:`normalized` gives the form with all of them present.
    """

    name: str
    params: Mapping[str, float]


@dataclass(frozen=True)
class Param:
    """A hyper-parameter: Keras's default, and a validity check with its rule spelled out."""

    default: float
    check: Callable[[float], bool]
    rule: str


# The largest learning rate a job or a push may carry: far above any that trains, low enough that
# a hostile or mistaken push cannot throw the weights to 1e30 in one step (finite, but ruined).
MAX_LEARNING_RATE = 1e4


def _learning_rate(default: float) -> Param:
    return Param(default, lambda v: 0.0 < v <= MAX_LEARNING_RATE, f"must be in (0, {MAX_LEARNING_RATE:g}]")


def _non_negative(default: float) -> Param:
    return Param(default, lambda v: v >= 0.0, "must be >= 0")


def _decay(default: float) -> Param:
    # Betas and rho: 1 would divide by zero in Adam's bias correction (or freeze the average).
    return Param(default, lambda v: 0.0 <= v < 1.0, "must be in [0, 1)")


def _momentum(default: float) -> Param:
    # Keras's SGD rejects momentum outside [0, 1]; RMSprop gets the same rule.
    return Param(default, lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]")


def _boolean(default: float) -> Param:
    return Param(default, lambda v: v in (0.0, 1.0), "must be 0.0 (false) or 1.0 (true)")


# Every optimizer the PS implements, with Keras's defaults.
HYPER_PARAMETERS: Mapping[str, Mapping[str, Param]] = {
    "sgd": {"learning_rate": _learning_rate(0.01), "momentum": _momentum(0.0), "nesterov": _boolean(0.0)},
    "adam": {
        "learning_rate": _learning_rate(0.001),
        "beta_1": _decay(0.9),
        "beta_2": _decay(0.999),
        "epsilon": _non_negative(1e-7),
        "amsgrad": _boolean(0.0),
    },
    "adagrad": {
        "learning_rate": _learning_rate(0.001),
        "initial_accumulator_value": _non_negative(0.1),
        "epsilon": _non_negative(1e-7),
    },
    "rmsprop": {
        "learning_rate": _learning_rate(0.001),
        "rho": _decay(0.9),
        "momentum": _momentum(0.0),
        "epsilon": _non_negative(1e-7),
        "centered": _boolean(0.0),
    },
}


def normalized(config: OptimizerConfig) -> OptimizerConfig:
    """``config`` validated, with every hyper-parameter present (Keras's default where missing).

    Raises :class:`OptimizerError` naming an unknown optimizer, an unknown hyper-parameter, or one
    whose value is out of range or not a finite number.
    """
    table = HYPER_PARAMETERS.get(config.name)
    if table is None:
        raise OptimizerError(f"unknown optimizer {config.name!r}; the PS supports {sorted(HYPER_PARAMETERS)}")
    for key, value in config.params.items():
        spec = table.get(key)
        if spec is None:
            raise OptimizerError(
                f"unknown hyper-parameter {key!r} for optimizer {config.name!r}; expected some of {sorted(table)}"
            )
        # bool is Real, so True/False pass as 1.0/0.0; strings and None do not; numpy's scalar
        # types are registered as numbers.Real.
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise OptimizerError(
                f"hyper-parameter {key!r} of optimizer {config.name!r} must be a finite number, got {value!r}"
            )
        if not spec.check(float(value)):
            raise OptimizerError(f"hyper-parameter {key!r} of optimizer {config.name!r} {spec.rule}, got {value!r}")
    params = {key: float(config.params.get(key, spec.default)) for key, spec in table.items()}
    return OptimizerConfig(config.name, params)

