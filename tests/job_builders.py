"""TrainingJob documents and parsed jobs for tests: the one place a minimal valid job is written.

Importable from any test (``tests/`` is on ``sys.path`` through ``tests/conftest.py``).
"""

from __future__ import annotations

import copy
from typing import Any

from elasticps.api.parsing import parse_job
from elasticps.api.spec import TrainingJob

MINIMAL_SPEC: dict[str, Any] = {"model": {"modelDef": "elasticps.backends.keras.zoo.mnist_cnn"}, "data": {"training": "/data/train"}}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, mapping by mapping (neither is changed)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def job_document(spec: dict[str, Any] | None = None, *, name: str = "mnist", namespace: str | None = None) -> dict[str, Any]:
    """A TrainingJob as YAML or the API server holds it: the minimal spec with ``spec`` merged in."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": metadata,
        "spec": merge(MINIMAL_SPEC, spec or {}),
    }


def make_job(spec: dict[str, Any] | None = None, *, name: str = "mnist", namespace: str = "default") -> TrainingJob:
    return parse_job(job_document(spec, name=name, namespace=namespace))
