"""The CRD derived from the typed spec: manifests/crd.yaml is what the code generates, every field's
type, bound, enum and default matches spec.py, and what the schema accepts parse_job accepts.

A small structural validator and defaulter below play the API server's part (types, enums, bounds,
patterns, required, unknown fields, defaults applied top-down); CEL rules are checked against the
parser's messages. ``kubernetes-validate``, when installed, also checks the CRD itself.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import re
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml

from job_builders import job_document

from elasticps.api import schema as crd_schema
from elasticps.api.fields import camel, field_info
from elasticps.api.parsing import SpecError, parse_job
from elasticps.api.spec import JobPhase, TrainingJobSpec, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests" / "crd.yaml"


def minimal() -> dict[str, Any]:
    return job_document({"data": {"training": "/data/mnist/train"}})


def spec_schema() -> dict[str, Any]:
    return crd_schema.openapi_schema()["properties"]["spec"]


# ---- the API server's part, in small -----------------------------------------------------------------


def go_search(pattern: str, value: str) -> bool:
    """``pattern`` searched as the API server's Go regexp does: there ``$`` is the end of the text,
    where Python's also matches before a final line break (``"\\n"`` would pass ``^x?$``)."""
    return re.search(pattern.replace("$", r"\Z"), value) is not None


