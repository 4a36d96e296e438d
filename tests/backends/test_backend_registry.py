"""The backend registry: every framework the spec accepts has a backend, found by name and
imported only when asked for; the example models' old module names still load."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from elasticps.api.spec import Framework
from elasticps.backends.api import ModelError, TrainerOptions
from elasticps.backends.registry import BACKENDS, backend_for


def test_every_framework_has_a_backend() -> None:
    assert set(BACKENDS) == set(Framework)
    for framework in Framework:
        backend = backend_for(framework)
        for method in ("configure_threads", "load_model", "trainer", "export_model"):
            assert callable(getattr(backend, method)), (framework, method)


def test_the_roles_that_build_no_model_import_no_framework() -> None:
    # The PS, the coordinator, the operator, the local runner and the worker's own modules import
    # the registry and the seam, never a framework: the backend's module is imported on first use.
    code = (
        "import sys\n"
        "import elasticps.cli, elasticps.ps.main, elasticps.coordinator.main, elasticps.worker.main\n"
        "import elasticps.worker.checkpoint_export, elasticps.local.runner, elasticps.operator.main\n"
        "import elasticps.backends.registry, elasticps.backends.api\n"
        "print(sorted(m for m in ('tensorflow', 'keras', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_keras_trainer_comes_from_the_registry(caplog: pytest.LogCaptureFixture) -> None:
    backend = backend_for(Framework.KERAS)
    with caplog.at_level(logging.WARNING):
        module = backend.load_model("elasticps.zoo.mlp")  # the name before the backends
    assert module.name == "elasticps.backends.keras.zoo.mlp"
    assert "elasticps.backends.keras.zoo.mlp" in caplog.text
    trainer = backend.trainer(module, {"hidden": 4}, TrainerOptions(minibatch_size=8))
    assert trainer.tables() == []
    assert trainer.optimizer_config(0.0).name


def test_a_module_that_cannot_be_imported_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="cannot be imported"):
        backend_for(Framework.KERAS).load_model("elasticps.backends.keras.zoo.no_such_model")
