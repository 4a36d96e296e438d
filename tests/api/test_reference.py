"""docs/trainingjob.md is the reference rendered from the CRD schema, and it covers every field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from elasticps.api.reference import render
from elasticps.api.schema import openapi_schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "trainingjob.md"


def test_the_committed_page_is_current() -> None:
    assert DOC.read_text() == render(), "docs/trainingjob.md is stale: run `make docs`"


def _fields(schema: dict[str, Any], path: str) -> list[tuple[str, str]]:
    found = []
    for name, prop in schema.get("properties", {}).items():
        found.append((path, name))
        inner = prop.get("items", prop) if prop.get("type") == "array" else prop
        found += _fields(inner, f"{path}.{name}" + ("[]" if prop.get("type") == "array" else ""))
    return found


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## `([^`]+)`$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_field_is_in_its_section_with_its_default_and_constraints() -> None:
    text = render()
    sections = _sections(text)
    root = openapi_schema()["properties"]
    for top in ("spec", "status"):
        for path, name in _fields(root[top], top):
            assert path in sections, path
            assert re.search(rf"^\| (\[)?`{name}`", sections[path], flags=re.M), f"{path}.{name}"
    training = sections["spec.training"]
    assert "| `getModelFrequency` | integer | `1` | >= 1; <= 1000000 |" in training
    assert "| `numEpochs` | integer | `1` | >= 1; <= 1000000 |" in training
    assert "| `taskTimeoutSeconds` | number | `60.0` | > 0.0 |" in training
    assert "one of `None`, `Running`, `All`" in sections["spec.runPolicy"]
    assert "needs useAsync: true" in training  # the CEL rule
    for section in ("spec.model", "spec.data", "spec.training", "spec.ps", "spec.worker", "spec.runPolicy", "status",
                    "status.conditions[]"):
        assert section in sections


def test_links_point_at_sections() -> None:
    text = render()
    anchors = {re.sub(r"[^a-z0-9 _-]", "", h.lower()) for h in _sections(text)}
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, target
