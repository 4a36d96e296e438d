"""Parses and validates a TrainingJob document, once, at the edge.

Callers: ``elasticps run`` (a YAML file) and the operator (the custom object's body). Every problem
raises :class:`SpecError` with one readable line that names the field, e.g.
``spec.training.getModelFrequency: must be >= 1, got 0``. Unknown fields are errors too: a typo in
a YAML key must not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from elasticps.api.fields import camel, check_bounds, field_info
from elasticps.api.graph import GraphError
from elasticps.api.modes import TrainingMode
from elasticps.api.spec import API_VERSION, KIND, PSReplicaSpec, Strategy, TrainingJob, TrainingJobSpec, TrainingSpec

T = TypeVar("T")

# Also the prefix of the PS Services' names, which must start with a letter.
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SpecError(ValueError):
    """A TrainingJob that cannot run; the message is one line naming the field."""


def load_job_file(path: Path) -> TrainingJob:
    """Reads and parses a TrainingJob YAML file."""
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise SpecError(f"{path}: {problem}{where}") from None
    if len(documents) != 1:
        raise SpecError(f"{path}: expected one TrainingJob document, found {len(documents)}")
    try:
        return parse_job(documents[0])
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None


def parse_job(document: Any) -> TrainingJob:
    """Parses a TrainingJob object (a dict as from YAML or the Kubernetes API)."""
    if not isinstance(document, dict):
        raise SpecError("a TrainingJob must be a mapping")
    if document.get("apiVersion") != API_VERSION:
        raise SpecError(f"apiVersion: must be {API_VERSION}, got {document.get('apiVersion')!r}")
    if document.get("kind") != KIND:
        raise SpecError(f"kind: must be {KIND}, got {document.get('kind')!r}")
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        raise SpecError("metadata: required")
    name = metadata.get("name")
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > 40:
        raise SpecError(
            f"metadata.name: must be a DNS label of at most 40 characters starting with a letter "
            f"(lower-case letters, digits, '-'), got {name!r}"
        )
    namespace = metadata.get("namespace", "default")
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise SpecError(f"metadata.namespace: must be a DNS label, got {namespace!r}")
    if "spec" not in document:
        raise SpecError("spec: required")
    spec = parse_object(TrainingJobSpec, document["spec"], "spec")
    _check_cross_fields(spec)
    return TrainingJob(name=name, namespace=namespace, spec=spec)


def _check_cross_fields(spec: TrainingJobSpec) -> None:
    if spec.strategy is Strategy.DECENTRALIZED:
        _check_decentralized(spec)
    elif spec.ps.replicas < 1:
        raise SpecError(f"spec.ps.replicas: must be >= 1, got {spec.ps.replicas}")
    for field, why in TrainingMode.of(spec.training).problems():
        raise SpecError(f"spec.training.{field}: {why}")
    if not spec.model.model_def.strip():
        raise SpecError("spec.model.modelDef: must not be empty")
    if spec.worker.min_replicas > spec.worker.replicas:
        raise SpecError(
            f"spec.worker.minReplicas: must be at most spec.worker.replicas ({spec.worker.replicas}), "
            f"got {spec.worker.min_replicas}"
        )
    _check_prediction(spec)
    if spec.training.export_steps and not spec.output.strip():
        raise SpecError("spec.training.exportSteps: exports need spec.output (where to write them)")
    if spec.output != spec.output.strip():
        raise SpecError(f"spec.output: must not start or end with blanks, got {spec.output!r}")


# Settings of the PS's update rules, which a decentralized job (no PS) cannot honour.
_PS_ONLY_TRAINING = (
    "use_async", "lr_staleness_modulation", "use_locking", "overlap_pull", "get_model_frequency",
    "local_sgd_steps", "grads_to_wait", "sync_version_tolerance", "checkpoint_steps", "split_bytes",
)


def _check_decentralized(spec: TrainingJobSpec) -> None:
    """The graph trains on the job's workers and Hop's settings fit together; no PS setting is
    silently ignored."""
    if dataclasses.replace(spec.ps, replicas=PSReplicaSpec().replicas) != PSReplicaSpec() or spec.ps.replicas > 1:
        raise SpecError("spec.ps: spec.strategy decentralized runs no parameter servers; remove spec.ps")
    defaults = TrainingSpec()
    for name in _PS_ONLY_TRAINING:
        if getattr(spec.training, name) != getattr(defaults, name):
            raise SpecError(
                f"spec.training.{camel(name)}: a setting of the parameter servers; spec.strategy decentralized has none"
            )
    hop = spec.decentralized
    workers = spec.worker.replicas
    try:
        graph = hop.graph_for(workers)
    except GraphError as err:
        field = "weights" if hop.weights.strip() and "weight" in str(err) else "neighbours" if hop.neighbours.strip() else "graph"
        raise SpecError(f"spec.decentralized.{field}: {err} ({workers} workers)") from None
    fewest = min((len(graph.in_neighbours(i)) for i in range(graph.size)), default=0)
    if hop.backup_workers and hop.staleness:
        raise SpecError("spec.decentralized.backupWorkers: backup workers and staleness are two rules: set one of them")
    if hop.backup_workers and hop.backup_workers >= fewest:
        raise SpecError(
            f"spec.decentralized.backupWorkers: must be less than the fewest in-neighbours of a worker "
            f"({fewest} in this graph), got {hop.backup_workers}: a worker would never wait for anyone"
        )
    if hop.skip_max_jump:
        if not (hop.backup_workers or hop.staleness):
            raise SpecError(
                "spec.decentralized.skipMaxJump: needs backupWorkers or staleness: under the standard rule no "
                "neighbour runs more than one iteration ahead, so nobody ever lags enough to skip"
            )
        if hop.skip_trigger > hop.max_iteration_gap:
            raise SpecError(
                f"spec.decentralized.skipTrigger: a neighbour is never more than maxIterationGap "
                f"({hop.max_iteration_gap}) iterations ahead, so a trigger of {hop.skip_trigger} never fires"
            )


def _check_prediction(spec: TrainingJobSpec) -> None:
    """A job trains (spec.data.training), predicts with an exported model (spec.prediction.model),
    or both in turn (training data and spec.prediction.data); predictions need spec.output."""
    prediction = spec.prediction
    for field, value in (("data", prediction.data), ("model", prediction.model)):
        if value != value.strip():
            raise SpecError(f"spec.prediction.{field}: must not start or end with blanks, got {value!r}")
    if prediction.model and not prediction.data:
        raise SpecError("spec.prediction.model: needs spec.prediction.data (the records to predict)")
    if prediction.data and not spec.output.strip():
        raise SpecError("spec.output: required with spec.prediction (the predictions go to <output>/predictions/)")
    if prediction.model:
        for field, value in (("training", spec.data.training), ("validation", spec.data.validation)):
            if value.strip():
                raise SpecError(
                    f"spec.data.{field}: must be empty when spec.prediction.model is set "
                    "(the job predicts with that model and trains nothing)"
                )
        if spec.training.export_steps:
            raise SpecError("spec.training.exportSteps: a job that predicts with spec.prediction.model trains nothing to export")
    elif not spec.data.training.strip():
        raise SpecError(
            "spec.data.training: must not be empty (or set spec.prediction.model and spec.prediction.data "
            "to predict with an exported model)"
        )


def parse_object(cls: type[T], data: Any, where: str) -> T:
    """Builds dataclass ``cls`` from a mapping with camelCase keys, checking types and bounds."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: must be a mapping, got {_kind(data)}")
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    fields = {camel(f.name): f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(fields))})")
    values: dict[str, Any] = {}
    for key, field in fields.items():
        path = f"{where}.{key}"
        if key not in data or data[key] is None:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise SpecError(f"{path}: required")
            continue
        value = _parse_value(hints[field.name], data[key], path, field)
        check = field_info(field).check
        problem = check(value) if check is not None else None
        if problem is not None:
            raise SpecError(f"{path}: {problem}")
        values[field.name] = value
    return cls(**values)


