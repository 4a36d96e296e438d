"""Loads a PyTorch model module (``--model_def``) and checks it keeps the torch model contract.

The contract (``docs/model-zoo.md`` sets it beside the Keras one): a module with

* ``model(**params) -> torch.nn.Module``: parameters named by ``named_parameters()`` (the names the
  PS shards by); floating-point buffers (BatchNorm's running statistics) travel as model state, as
  Keras's non-trainable variables do;
* ``loss(outputs, labels) -> tensor``: per record or already a mean (the mean is taken);
* ``optimizer(parameters) -> torch.optim.Optimizer``: mapped to the PS's optimizers
  (``optimizer_spec.py``); what the PS cannot apply is refused in one line;
* optionally ``feed(features, labels, mode) -> (inputs, labels)``: a whole task's records (numpy
  arrays as the reader gives them; ``labels`` None for a reader without) to tensors; without it the
  features become float32 tensors and the labels int64 ones;
* optionally ``eval_metrics_fn() -> {name: fn(outputs, labels) -> tensor}`` (per record or a mean);
* optionally ``eval_set_metrics_fn() -> {name: fn(outputs, labels) -> float}``: a metric over an
  evaluation task's records at once (numpy arrays; the AUC, ``elasticps.api.metrics.auc``).

A module that breaks the contract raises :class:`ModelError` naming what is wrong, before any
training starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

from elasticps.backends.api import ModelError, blame_model_code


@dataclass(frozen=True)
class TorchModule:
    name: str
    model: Callable[..., Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Any], Any]
    feed: Callable[[Any, Any, str], Any] | None
    eval_metrics_fn: Callable[[], dict[str, Callable[[Any, Any], Any]]] | None
    eval_set_metrics_fn: Callable[[], dict[str, Callable[[Any, Any], float]]] | None = None


def load_torch_module(name: str) -> TorchModule:
    try:
        module = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - whatever the module's own code raises: said in one line
        origin = getattr(importlib.util.find_spec(name) if _findable(name) else None, "origin", None)
        blamed = blame_model_code(err, origin)
        raise ModelError(f"model module {name!r} cannot be imported: {blamed or err}") from None
    return _check(name, module)


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _arguments(function: Callable[..., Any]) -> int | None:
    try:
        return len(inspect.signature(function).parameters)
    except ValueError:  # no signature to inspect (a builtin)
        return None


def _check(name: str, module: ModuleType) -> TorchModule:
    def function(attribute: str, arguments: int | None, usage: str, required: bool = True) -> Callable[..., Any] | None:
        found = getattr(module, attribute, None)
        if found is None and not required:
            return None
        if not callable(found):
            raise ModelError(f"model module {name!r} has no function {usage}")
        taken = _arguments(found)
        if arguments is not None and taken is not None and taken != arguments:
            raise ModelError(f"model module {name!r}: {usage} takes {arguments} arguments")
        return cast(Callable[..., Any], found)

    model = function("model", None, "model(**params)")
    loss = function("loss", 2, "loss(outputs, labels)")
    optimizer = function("optimizer", 1, "optimizer(parameters)")
    assert model is not None and loss is not None and optimizer is not None
    return TorchModule(
        name=name,
        model=model,
        loss=loss,
        optimizer=optimizer,
        feed=function("feed", 3, "feed(features, labels, mode)", required=False),
        eval_metrics_fn=function("eval_metrics_fn", 0, "eval_metrics_fn()", required=False),
        eval_set_metrics_fn=function("eval_set_metrics_fn", 0, "eval_set_metrics_fn()", required=False),
    )
