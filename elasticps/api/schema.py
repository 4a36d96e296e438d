"""The TrainingJob CustomResourceDefinition, derived from the typed spec: ``manifests/crd.yaml``.

``openapi_schema()`` walks the dataclasses of ``spec.py`` and turns each field's :class:`FieldInfo`
into OpenAPI: help -> description, minimum (and exclusiveMinimum), maximum, Enum types -> ``enum``, defaults
-> ``default``, fields without a default -> ``required``; ``opaque`` mappings (a pod template, model
params) are kept as given (``x-kubernetes-preserve-unknown-fields``); string mappings (resources)
take strings or integers, like Kubernetes quantities. A bound or a default is therefore written once,
in ``spec.py``, and the YAML parser, the flags and the API server all enforce the same one.

What the walk cannot see is declared here, next to what it mirrors:
- the cross-field rules of ``parsing._check_cross_fields`` as CEL ``x-kubernetes-validations``
  (Kubernetes 1.25+), plus one rule only the API server can check: ``spec.ps.replicas`` cannot
  change on a live job (variables are sharded over the PS by a hash mod their number);
- ``metadata.name``: at most 40 characters (pod names add ``-worker-N``) and, stricter than
  ``parse_job``, starting with a letter, because the PS Services are named after the job and
  Service names must be DNS-1035 labels;
- the ``status`` the operator writes (every key declared, so no status patch is pruned), the
  status and scale subresources, and the printer columns of ``kubectl get tj``.

Object-valued fields with a default carry ``default: {}`` (or the few values where the field's
default differs from its class's, e.g. ``ps.restartPolicy: Always``), so the API server fills in
every nested default exactly as ``parse_job`` does. Regenerate the manifest with
``python -m elasticps.api.schema > manifests/crd.yaml``; ``tests/api/test_schema.py`` fails when the
committed file and this code disagree.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from enum import Enum
from typing import Any

import yaml

from elasticps.api.fields import FieldInfo, camel, field_info
from elasticps.api.graph import KINDS as GRAPH_KINDS
from elasticps.api.modes import COMPENSATION_SYNC, LOCAL_SGD_ONLY, LOCAL_SGD_SYNC, OVERLAP_PULL_SYNC
from elasticps.api.spec import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAME,
    VERSION,
    DataSpec,
    DecentralizedSpec,
    JobPhase,
    READER_PATTERN,
    SCALE_DECENTRALIZED,
    ModelSpec,
    Resources,
    TrainingJobSpec,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
MAX_NAME_LENGTH = 40
# DNS-1035 label: the job's name begins the names of its Services, which must start with a letter.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Kubernetes' own pattern for a resource.Quantity (as controller-gen writes it).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DELIMITER_PATTERN = r'^([^"\r\n]|\\t)?$'
_NOT_BLANK = r"\S"  # unanchored: at least one non-space character, as parse_job's .strip() check

# Extra constraints on single fields that the walk cannot infer from the type and FieldInfo.
_FIELD_EXTRAS: dict[tuple[type, str], dict[str, Any]] = {
    (ModelSpec, "model_def"): {"pattern": _NOT_BLANK},
    (DataSpec, "reader"): {"pattern": READER_PATTERN},  # as spec.reader_problem
    (DataSpec, "delimiter"): {"pattern": DELIMITER_PATTERN},  # as spec.delimiter_problem
    (DecentralizedSpec, "graph"): {"enum": list(GRAPH_KINDS)},  # as spec.graph_problem
}
_QUANTITY_MAPS = {(Resources, "requests"), (Resources, "limits")}

# CEL rules mirroring parsing._check_cross_fields (same messages), attached to the object they read.
SPEC_RULES: list[dict[str, str]] = [
    {
        "rule": "(has(self.strategy) && self.strategy == 'decentralized') || !has(self.ps) || !has(self.ps.replicas)"
        " || self.ps.replicas >= 1",
        "message": "spec.ps.replicas: must be >= 1",
    },
    {
        "rule": "!has(self.strategy) || self.strategy != 'decentralized' || !has(oldSelf.worker) || !has(self.worker)"
        " || self.worker.replicas == oldSelf.worker.replicas",
        "message": f"spec.worker.replicas: {SCALE_DECENTRALIZED}",
    },
    {
        "rule": "!has(oldSelf.ps) || !has(self.ps) || self.ps.replicas == oldSelf.ps.replicas",
        "message": "spec.ps.replicas: cannot change while the job exists (variables are sharded over the PS)",
    },
]
# spec.prediction (parsing._check_prediction); blank-only values are left to the parser (no regex
# on unbounded strings: its estimated cost could exceed the API server's budget for a rule).
_HAS_OUTPUT = "(has(self.output) && self.output != '')"
_HAS_TRAINING = "(has(self.data.training) && self.data.training != '')"
_PREDICTS = "(has(self.prediction) && has(self.prediction.data) && self.prediction.data != '')"
_PREDICTS_WITH_MODEL = "(has(self.prediction) && has(self.prediction.model) && self.prediction.model != '')"
SPEC_RULES += [
    {
        "rule": f"{_HAS_TRAINING} || {_PREDICTS_WITH_MODEL}",
        "message": "spec.data.training: must not be empty (or set spec.prediction.model and "
        "spec.prediction.data to predict with an exported model)",
    },
    {
        "rule": f"!{_PREDICTS_WITH_MODEL} || {_PREDICTS}",
        "message": "spec.prediction.model: needs spec.prediction.data (the records to predict)",
    },
    {
        "rule": f"!{_PREDICTS} || {_HAS_OUTPUT}",
        "message": "spec.output: required with spec.prediction (the predictions go to <output>/predictions/)",
    },
    *(
        {
            "rule": f"!{_PREDICTS_WITH_MODEL} || !has(self.data.{field}) || self.data.{field} == ''",
            "message": f"spec.data.{field}: must be empty when spec.prediction.model is set "
            "(the job predicts with that model and trains nothing)",
        }
        for field in ("training", "validation")
    ),
]
TRAINING_RULES: list[dict[str, str]] = [
    {
        "rule": "!has(self.lrStalenessModulation) || !self.lrStalenessModulation"
        " || (has(self.useAsync) && self.useAsync)",
        "message": "spec.training.lrStalenessModulation: needs useAsync: true",
    },
    {
        "rule": "!has(self.stalenessCompensation) || self.stalenessCompensation == 'momentumCorrection'"
        " || (has(self.useAsync) && self.useAsync)",
        "message": f"spec.training.stalenessCompensation: {COMPENSATION_SYNC}",
    },
    {
        "rule": "!has(self.useLocking) || !self.useLocking || (has(self.useAsync) && self.useAsync)",
        "message": "spec.training.useLocking: needs useAsync: true (sync already applies one update at a time)",
    },
    {
        "rule": "!has(self.overlapPull) || !self.overlapPull || (has(self.useAsync) && self.useAsync)",
        "message": f"spec.training.overlapPull: {OVERLAP_PULL_SYNC}",
    },
    {
        "rule": "!has(self.getModelFrequency) || self.getModelFrequency <= 1 || (has(self.useAsync) && self.useAsync)",
        "message": "spec.training.getModelFrequency: needs useAsync: true"
        " (local steps between pulls are asynchronous SGD)",
    },
    {
        "rule": "!has(self.localSGDSteps) || self.localSGDSteps == 0 || !has(self.useAsync) || !self.useAsync",
        "message": f"spec.training.localSGDSteps: {LOCAL_SGD_SYNC}",
    },
    *(
        {
            "rule": f"!has(self.{field}) || self.{field} == {off} || (has(self.localSGDSteps) && self.localSGDSteps > 0)",
            "message": f"spec.training.{field}: {LOCAL_SGD_ONLY}",
        }
        for field, off in (("localSGDWarmupSteps", "0"), ("adaptiveLocalSGD", "false"), ("localSGDInfLoss", "0.0"))
    ),
]


def openapi_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the TrainingJob: spec from the dataclasses, status declared here."""
    spec = {
        "description": "What to train and how: the TrainingJob's spec (parsed by elasticps.api.parsing).",
        **object_schema(TrainingJobSpec),
        "x-kubernetes-validations": SPEC_RULES,
    }
    spec["properties"]["training"]["x-kubernetes-validations"] = TRAINING_RULES
    return {
        "type": "object",
        "description": "A TrainingJob: parameter-server training of one model, on PS pods and worker pods.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": MAX_NAME_LENGTH, "pattern": NAME_PATTERN},
                },
            },
            "spec": spec,
            "status": status_schema(),
        },
    }


