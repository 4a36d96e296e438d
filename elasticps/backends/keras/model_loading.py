"""Loads a model module (``--model_def``) and checks it keeps the model contract.

The contract, as in ElasticDL's model zoo (``docs/model-zoo.md`` puts the two side by side): a
module with ``custom_model(**params) -> keras.Model``, ``loss(labels, predictions) -> tensor``,
``optimizer() -> keras optimizer`` (called with no arguments: parameters need defaults),
optionally ``eval_metrics_fn() -> {name: fn(labels, predictions)}`` (each fn returns a
per-example or mean value), optionally ``eval_set_metrics_fn() -> {name: fn(labels, outputs)}``
(metrics of a whole set of records at once, such as the AUC: each fn takes numpy arrays of an
evaluation task's labels and model outputs and returns one number, which the job reports averaged
over the tasks by their records: exact when the validation data is one task) and at most one
data function:

* ``dataset_fn(dataset, mode, metadata) -> tf.data.Dataset``, ElasticDL's: ``mode`` is a
  :class:`~elasticps.model_contract.Mode`, ``metadata`` a :class:`~elasticps.model_contract.Metadata`;
* ``feed(dataset, mode) -> tf.data.Dataset``, elasticps's older name for the same, without metadata
  (``mode`` the same ``Mode``, equal to the strings ``"training"`` and ``"evaluation"``).

The dataset holds one element per record: ``(features, label)`` when the reader gives labels,
the record alone when it does not (a scalar string for a serialized ``tf.train.Example``). The
function maps it to ``(features, labels)`` pairs for training and evaluation (features only, or
pairs, for prediction). A module with neither function gets the records as they are, which
suffices for readers that give labels. A module that breaks the contract raises
:class:`ModelError` naming what is wrong, before any training starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

from elasticps.backends.api import ModelError, blame_model_code
from elasticps.model_contract import Metadata, Mode

log = logging.getLogger(__name__)
__all__ = ["Metadata", "Mode", "ModelError", "ModelModule", "load_model_module"]

# The example models lived in ``elasticps.zoo`` before the backends: a job that still names one
# there gets the same module from its new home, with a line saying so.
_ZOO_BEFORE, _ZOO = "elasticps.zoo.", "elasticps.backends.keras.zoo."


@dataclass(frozen=True)
class ModelModule:
    name: str
    custom_model: Callable[..., Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[], Any]
    feed: Callable[[Any, str], Any] | None
    eval_metrics_fn: Callable[[], dict[str, Callable[[Any, Any], Any]]] | None
    dataset_fn: Callable[[Any, Mode, Metadata], Any] | None = None
    eval_set_metrics_fn: Callable[[], dict[str, Callable[[Any, Any], float]]] | None = None

    def __post_init__(self) -> None:
        if self.feed is not None and self.dataset_fn is not None:
            raise ModelError(
                f"model module {self.name!r} has both feed(dataset, mode) and "
                "dataset_fn(dataset, mode, metadata): keep one"
            )

    def prepare(self, dataset: Any, mode: Mode, metadata: Metadata) -> Any:
        """The records of ``dataset`` through the module's data function (or as they are)."""
        if self.dataset_fn is not None:
            return self.dataset_fn(dataset, mode, metadata)
        if self.feed is not None:
            return self.feed(dataset, mode)
        return dataset


def load_model_module(name: str) -> ModelModule:
    if name.startswith(_ZOO_BEFORE):
        moved = _ZOO + name.removeprefix(_ZOO_BEFORE)
        log.warning("model module %s is %s now: load it by that name", name, moved)
        name = moved
    try:
        module = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - whatever the module's own code raises: said in one line
        raise ModelError(f"model module {name!r} cannot be imported: {_where(name, err)}") from None
    return _check(name, module)


def _where(name: str, err: Exception) -> str:
    """``err`` raised while importing ``name``, with the module's file and line when it was its own
    code (a SyntaxError, a NameError, an import of a package that is missing ...)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    blamed = blame_model_code(err, spec.origin if spec is not None else None)
    return str(blamed) if blamed is not None else str(err)


def _takes(function: Callable[..., Any], arguments: int) -> bool:
    try:
        inspect.signature(function).bind(*([None] * arguments))
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (a builtin): let the call decide
        return True
    return True


def _check(name: str, module: ModuleType) -> ModelModule:
    def required(attribute: str) -> Callable[..., Any]:
        found = getattr(module, attribute, None)
        if not callable(found):
            raise ModelError(f"model module {name!r} has no function {attribute}()")
        return cast(Callable[..., Any], found)

    def optional(attribute: str, usage: str = "", arguments: int = 0) -> Callable[..., Any] | None:
        found = getattr(module, attribute, None)
        if found is not None and not callable(found):
            raise ModelError(f"model module {name!r}: {attribute} must be a function")
        if found is not None and usage and not _takes(found, arguments):
            raise ModelError(f"model module {name!r}: {usage} takes {arguments} arguments")
        return found

    loss = required("loss")
    if len(inspect.signature(loss).parameters) != 2:
        raise ModelError(f"model module {name!r}: loss(labels, predictions) takes two arguments")
    return ModelModule(
        name=name,
        custom_model=required("custom_model"),
        loss=loss,
        optimizer=required("optimizer"),
        feed=optional("feed", "feed(dataset, mode)", 2),
        eval_metrics_fn=optional("eval_metrics_fn"),
        dataset_fn=optional("dataset_fn", "dataset_fn(dataset, mode, metadata)", 3),
        eval_set_metrics_fn=optional("eval_set_metrics_fn"),
    )
