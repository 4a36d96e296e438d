"""A PyTorch optimizer as the PS's :class:`OptimizerConfig` (the PS applies the gradients with its
own numpy optimizers, ``ps/optimizers.py``, which follow Keras's formulas).

Exact classes only, one parameter group, and every option that changes what is applied at its
"off" value (weight decay, dampening, ``maximize``, Adagrad's ``lr_decay``): anything else is
refused in one line, since training with another optimizer than the one asked for is worse than
not starting. Where the formulas differ by where epsilon sits, the PS's is Keras's: Adam adds it to
``sqrt(v)`` before the bias correction (torch: after), RMSprop inside the square root (torch:
outside). Both differ only while ``v`` is of the order of epsilon squared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from elasticps.api.optimizer import OptimizerConfig, OptimizerError, normalized

__all__ = ["optimizer_config"]

# torch class -> (the PS's name, {the PS's hyper-parameter: how to read it from torch's defaults}).
_SUPPORTED: dict[type[Any], tuple[str, dict[str, Any]]] = {
    torch.optim.SGD: ("sgd", {"momentum": lambda d: d["momentum"], "nesterov": lambda d: d["nesterov"]}),
    torch.optim.Adam: ("adam", {
        "beta_1": lambda d: d["betas"][0], "beta_2": lambda d: d["betas"][1], "epsilon": lambda d: d["eps"],
        "amsgrad": lambda d: d["amsgrad"],
    }),
    torch.optim.Adagrad: ("adagrad", {
        "initial_accumulator_value": lambda d: d["initial_accumulator_value"], "epsilon": lambda d: d["eps"],
    }),
    torch.optim.RMSprop: ("rmsprop", {
        "rho": lambda d: d["alpha"], "momentum": lambda d: d["momentum"], "epsilon": lambda d: d["eps"],
        "centered": lambda d: d["centered"],
    }),
}  # fmt: skip

# Options that change what is applied: each must be at its "off" value (0, False or None).
_MUST_BE_OFF = ("weight_decay", "dampening", "maximize", "lr_decay", "decoupled_weight_decay", "differentiable")
# Options of how torch computes, not what: ignored.
_HOW = frozenset({"foreach", "fused", "capturable"})


def optimizer_config(optimizer: torch.optim.Optimizer, learning_rate: float | None = None) -> OptimizerConfig:
    """The PS configuration reproducing ``optimizer``; ``learning_rate`` (when given) replaces its
    own. Raises :class:`OptimizerError` for one the PS cannot reproduce."""
    cls = type(optimizer)
    supported = _SUPPORTED.get(cls)
    if supported is None:
        names = ", ".join(f"torch.optim.{c.__name__}" for c in _SUPPORTED)
        raise OptimizerError(f"the parameter server cannot run optimizer {cls.__name__}; use one of {names} (exact classes)")
    if len(optimizer.param_groups) != 1:
        raise OptimizerError(
            f"{cls.__name__} has {len(optimizer.param_groups)} parameter groups; the parameter server applies one set of "
            "hyper-parameters to every parameter"
        )
    name, readers = supported
    group: Mapping[str, Any] = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    for option in _MUST_BE_OFF:
        value = group.get(option)
        if value not in (None, False, 0, 0.0):
            raise OptimizerError(f"{cls.__name__}({option}={value!r}) is not supported by the parameter server; leave it off")
    raw_lr = _number(group.get("lr"))
    if raw_lr is None:
        raise OptimizerError(f"{cls.__name__}(lr={group.get('lr')!r}): the parameter server needs a constant number")
    params: dict[str, float] = {"learning_rate": float(learning_rate if learning_rate is not None else raw_lr)}
    for key, read in readers.items():
        value = _number(read(group))
        if value is None:
            raise OptimizerError(f"{cls.__name__}: {key} {read(group)!r} is not a plain number")
        params[key] = value
    known = {"lr", "betas", "eps", "alpha", "momentum", "nesterov", "amsgrad", "centered", "initial_accumulator_value"}
    unknown = sorted(k for k, v in group.items() if k not in known | _HOW | set(_MUST_BE_OFF) and v not in (None, False, 0, 0.0))
    if unknown:
        raise OptimizerError(f"{cls.__name__} has options the parameter server does not know: {unknown}")
    return normalized(OptimizerConfig(name, params))


def _number(value: object) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        return float(value)
    return None