def validate(schema: dict[str, Any], value: Any, where: str = "") -> list[str]:
    """Structural validation as the API server does it (strict about unknown fields, like kubectl)."""
    errors: list[str] = []
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return [f"{where}: must be an integer or a string"]
        if isinstance(value, str) and "pattern" in schema and not go_search(schema["pattern"], value):
            errors.append(f"{where}: does not match {schema['pattern']}")
        return errors
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    }
    if kind is None:
        assert schema.get("x-kubernetes-preserve-unknown-fields"), f"{where}: a node without a type"
        return []
    if not checks[kind](value):
        return [f"{where}: must be {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: not one of {schema['enum']}")
    if "minimum" in schema:
        low = schema["minimum"]
        if (value <= low) if schema.get("exclusiveMinimum") else (value < low):
            errors.append(f"{where}: below the minimum {low}")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{where}: above the maximum {schema['maximum']}")
    if kind == "number" and value != value:  # NaN: JSON cannot carry it
        errors.append(f"{where}: not a number")
    if kind == "string":
        if "pattern" in schema and not go_search(schema["pattern"], value):
            errors.append(f"{where}: does not match {schema['pattern']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{where}: longer than {schema['maxLength']}")
    if kind == "object":
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{where}.{key}: required")
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                errors += validate(properties[key], item, f"{where}.{key}")
            elif "additionalProperties" in schema:
                errors += validate(schema["additionalProperties"], item, f"{where}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and where != ".metadata":
                errors.append(f"{where}.{key}: unknown field")
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(schema["items"], item, f"{where}[{i}]")
    return errors


def default(schema: dict[str, Any], value: Any) -> Any:
    """Drops nulls, then applies defaults top-down, nested defaults after their parent's (as the
    API server's structural defaulting does)."""
    if isinstance(value, dict) and "properties" in schema:
        properties = schema["properties"]
        for key in [k for k, v in value.items() if v is None and k in properties]:
            del value[key]
        for key, prop in properties.items():
            if key not in value and "default" in prop:
                value[key] = copy.deepcopy(prop["default"])
        for key, item in value.items():
            if key in properties:
                default(properties[key], item)
    return value


def server_view(document: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The document as the API server would store it, and its validation errors."""
    full = crd_schema.openapi_schema()
    stored = default(full, copy.deepcopy(document))
    return stored, validate(full, stored)


def parses(document: dict[str, Any]) -> bool:
    try:
        parse_job(document)
    except SpecError:
        return False
    return True


# ---- the manifest ----------------------------------------------------------------------------------


def test_committed_manifest_is_what_the_code_generates() -> None:
    committed = yaml.safe_load(MANIFEST.read_text())
    assert committed == crd_schema.crd(), "run: python -m elasticps.api.schema > manifests/crd.yaml"


def test_rendered_text_round_trips() -> None:
    assert yaml.safe_load(crd_schema.render()) == crd_schema.crd()


def test_crd_names_and_version() -> None:
    crd = crd_schema.crd()
    assert (crd["apiVersion"], crd["kind"]) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "trainingjobs.elasticps.io"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("elasticps.io", "Namespaced")
    assert spec["names"]["kind"] == "TrainingJob"
    assert spec["names"]["plural"] == "trainingjobs"
    assert spec["names"]["shortNames"] == ["tj"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)


# ---- the spec, field by field ----------------------------------------------------------------------

TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


@pytest.mark.parametrize("field", dataclasses.fields(TrainingSpec), ids=lambda f: f.name)
def test_every_training_field(field: dataclasses.Field[Any]) -> None:
    prop = spec_schema()["properties"]["training"]["properties"][camel(field.name)]
    info = field_info(field)
    hint = typing.get_type_hints(TrainingSpec)[field.name]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):  # spelled as its values
        assert prop["type"] == "string" and prop["enum"] == [member.value for member in hint]
        assert prop["default"] == field.default.value
    else:
        assert prop["type"] == TYPES[hint]
        assert prop["default"] == field.default
        assert type(prop["default"]) is hint
    assert prop["description"] == info.help
    if info.minimum is None:
        assert "minimum" not in prop
    else:
        assert prop["minimum"] == info.minimum
        assert prop.get("exclusiveMinimum", False) is info.exclusive_minimum
    assert prop.get("maximum") == info.maximum


def test_training_schema_has_exactly_the_dataclass_fields() -> None:
    properties = spec_schema()["properties"]["training"]["properties"]
    assert list(properties) == [camel(f.name) for f in dataclasses.fields(TrainingSpec)]


def _walk(cls: type, node: dict[str, Any], where: str) -> list[tuple[str, dataclasses.Field[Any], Any, dict[str, Any]]]:
    """Every (path, field, type hint, schema node) of ``cls`` and the dataclasses inside it."""
    found = []
    hints = typing.get_type_hints(cls)
    assert list(node["properties"]) == [camel(f.name) for f in dataclasses.fields(cls)], where
    for field in dataclasses.fields(cls):
        path, prop = f"{where}.{camel(field.name)}", node["properties"][camel(field.name)]
        found.append((path, field, hints[field.name], prop))
        if dataclasses.is_dataclass(hints[field.name]):
            found += _walk(hints[field.name], prop, path)
    return found


FIELDS = _walk(TrainingJobSpec, spec_schema(), "spec")


@pytest.mark.parametrize("path,field,hint,prop", FIELDS, ids=[f[0] for f in FIELDS])
def test_every_spec_field(path: str, field: dataclasses.Field[Any], hint: Any, prop: dict[str, Any]) -> None:
    info = field_info(field)
    assert prop["description"] == info.help
    if isinstance(hint, type) and issubclass(hint, Enum):
        assert prop["type"] == "string"
        assert prop["enum"] == [m.value for m in hint]
        assert prop["default"] == field.default.value
    elif typing.get_origin(hint) is dict:
        assert prop["type"] == "object"
        if info.opaque:
            assert prop["x-kubernetes-preserve-unknown-fields"] is True
        else:
            assert prop["additionalProperties"]["x-kubernetes-int-or-string"] is True
    elif dataclasses.is_dataclass(hint):
        assert prop["type"] == "object"
    else:
        assert prop["type"] == TYPES[hint]
        if info.minimum is not None:
            assert prop["minimum"] == info.minimum
    has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    parent = spec_schema() if path.count(".") == 1 else None
    if parent is not None:
        assert (camel(field.name) in parent.get("required", [])) is not has_default


def test_required_fields_are_the_ones_without_defaults() -> None:
    spec = spec_schema()
    assert spec["required"] == ["model", "data"]
    assert spec["properties"]["model"]["required"] == ["modelDef"]
    assert "required" not in spec["properties"]["data"]  # no training data: a job that only predicts
    assert crd_schema.openapi_schema()["required"] == ["spec"]


def test_every_default_is_valid_against_its_own_schema() -> None:
    for path, _, _, prop in FIELDS:
        if "default" in prop:
            assert validate(prop, prop["default"], path) == []


def test_resources_take_quantities() -> None:
    limits = spec_schema()["properties"]["worker"]["properties"]["resources"]["properties"]["limits"]
    assert validate(limits, {"nvidia.com/gpu": 1, "cpu": "500m", "memory": "4Gi"}) == []
    assert validate(limits, {"cpu": "lots"}) != []
    assert validate(limits, {"cpu": True}) != []


# ---- the schema and parse_job agree ----------------------------------------------------------------


def test_minimal_job_defaulted_by_the_server_parses_to_the_same_job() -> None:
    stored, errors = server_view(minimal())
    assert errors == []
    assert parse_job(stored) == parse_job(minimal())
    # every field is filled in, as `kubectl get -o yaml` will show it
    assert stored["spec"]["ps"] == {
        "replicas": 1,
        "restartPolicy": "Always",
        "resources": {},
    }
    assert stored["spec"]["worker"]["restartPolicy"] == "OnFailure"
    assert set(stored["spec"]["training"]) == {camel(f.name) for f in dataclasses.fields(TrainingSpec)}
    assert set(stored["spec"]["runPolicy"]) == {"backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished",
                                                "cleanPodPolicy", "suspend"}


def test_partial_objects_get_the_same_defaults_as_parse_job() -> None:
    doc = minimal()
    doc["spec"]["ps"] = {"replicas": 2}
    doc["spec"]["training"] = {"useAsync": True, "numEpochs": None}
    doc["spec"]["runPolicy"] = {"cleanPodPolicy": "All"}
    stored, errors = server_view(doc)
    assert errors == []
    assert parse_job(stored) == parse_job(doc)


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return doc


# (path, value): the schema's verdict must match parse_job's (CEL-only rules are below).
AGREEMENT = [
    ("spec.training.getModelFrequency", 0),
    ("spec.training.getModelFrequency", 1),
    ("spec.training.minibatchSize", 0),
    ("spec.training.gradsToWait", -1),
    ("spec.training.gradsToWait", 0),
    ("spec.training.learningRate", -0.1),
    ("spec.training.learningRate", 0.0),
    ("spec.training.learningRate", 0.05),
    ("spec.training.taskTimeoutSeconds", 0),
    ("spec.training.taskTimeoutSeconds", 0.5),
    ("spec.training.learningRate", float("nan")),
    ("spec.training.numEpochs", 1.5),
    ("spec.training.numEpochs", 1_000_000),
    ("spec.training.numEpochs", 1_000_000_000_000),
    ("spec.training.getModelFrequency", 1_000_001),
    ("spec.worker.replicas", 10_000),
    ("spec.worker.replicas", 10_001),
    ("spec.training.numEpochs", "3"),
    ("spec.training.useAsync", "true"),
    ("spec.training.useAsynk", True),
    ("spec.runPolicy.ttlSecondsAfterFinished", -2),
    ("spec.runPolicy.ttlSecondsAfterFinished", -1),
    ("spec.runPolicy.cleanPodPolicy", "Some"),
    ("spec.runPolicy.cleanPodPolicy", "Running"),
    ("spec.runPolicy.suspend", 1),
    ("spec.worker.replicas", -1),
    ("spec.worker.replicas", 0),
    ("spec.worker.restartPolicy", "always"),
    ("spec.worker.restartPolicy", "ExitCode"),
    ("spec.worker.resources.limits", {"nvidia.com/gpu": 2}),
    ("spec.worker.resources.limits", {"cpu": [1]}),
    ("spec.worker.resources.limit", {}),
    ("spec.worker.template", {"spec": {"nodeSelector": {"gpu": "h100"}}}),
    ("spec.data.reader", "csv"),
    ("spec.data.reader", "npz"),
    ("spec.data.reader", "xml"),
    ("spec.data.reader", "my_readers.avro:AvroReader"),
    ("spec.data.reader", "my_readers.avro"),
    ("spec.data.reader", "my-readers:Avro"),
    ("spec.data.reader", "a:B:C"),
    ("spec.data.delimiter", ";"),
    ("spec.data.delimiter", "\t"),
    ("spec.data.delimiter", "\\t"),
    ("spec.data.delimiter", ";;"),
    ("spec.data.delimiter", '"'),
    ("spec.data.delimiter", "\n"),
    ("spec.data.reader", "m:C\n"),
    ("spec.data.header", False),
    ("spec.data.labelColumn", "label"),
    ("spec.data.featureColumns", "a,b"),
    ("spec.model.modelDef", " "),
    ("spec.model.params", {"hidden": [64, 32]}),
    ("spec.model.params", "x"),
    ("spec.image", 5),
    ("spec.replicas", 2),
    ("metadata.name", "a" * 40),
    ("metadata.name", "a" * 41),
    ("metadata.name", "MNIST"),
    ("metadata.name", "my-job-2"),
    ("metadata.name", "job-"),
]


@pytest.mark.parametrize("path,value", AGREEMENT, ids=[f"{p}={v!r}" for p, v in AGREEMENT])
def test_schema_and_parser_agree(path: str, value: Any) -> None:
    doc = _set(minimal(), path, value)
    _, errors = server_view(doc)
    assert (errors == []) == parses(doc), errors


def test_schema_and_parser_both_refuse_names_services_cannot_take() -> None:
    # Service names must start with a letter; the job name prefixes the PS Services' names.
    doc = _set(minimal(), "metadata.name", "1job")
    assert not parses(doc)
    assert server_view(doc)[1] != []


def test_what_the_schema_accepts_parse_job_accepts() -> None:
    full = {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "ctr", "namespace": "ml"},
        "spec": {
            "image": "registry.example/elasticps:1.2",
            "model": {"modelDef": "elasticps.backends.keras.zoo.mlp", "params": {"hidden": [64, 32]}},
            "data": {"training": "/d/train.npz", "validation": "/d/val.npz", "reader": "npz"},
            "training": {"useAsync": True, "lrStalenessModulation": True, "getModelFrequency": 4},
            "ps": {"replicas": 2, "restartPolicy": "ExitCode", "resources": {"requests": {"cpu": "2"}}},
            "worker": {"replicas": 4, "resources": {"limits": {"nvidia.com/gpu": 1}},
                       "template": {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}}},
            "runPolicy": {"backoffLimit": 6, "activeDeadlineSeconds": 3600, "ttlSecondsAfterFinished": 0,
                          "cleanPodPolicy": "Running", "suspend": True},
        },
    }
    stored, errors = server_view(full)
    assert errors == []
    assert parse_job(stored) == parse_job(full)


# ---- CEL rules: the cross-field checks of parse_job, with its messages ------------------------------


@pytest.mark.parametrize(
    "path,value,rules",
    [
        ("spec.ps.replicas", 0, crd_schema.SPEC_RULES),
        ("spec.data.training", "", crd_schema.SPEC_RULES),
        ("spec.prediction", {"model": "/m"}, crd_schema.SPEC_RULES),
        ("spec.prediction", {"data": "/p.npz"}, crd_schema.SPEC_RULES),
        ("spec.prediction", {"data": "/p.npz", "model": "/m"}, crd_schema.SPEC_RULES),
        ("spec.training", {"lrStalenessModulation": True}, crd_schema.TRAINING_RULES),
        ("spec.training", {"useLocking": True}, crd_schema.TRAINING_RULES),
        ("spec.training", {"getModelFrequency": 4}, crd_schema.TRAINING_RULES),
        ("spec.training", {"useAsync": False, "getModelFrequency": 2}, crd_schema.TRAINING_RULES),
    ],
)
def test_cel_rules_carry_parse_jobs_messages(path: str, value: Any, rules: list[dict[str, str]]) -> None:
    with pytest.raises(SpecError) as raised:
        parse_job(_set(minimal(), path, value))
    assert any(str(raised.value).startswith(rule["message"]) for rule in rules)


def test_cel_rules_are_attached() -> None:
    spec = spec_schema()
    assert spec["x-kubernetes-validations"] == crd_schema.SPEC_RULES
    assert spec["properties"]["training"]["x-kubernetes-validations"] == crd_schema.TRAINING_RULES
    assert any("oldSelf" in rule["rule"] for rule in crd_schema.SPEC_RULES)  # ps.replicas is immutable
    for rule in crd_schema.SPEC_RULES + crd_schema.TRAINING_RULES:
        assert rule["rule"].count("(") == rule["rule"].count(")")


# ---- status, subresources, printer columns ---------------------------------------------------------


def _at(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    node = schema
    for key in json_path.strip(".").split("."):
        node = node["properties"][key] if key in node.get("properties", {}) else node["additionalProperties"]
    return node


def test_status_declares_what_the_operator_writes() -> None:
    status = crd_schema.openapi_schema()["properties"]["status"]
    assert status["properties"]["phase"]["enum"] == [p.value for p in JobPhase]
    condition = status["properties"]["conditions"]["items"]["properties"]
    assert set(condition) == {"type", "status", "reason", "message", "lastTransitionTime", "lastUpdateTime"}
    for role in ("ps", "worker"):
        assert set(status["properties"]["replicaStatuses"]["properties"][role]["properties"]) == {
            "active", "succeeded", "failed"
        }
    for key in ("startTime", "completionTime", "modelVersion", "epoch", "progress", "metrics",
                "observedGeneration", "workerSelector", "readyWorkers", "restarts", "replacing"):
        assert key in status["properties"], key
    assert validate(status, {"progress": "45%", "metrics": {"accuracy": 0.9, "loss": 1}}) == []


def test_subresources() -> None:
    [version] = crd_schema.crd()["spec"]["versions"]
    assert version["subresources"]["status"] == {}
    scale = version["subresources"]["scale"]
    full = crd_schema.openapi_schema()
    assert scale["specReplicasPath"] == ".spec.worker.replicas"
    assert _at(full, scale["specReplicasPath"])["type"] == "integer"
    assert _at(full, scale["statusReplicasPath"])["type"] == "integer"
    assert _at(full, scale["labelSelectorPath"])["type"] == "string"


def test_printer_columns_point_at_declared_fields() -> None:
    [version] = crd_schema.crd()["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns] == [
        "Phase", "Reason", "Mode", "Workers", "PS", "Version", "Iterations", "Progress", "Accuracy", "Age", "Message"
    ]
    assert [c["name"] for c in columns if c.get("priority")] == ["Iterations"]  # -o wide: empty but for Hop
    full = crd_schema.openapi_schema()
    for column in columns:
        if column["jsonPath"].startswith(".status."):
            assert _at(full, column["jsonPath"])["type"] == column["type"]


def test_with_kubernetes_validate_when_installed() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(crd_schema.crd(), "1.30", strict=True)
