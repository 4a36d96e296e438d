"""Translate the user's Keras optimizer into the PS's :class:`OptimizerConfig`.

The worker compiles the user's model with a Keras optimizer, but gradients are
applied on the parameter server by the numpy re-implementations in
:mod:`elasticps.ps.optimizers`.  This module is the bridge: it reads the Keras
optimizer's ``get_config()`` and refuses, with a one-line message, anything
the PS would silently not reproduce (other optimizer classes, learning-rate
schedules, clipping, weight decay, EMA, gradient accumulation, loss scaling),
since training with a different optimizer than the one the user asked for is
worse than failing at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from elasticps.api.optimizer import OptimizerConfig, OptimizerError, normalized

__all__ = ["optimizer_config"]

# Keras class -> (PS optimizer name, the get_config() keys that are its
# hyper-parameters, besides learning_rate).  Exact classes only: a subclass
# (AdamW is one of Adam) may change update_step, which the PS cannot see.
_SUPPORTED: dict[type[Any], tuple[str, tuple[str, ...]]] = {
    keras.optimizers.SGD: ("sgd", ("momentum", "nesterov")),
    keras.optimizers.Adam: ("adam", ("beta_1", "beta_2", "epsilon", "amsgrad")),
    keras.optimizers.Adagrad: ("adagrad", ("initial_accumulator_value", "epsilon")),
    keras.optimizers.RMSprop: ("rmsprop", ("rho", "momentum", "epsilon", "centered")),
}

# Base-optimizer options that change what is applied; the PS supports none of
# them, so each must be at its "off" value (None, or False for use_ema).
_UNSUPPORTED_OPTIONS = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "gradient_accumulation_steps",
    "loss_scale_factor",
)

# Base-optimizer keys that are harmless: the name, and EMA settings that only
# matter when use_ema is on (rejected above).
_IGNORED = frozenset({"name", "learning_rate", "ema_momentum", "ema_overwrite_frequency"})


def optimizer_config(
    optimizer: keras.optimizers.Optimizer, learning_rate: float | None = None, scheduled: bool = False
) -> OptimizerConfig:
    """The PS configuration reproducing ``optimizer``, all hyper-parameters filled in.

    ``learning_rate``, when given, replaces the optimizer's own (constant)
    learning rate.  ``scheduled``: the caller applies the optimizer's
    learning-rate schedule itself (the worker, by model version), so a
    schedule is accepted with ``learning_rate`` as its base.  Raises
    :class:`OptimizerError` for an optimizer the PS cannot reproduce exactly.
    """
    cls = type(optimizer)
    supported = _SUPPORTED.get(cls)
    if supported is None:
        names = ", ".join(c.__name__ for c in _SUPPORTED)
        raise OptimizerError(
            f"the parameter server cannot run optimizer {cls.__name__}; use one of {names} (exact classes)"
        )
    name, keys = supported
    config: Mapping[str, Any] = optimizer.get_config()

    for option in _UNSUPPORTED_OPTIONS:
        value = config.get(option)
        if value is not None and value is not False:
            raise OptimizerError(
                f"{cls.__name__}({option}={value!r}) is not supported by the parameter server; leave {option} unset"
            )

    # A schedule or callable serialises to a dict; the PS only has a constant
    # base rate (which it scales per push for staleness).  Checked even when
    # an override is given, so a schedule is never dropped silently.
    raw_lr = _number(config.get("learning_rate"))
    if raw_lr is None and not (scheduled and learning_rate is not None):
        raise OptimizerError(
            f"{cls.__name__} has a learning-rate schedule or callable; the parameter server needs a constant learning rate"
        )
    if learning_rate is None:
        assert raw_lr is not None
        # Keras keeps the rate in a float32 variable, so get_config() returns
        # e.g. 0.10000000149011612 for 0.1; the shortest float32 repr gives
        # the user's number back and is the same float32 on the PS.
        learning_rate = float(str(np.float32(raw_lr)))

    params: dict[str, float] = {"learning_rate": float(learning_rate)}
    for key in keys:
        value = _number(config.get(key))
        if value is None:
            raise OptimizerError(
                f"{cls.__name__}({key}={config.get(key)!r}) is not supported by the parameter server; "
                "it needs a plain number"
            )
        params[key] = value

    unknown = sorted(set(config) - set(keys) - set(_UNSUPPORTED_OPTIONS) - _IGNORED)
    if unknown:
        # A newer Keras with options this translation does not know about:
        # refuse rather than guess what they do.
        raise OptimizerError(f"{cls.__name__} has options the parameter server does not know: {unknown}")

    # Validate here, on the worker, so a bad value fails at start-up with the
    # user's traceback rather than on the PS; and return the normalised form.
    return normalized(OptimizerConfig(name, params))


def _number(value: object) -> float | None:
    """``value`` as a finite float, or None if it is not a plain number.

    bool counts (nesterov, amsgrad, centered travel as 0.0/1.0); tensors,
    callables, dicts (serialised schedules) and None do not.
    """
    if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(float(value)):
        return float(value)
    return None
