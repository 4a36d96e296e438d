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

* ``dataset_fn(dataset, mode, metadata) -> tf.data.Dataset``, or ``feed(dataset, mode, metadata)``,
  the name ElasticDL's zoo gives it since 2020: ``mode`` is a
  :class:`~elasticps.model_contract.Mode`, ``metadata`` a :class:`~elasticps.model_contract.Metadata`;
* ``feed(dataset, mode) -> tf.data.Dataset``, elasticps's older form, without metadata
  (``mode`` the same ``Mode``, equal to the strings ``"training"`` and ``"evaluation"``).

A ``modelDef`` may name the module, or, as ElasticDL's ``--model_def`` does, a function or class in
it (``pkg.mnist_subclass.CustomModel``): that one then makes the model, called with the job's
``spec.model.params``, and the module's ``custom_model`` is not needed.

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
from elasticps.callbacks import LearningRateScheduler
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
    # The learning rate by model version: callbacks()'s LearningRateScheduler, or ElasticDL's older
    # learning_rate_scheduler(model_version); None: the optimizer's (or the job's) constant rate.
    schedule: LearningRateScheduler | None = None
    # ElasticDL's PredictionOutputsProcessor: a class whose instance gets each prediction task's outputs.
    prediction_processor: Callable[[], Any] | None = None

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
    """The module ``name`` names; or, as ElasticDL's ``--model_def`` (``mnist.mnist_subclass.CustomModel``),
    the module before its last dot, whose function or class of that name makes the model in place
    of ``custom_model``."""
    if name.startswith(_ZOO_BEFORE):
        moved = _ZOO + name.removeprefix(_ZOO_BEFORE)
        log.warning("model module %s is %s now: load it by that name", name, moved)
        name = moved
    module_name, model_name = name, ""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        if "." not in name or err.name != name:
            raise ModelError(f"model module {name!r} cannot be imported: {_where(name, err)}") from None
        module_name, model_name = name.rsplit(".", 1)
        module = _imported(module_name)
        if not callable(getattr(module, model_name, None)):
            raise ModelError(f"model module {name!r} cannot be imported: {err}, and module {module_name!r} has "
                             f"no function or class {model_name}") from None
    except Exception as err:  # noqa: BLE001 - whatever the module's own code raises: said in one line
        raise ModelError(f"model module {name!r} cannot be imported: {_where(name, err)}") from None
    return _check(module_name, module, model_name)


def _imported(module_name: str) -> ModuleType:
    """The module of a ``modelDef`` naming a function or class in it (its parent package was
    found: the import of the whole name got that far)."""
    try:
        return importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - whatever the module's own code raises: said in one line
        raise ModelError(f"model module {module_name!r} cannot be imported: {_where(module_name, err)}") from None


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


def _check(name: str, module: ModuleType, model_name: str = "") -> ModelModule:
    """``model_name``: the function or class that makes the model (``custom_model`` when empty)."""

    def required(attribute: str) -> Callable[..., Any]:
        found = getattr(module, attribute, None)
        if not callable(found):
            what = "function or class" if attribute == model_name else "function"
            raise ModelError(f"model module {name!r} has no {what} {attribute}()")
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
    feed, dataset_fn = _data_functions(name, optional("feed"), optional("dataset_fn"))
    schedule = _schedule(name, optional("callbacks"), optional("learning_rate_scheduler", "learning_rate_scheduler(model_version)", 1))
    return ModelModule(
        name=name,
        custom_model=required(model_name or "custom_model"),
        loss=loss,
        optimizer=required("optimizer"),
        feed=feed,
        eval_metrics_fn=optional("eval_metrics_fn"),
        dataset_fn=dataset_fn,
        eval_set_metrics_fn=optional("eval_set_metrics_fn"),
        schedule=schedule,
        prediction_processor=optional("PredictionOutputsProcessor"),
    )


def _schedule(
    name: str, callbacks: Callable[[], Any] | None, scheduler: Callable[[int], float] | None
) -> LearningRateScheduler | None:
    """The module's learning-rate schedule: ``callbacks()``'s :class:`LearningRateScheduler` (the
    one callback with a meaning on a PS; any other is refused naming it), or ElasticDL's older
    ``learning_rate_scheduler(model_version)``; at most one."""
    found: list[LearningRateScheduler] = [] if scheduler is None else [LearningRateScheduler(scheduler)]
    given = [] if callbacks is None else callbacks()
    if given is None:
        given = []
    if not isinstance(given, (list, tuple)):
        raise ModelError(f"model module {name!r}: callbacks() returns a list, got {type(given).__name__}")
    for callback in given:
        if isinstance(callback, LearningRateScheduler):
            found.append(callback)
            continue
        kind = f"{type(callback).__module__}.{type(callback).__qualname__}"
        if type(callback).__name__ == "LearningRateScheduler":
            raise ModelError(f"model module {name!r}: callbacks() gives {kind}, which schedules by epoch; use "
                             "elasticps.callbacks.LearningRateScheduler(schedule(model_version))")
        raise ModelError(f"model module {name!r}: callbacks() gives {kind}, which has no meaning on a parameter "
                         "server (only elasticps.callbacks.LearningRateScheduler is applied)")
    if len(found) > 1:
        raise ModelError(f"model module {name!r} gives {len(found)} learning-rate schedules (callbacks() and "
                         "learning_rate_scheduler): keep one")
    return found[0] if found else None


def _data_functions(
    name: str, feed: Callable[..., Any] | None, dataset_fn: Callable[..., Any] | None
) -> tuple[Callable[..., Any] | None, Callable[..., Any] | None]:
    """The module's ``(feed, dataset_fn)``: a ``feed`` taking three arguments is ElasticDL's
    ``feed(dataset, mode, metadata)`` (its zoo's name since 2020), so it is the ``dataset_fn``;
    one taking two is elasticps's older ``feed(dataset, mode)``."""
    if dataset_fn is not None and not _takes(dataset_fn, 3):
        raise ModelError(f"model module {name!r}: dataset_fn(dataset, mode, metadata) takes 3 arguments")
    if feed is None:
        return None, dataset_fn
    if _takes(feed, 3):
        if dataset_fn is not None:
            raise ModelError(f"model module {name!r} has both feed(dataset, mode, metadata) and "
                             "dataset_fn(dataset, mode, metadata): keep one")
        return None, feed
    if not _takes(feed, 2):
        raise ModelError(f"model module {name!r}: feed takes 3 arguments, (dataset, mode, metadata), "
                         "or 2, (dataset, mode)")
    return feed, dataset_fn
