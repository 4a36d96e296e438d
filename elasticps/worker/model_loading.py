"""Loads a model module (``--model_def``) and checks it keeps the model contract.

The contract, as in ElasticDL's model zoo: a module with
``custom_model(**params) -> keras.Model``, ``loss(labels, predictions) -> tensor``,
``optimizer() -> keras optimizer``, optionally ``feed(dataset, mode) -> tf.data.Dataset`` (maps a
dataset of ``(features, label)`` records to model inputs; ``mode`` is ``"training"`` or
``"evaluation"``) and ``eval_metrics_fn() -> {name: fn(labels, predictions)}`` (each fn returns a
per-example or mean value). A module that breaks the contract raises :class:`ModelError` naming
what is missing, before any training starts.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast


class ModelError(ValueError):
    """A model module that cannot be loaded or breaks the contract."""


@dataclass(frozen=True)
class ModelModule:
    name: str
    custom_model: Callable[..., Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[], Any]
    feed: Callable[[Any, str], Any] | None
    eval_metrics_fn: Callable[[], dict[str, Callable[[Any, Any], Any]]] | None


def load_model_module(name: str) -> ModelModule:
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        raise ModelError(f"model module {name!r} cannot be imported: {err}") from None
    return _check(name, module)


def _check(name: str, module: ModuleType) -> ModelModule:
    def required(attribute: str) -> Callable[..., Any]:
        found = getattr(module, attribute, None)
        if not callable(found):
            raise ModelError(f"model module {name!r} has no function {attribute}()")
        return cast(Callable[..., Any], found)

    def optional(attribute: str) -> Callable[..., Any] | None:
        found = getattr(module, attribute, None)
        if found is not None and not callable(found):
            raise ModelError(f"model module {name!r}: {attribute} must be a function")
        return found

    loss = required("loss")
    if len(inspect.signature(loss).parameters) != 2:
        raise ModelError(f"model module {name!r}: loss(labels, predictions) takes two arguments")
    return ModelModule(
        name=name,
        custom_model=required("custom_model"),
        loss=loss,
        optimizer=required("optimizer"),
        feed=optional("feed"),
        eval_metrics_fn=optional("eval_metrics_fn"),
    )