def object_schema(cls: type) -> dict[str, Any]:
    """The schema of a spec dataclass: one property per field, camelCase, in declaration order."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in dataclasses.fields(cls):
        info = field_info(field)
        key = camel(field.name)
        prop = {"description": info.help, **_value_schema(hints[field.name], info, (cls, field.name))}
        prop["description"] = info.help  # over the class's docstring
        default = _default(field)
        if default is not dataclasses.MISSING:
            prop["default"] = default
        elif field.default_factory is dataclasses.MISSING:
            required.append(key)
        properties[key] = prop
    schema: dict[str, Any] = {}
    if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):  # not the generated signature
        schema["description"] = " ".join(cls.__doc__.split())
    schema["type"] = "object"
    if required:
        schema["required"] = required
    schema["properties"] = properties
    return schema


def _value_schema(hint: Any, info: FieldInfo, where: tuple[type, str]) -> dict[str, Any]:
    if typing.get_origin(hint) is dict:
        if info.opaque:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        item: dict[str, Any] = {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
        }
        if where in _QUANTITY_MAPS:
            item["pattern"] = QUANTITY_PATTERN
        return {"type": "object", "additionalProperties": item}
    if isinstance(hint, type) and issubclass(hint, Enum):
        return {"type": "string", "enum": [member.value for member in hint]}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return object_schema(hint)
    scalar = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(hint)
    if scalar is None:
        raise TypeError(f"{where[0].__name__}.{where[1]}: no schema for type {hint!r}")
    schema: dict[str, Any] = {"type": scalar}
    if info.minimum is not None:
        schema["minimum"] = int(info.minimum) if hint is int else float(info.minimum)
        if info.exclusive_minimum:
            schema["exclusiveMinimum"] = True
    if info.maximum is not None:
        schema["maximum"] = int(info.maximum) if hint is int else float(info.maximum)
    schema.update(_FIELD_EXTRAS.get(where, {}))
    return schema


def _default(field: dataclasses.Field[Any]) -> Any:
    """The field's default as YAML, or MISSING where the schema leaves the field out when absent.

    Empty mappings get no default (absent and ``{}`` parse alike); a dataclass default becomes the
    values where it differs from its class's own field defaults, so nested defaults still apply.
    """
    if field.default is not dataclasses.MISSING:
        return _plain(field.default)
    if field.default_factory is dataclasses.MISSING:
        return dataclasses.MISSING
    value = field.default_factory()
    if dataclasses.is_dataclass(value):
        return _non_default_values(value)
    return _plain(value) if value else dataclasses.MISSING


def _non_default_values(instance: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if field.default is not dataclasses.MISSING:
            own_default: Any = field.default
        elif field.default_factory is not dataclasses.MISSING:
            own_default = field.default_factory()
        else:
            own_default = dataclasses.MISSING
        if value == own_default:
            continue
        values[camel(field.name)] = (
            _non_default_values(value) if dataclasses.is_dataclass(value) else _plain(value)
        )
    return values


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


# ---- status -----------------------------------------------------------------------------------------


def _counts(role: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"{role} pods by state",
        "properties": {
            "active": {"type": "integer", "description": "pods pending or running"},
            "succeeded": {"type": "integer", "description": "pods that exited 0"},
            "failed": {"type": "integer", "description": "pods that failed"},
        },
    }


def _time(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "date-time", "description": description}


def status_schema() -> dict[str, Any]:
    """Every key the operator's planner writes (``elasticps.planning``)."""
    condition = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {
                "type": "string",
                "description": "Created, Running, Restarting, Succeeded, Suspended, Failed, Unschedulable, CannotStart, "
                "ShardsConsistent, GradsToWaitClamped, TrainingHealthy, RolledBack or CheckpointFailing",
            },
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string", "description": "CamelCase, machine-readable"},
            "message": {"type": "string", "description": "for people"},
            "lastTransitionTime": _time("when status last changed"),
            "lastUpdateTime": _time("when status, reason or message last changed"),
        },
    }
    return {
        "type": "object",
        "description": "Written by the operator; read-only for users (the status subresource).",
        "properties": {
            "phase": {
                "type": "string",
                "enum": [phase.value for phase in JobPhase],
                "description": "the type of the latest true condition, or Pending while a job that never ran waits on a pod that cannot be scheduled or start",
            },
            "reason": {
                "type": "string",
                "description": "why the job is where it is, at a glance: a failed job's reason, else the reason of "
                "a true CannotStart, Unschedulable or Restarting condition or of a false TrainingHealthy (Diverged, "
                "Stalled; a job that succeeded shows that too); none while it trains as it should",
            },
            "message": {"type": "string", "description": "that condition's message (a failed replica's own line)"},
            "mode": {"type": "string", "description": "training mode, e.g. Sync, Async+StalenessLR, Async+SSP4"},
            "conditions": {
                "type": "array",
                "items": condition,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "replicaStatuses": {
                "type": "object",
                "properties": {"ps": _counts("PS"), "worker": _counts("worker"),
                               "coordinator": _counts("decentralized coordinator")},
            },
            "startTime": _time("when the job (last) started: creation or resume; activeDeadlineSeconds counts from here"),
            "completionTime": _time("when the job succeeded or failed; ttlSecondsAfterFinished counts from here"),
            "modelVersion": {
                "type": "integer",
                "description": "updates applied by the PS (from the coordinator): the oldest shard's version; "
                "decentralized: the highest iteration a worker reached",
            },
            "iterations": {
                "type": "string",
                "description": "decentralized: the lowest and highest of the workers' latest iterations (low-high)",
            },
            "shardVersions": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "every PS shard's model version, PS 0 first (from the coordinator)",
            },
            "liveWorkers": {
                "type": "integer",
                "description": "workers the coordinator heard from within the task timeout",
            },
            "gradsToWait": {
                "type": "integer",
                "description": "sync: gradients a round averages now (gradsToWait, cut down to the live workers)",
            },
            "epoch": {"type": "integer", "description": "current epoch, from 0"},
            "progress": {
                "type": "string",
                "description": "records trained and predicted over records to train and predict, e.g. 45%",
            },
            "metrics": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "description": "latest evaluation metrics and training loss",
            },
            "output": {
                "type": "object",
                "description": "the newest export of the model (spec.output), from the coordinator",
                "properties": {
                    "path": {"type": "string", "description": "where it is: spec.output for the final model, "
                             "<output>/versions/<version> for a periodic one"},
                    "modelVersion": {"type": "integer", "description": "the model version exported"},
                    "final": {"type": "boolean", "description": "the job's final model"},
                },
            },
            "predictions": {
                "type": "object",
                "description": "batch prediction (spec.prediction), from the coordinator",
                "properties": {
                    "path": {"type": "string", "description": "<output>/predictions: one part-<start>-<end>.jsonl per task"},
                    "records": {"type": "integer", "description": "records whose predictions are written"},
                    "total": {"type": "integer", "description": "records of spec.prediction.data"},
                },
            },
            "observedGeneration": {"type": "integer", "description": "metadata.generation the status reflects"},
            "workerSelector": {"type": "string", "description": "label selector of the worker pods (scale subresource)"},
            "readyWorkers": {"type": "integer", "description": "worker pods ready"},
            "workers": {"type": "string", "description": "ready/desired worker pods"},
            "ps": {"type": "string", "description": "ready/desired PS pods"},
            "restarts": {"type": "integer", "description": "pod replacements, counted against runPolicy.backoffLimit"},
            "replacing": {
                "type": "array",
                "description": "pods deleted to be replaced; each is created again once its old pod is gone",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}, "uid": {"type": "string"}},
                },
            },
        },
    }


