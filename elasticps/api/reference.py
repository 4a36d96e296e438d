"""docs/trainingjob.md, the TrainingJob reference, rendered from the CRD's OpenAPI schema: pure.

Callers: ``python -m elasticps.api.reference > docs/trainingjob.md`` (``make docs``) and
``tests/api/test_reference.py`` (the committed page must equal a fresh rendering, as
``manifests/crd.yaml`` must equal ``schema.render()``). The schema is derived from the spec's
dataclasses (``schema.openapi_schema``), so a field's type, default, minimum, enum and help text are
written once, in ``elasticps/api/spec.py``, and this page cannot drift from what the API server
enforces.

Layout: one section per object (``spec``, ``spec.model`` ... ``status.conditions[]``), each a table
of its fields; an object field links to its own section, which follows its parent's in the order
of the schema. CEL rules (``x-kubernetes-validations``) are listed under the object they guard.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from elasticps.api.schema import PRINTER_COLUMNS, QUANTITY_PATTERN, openapi_schema
from elasticps.api.spec import API_VERSION, KIND, PLURAL, SHORT_NAME

HEADER = f"""# {KIND} reference

<!-- Generated from elasticps/api/spec.py by `python -m elasticps.api.reference > docs/trainingjob.md`
     (make docs); tests/api/test_reference.py checks it is current. Do not edit. -->

`apiVersion: {API_VERSION}`, `kind: {KIND}` (plural `{PLURAL}`, short name `{SHORT_NAME}`), namespaced.
The API server checks every field below against the CRD's schema (`manifests/crd.yaml`): a job with a
wrong type, a value outside its bounds or its enum, or breaking a rule is refused at
`kubectl apply` with the field's path. Defaults are filled in by the API server as the job is stored.
"""


# Descriptions of fields the schema leaves bare (the CRD's own text is not changed for the page's sake).
NOTES = {
    "metadata.name": "the job's name; its pods are `{name}-ps-{i}` and `{name}-worker-{i}`, PS i is reached at "
    "`{name}-ps-{i}.{namespace}.svc:2222`",
    "status.conditions": "one entry per type, Kubeflow style",
    "status.conditions[].status": "whether the condition holds",
    "status.replicaStatuses": "pods of each role by state",
    "status.replacing[].name": "the pod's name",
    "status.replacing[].uid": "the uid of the pod being replaced",
}
COLUMN_NOTES = {".metadata.creationTimestamp": "time since the job was created"}


def render() -> str:
    """The page's text."""
    root = openapi_schema()
    out = [HEADER, _columns()]
    out += _object("metadata", root["properties"]["metadata"], heading="metadata")
    out += _object("spec", root["properties"]["spec"])
    out += _object("status", root["properties"]["status"])
    return "\n".join(out).rstrip() + "\n"


def _columns() -> str:
    rows = ["## `kubectl get trainingjobs`", "", "| Column | From | Meaning |", "|---|---|---|"]
    status = openapi_schema()["properties"]["status"]["properties"]
    for column in PRINTER_COLUMNS:
        path = str(column["jsonPath"])
        field = status.get(path.removeprefix(".status."), {}) if path.startswith(".status.") else {}
        meaning = COLUMN_NOTES.get(path) or field.get("description") or column.get("description", "")
        rows.append(f"| {column['name']} | `{path}` | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def _object(path: str, schema: dict[str, Any], heading: str | None = None) -> list[str]:
    """The section of the object at ``path``, then the sections of the objects inside it."""
    lines = [f"## `{heading or path}`", ""]
    about = schema.get("description") or NOTES.get(path.removesuffix("[]"), "")
    if about:
        lines += [_sentence(about), ""]
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    nested: list[tuple[str, dict[str, Any]]] = []
    if properties:
        lines += ["| Field | Type | Default | Constraints | Description |", "|---|---|---|---|---|"]
        for name, prop in properties.items():
            child = f"{path}.{name}"
            inner = _inner_object(prop)
            child_path = child + ("[]" if prop.get("type") == "array" else "")
            if inner is not None:
                nested.append((child_path, inner))
                field = f"[`{name}`](#{_anchor(child_path)})"
            else:
                field = f"`{name}`"
            lines.append(
                f"| {field} | {_type(prop)} | {_default(prop)} | {_constraints(prop, name in required)} "
                f"| {_cell(prop.get('description') or NOTES.get(child, ''))} |"
            )
        lines.append("")
    rules = schema.get("x-kubernetes-validations", [])
    if rules:
        lines += ["Rules (checked by the API server):", ""]
        lines += [f"- {_cell(rule['message'])} (`{rule['rule']}`)" for rule in rules]
        lines.append("")
    for child_path, inner in nested:
        lines += _object(child_path, inner)
    return lines


def _inner_object(prop: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a field leads to (itself, or its array's items), when it has fields."""
    if prop.get("type") == "object" and prop.get("properties"):
        return prop
    items = prop.get("items")
    if prop.get("type") == "array" and isinstance(items, dict) and items.get("properties"):
        return {"description": prop.get("description", ""), **items}
    return None


def _type(prop: dict[str, Any]) -> str:
    if prop.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    kind = prop.get("type", "")
    if kind == "array":
        items = prop.get("items", {})
        return f"array of {items.get('type', 'any')}"
    if kind == "object" and "additionalProperties" in prop:
        value = prop["additionalProperties"]
        quantity = value.get("x-kubernetes-int-or-string")
        return f"map of string to {'quantity' if quantity else value.get('type', 'any')}"
    if prop.get("format"):
        return f"{kind} ({prop['format']})"
    return str(kind)


def _default(prop: dict[str, Any]) -> str:
    return f"`{json.dumps(prop['default'])}`" if "default" in prop else ""


def _constraints(prop: dict[str, Any], required: bool) -> str:
    parts = ["required"] if required else []
    if "minimum" in prop:
        parts.append(f"> {prop['minimum']}" if prop.get("exclusiveMinimum") else f">= {prop['minimum']}")
    if "maximum" in prop:
        parts.append(f"<= {prop['maximum']}")
    if "maxLength" in prop:
        parts.append(f"at most {prop['maxLength']} characters")
    if "enum" in prop:
        parts.append("one of " + ", ".join(f"`{v}`" for v in prop["enum"]))
    pattern = prop.get("pattern")
    if pattern == r"\S":
        parts.append("not blank")
    elif pattern:
        parts.append(f"matches `{pattern}`")
    value = prop.get("additionalProperties")
    if isinstance(value, dict) and value.get("pattern") == QUANTITY_PATTERN:
        parts.append("values are Kubernetes quantities (`2`, `500m`, `4Gi`)")
    return _cell("; ".join(parts))


def _sentence(text: str) -> str:
    text = " ".join(str(text).split())
    return (text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")) if text else ""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", r"\|")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than - and _ dropped."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


if __name__ == "__main__":
    sys.stdout.write(render())
