"""Framework -> backend: the one place a framework is wired in (``spec.model.framework``).

Each entry names the module holding the framework's ``BACKEND``; it is imported on first use,
so a process that never builds a model (a PS, the coordinator, the operator) never imports a
framework, and a worker imports only its own. A new framework is a package under ``backends/``
with a ``BACKEND`` (:class:`~elasticps.backends.api.Backend`), a value in
:class:`~elasticps.api.spec.Framework` and a line here.
"""

from __future__ import annotations

import importlib
from typing import cast

from elasticps.api.spec import Framework
from elasticps.backends.api import Backend

BACKENDS: dict[Framework, str] = {
    Framework.KERAS: "elasticps.backends.keras.backend",
    Framework.TORCH: "elasticps.backends.pytorch.backend",
}


def backend_for(framework: Framework) -> Backend:
    """The backend of ``framework``, its module imported now (with its framework)."""
    return cast(Backend, importlib.import_module(BACKENDS[framework]).BACKEND)