# ---- the CRD -----------------------------------------------------------------------------------------

# ``kubectl get tj``: the columns of priority 0 always, those of priority 1 with ``-o wide``.
PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason",
     "description": "a finished job's reason, or why it cannot start, be scheduled or is restarting"},
    {"name": "Mode", "type": "string", "jsonPath": ".status.mode"},
    {"name": "Workers", "type": "string", "jsonPath": ".status.workers", "description": "ready/desired"},
    {"name": "PS", "type": "string", "jsonPath": ".status.ps", "description": "ready/desired"},
    {"name": "Version", "type": "integer", "jsonPath": ".status.modelVersion"},
    {"name": "Iterations", "type": "string", "jsonPath": ".status.iterations", "priority": 1,
     "description": "decentralized: the workers' lowest-highest iteration"},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress"},
    {"name": "Accuracy", "type": "number", "jsonPath": ".status.metrics.accuracy",
     "description": "the latest evaluation's accuracy"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "description": "the reason's message"},
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) of ``trainingjobs.elasticps.io``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "elasticps"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
                "categories": ["elasticps"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.worker.replicas",
                            "statusReplicasPath": ".status.replicaStatuses.worker.active",
                            "labelSelectorPath": ".status.workerSelector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render() -> str:
    """``manifests/crd.yaml``'s text."""
    header = (
        f"# The {API_VERSION} {KIND} CustomResourceDefinition. Generated from elasticps/api/spec.py by\n"
        "# `python -m elasticps.api.schema > manifests/crd.yaml` (make manifests): do not edit.\n"
    )
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render())
