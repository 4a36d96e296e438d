"""A Keras model module's ``eval_metrics_fn()``, read as ElasticDL's zoo writes it.

``eval_metrics_fn()`` returns ``{name: metric}``, or, for a model whose outputs are a dict, per
output ``{output: {name: metric}}`` (ElasticDL's DeepFM: accuracy on ``logits``, AUC on
``probs``); the two forms may mix. A metric is

* a function ``fn(labels, predictions)`` giving per-example values (booleans too) or their mean:
  the worker averages it over a task's records, and the coordinator over every evaluation record;
* a Keras metric object (``keras.metrics.AUC()``, ``keras.metrics.Mean()`` ...): the worker resets
  it for each evaluation task, updates it with every minibatch and reports its result over the
  task; the job's value is the results averaged over the tasks by their records, which is exact
  for a mean (accuracy, a mean loss) and, for a whole-set metric such as the AUC, exact when the
  validation data is one task (as ``eval_set_metrics_fn``'s).

A per-output metric is named by its own name, or ``output/name`` where two outputs give one name.
Each gets the labels and its output's predictions. Anything else is refused in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import keras

from elasticps.backends.api import ModelError


@dataclass(frozen=True)
class EvalMetric:
    name: str
    output: str | None  # the key of the model's (dict) outputs it reads; None: the outputs as they are
    function: Callable[[Any, Any], Any] | None = None  # per-example values or a mean
    metric: Any = None  # a keras.metrics.Metric: a result over a task's records

    def predictions(self, outputs: Any, module: str) -> Any:
        """The part of the model's outputs this metric reads."""
        if self.output is None:
            return outputs
        if not isinstance(outputs, Mapping) or self.output not in outputs:
            keys = sorted(outputs) if isinstance(outputs, Mapping) else "not a dict"
            raise ModelError(f"{module}: eval_metrics_fn's {self.name!r} reads the model's output {self.output!r}, "
                             f"but the outputs are {keys}")
        return outputs[self.output]


def _one(module: str, name: str, output: str | None, value: Any) -> EvalMetric:
    if isinstance(value, keras.metrics.Metric):
        return EvalMetric(name, output, metric=value)
    if callable(value):
        return EvalMetric(name, output, function=value)
    where = name if output is None else f"{output}/{name}"
    raise ModelError(f"{module}: eval_metrics_fn's {where!r} is {type(value).__name__}: a function of "
                     "(labels, predictions) or a keras.metrics.Metric")


def eval_metrics(module: str, given: Any) -> list[EvalMetric]:
    """The metrics of ``eval_metrics_fn()``'s answer ``given``, each named once. Pure."""
    if not isinstance(given, Mapping):
        raise ModelError(f"{module}: eval_metrics_fn() returns a dict of metrics, got {type(given).__name__}")
    found: list[EvalMetric] = []
    for key, value in given.items():
        if isinstance(value, Mapping):  # per output: {output: {name: metric}}
            found.extend(_one(module, str(name), str(key), metric) for name, metric in value.items())
        else:
            found.append(_one(module, str(key), None, value))
    names = [m.name for m in found]
    named: list[EvalMetric] = []
    for m in found:
        if names.count(m.name) > 1 and m.output is not None:
            m = dataclasses.replace(m, name=f"{m.output}/{m.name}")
        named.append(m)
    final = [m.name for m in named]
    if "loss" in final or len(set(final)) != len(final):
        clash = sorted({n for n in final if final.count(n) > 1 or n == "loss"})
        raise ModelError(f"{module}: eval_metrics_fn names {clash} more than once ('loss' is the job's own)")
    return named