def _parse_value(hint: Any, value: Any, where: str, field: dataclasses.Field[Any]) -> Any:
    info = field_info(field)
    origin = typing.get_origin(hint)
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(f"{where}: must be a mapping, got {_kind(value)}")
        if not info.opaque:
            for key, item in value.items():
                if not isinstance(item, (str, int, float)) or isinstance(item, bool):
                    raise SpecError(f"{where}.{key}: must be a string or number, got {_kind(item)}")
            return {str(k): str(v) for k, v in value.items()}
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"{where}: union fields are not supported")
    if isinstance(hint, type) and issubclass(hint, Enum):
        allowed = [m.value for m in hint]
        if value not in allowed:
            raise SpecError(f"{where}: must be one of {', '.join(allowed)}, got {value!r}")
        return hint(value)
    if dataclasses.is_dataclass(hint):
        return parse_object(typing.cast(type[Any], hint), value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{where}: must be true or false, got {value!r}")
        return value
    if hint is int or hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{where}: must be a number, got {value!r}")
        if hint is int and not float(value).is_integer():
            raise SpecError(f"{where}: must be an integer, got {value!r}")
        number = hint(value)
        try:
            check_bounds(number, info, where)
        except ValueError as err:
            raise SpecError(str(err)) from None
        return number
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(f"{where}: must be a string, got {_kind(value)}")
        return value
    raise TypeError(f"{where}: unsupported field type {hint!r}")


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)
