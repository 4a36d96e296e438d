"""ElasticDL's names for its model zoo, in one module: a module written for ElasticDL changes its
``from elasticdl.python... import X`` lines to ``from elasticps.elasticdl import X`` and nothing
else (``docs/model-zoo.md`` lists what runs so).

| ElasticDL's import | here |
| --- | --- |
| ``common.constants``: ``Mode``, ``MaxComputeConfig`` | :class:`Mode`, :class:`MaxComputeConfig` |
| ``elasticdl.callbacks``: ``LearningRateScheduler`` | :class:`LearningRateScheduler` (``elasticps.callbacks``) |
| ``worker.prediction_outputs_processor``: ``BasePredictionOutputsProcessor`` | :class:`BasePredictionOutputsProcessor` |
| ``common.log_utils``: ``default_logger`` | :data:`default_logger` |
| ``data.odps_io``: ``is_odps_configured``, ``ODPSWriter`` | :func:`is_odps_configured` (never: elasticps reads no MaxCompute tables), :class:`ODPSWriter` (refuses in one line) |
| ``elasticdl.layers.embedding``: ``Embedding`` | ``elasticps.backends.keras.layers.Embedding`` (Keras's and ElasticDL's arguments) |

A module's ``PredictionOutputsProcessor`` (a :class:`BasePredictionOutputsProcessor`) gets each
prediction task's outputs, as ElasticDL's worker hands them (``process(predictions, worker_id)``,
the outputs as tensors), after the task's file is written.

Standard library only, but for ``Embedding``, which is imported from the Keras backend when asked.
"""

from __future__ import annotations

import abc
import logging
from typing import Any

from elasticps.callbacks import LearningRateScheduler
from elasticps.model_contract import Metadata, Mode

__all__ = [
    "BasePredictionOutputsProcessor",
    "Embedding",
    "LearningRateScheduler",
    "MaxComputeConfig",
    "Metadata",
    "Mode",
    "ODPSWriter",
    "default_logger",
    "is_odps_configured",
]

default_logger = logging.getLogger("elasticps.model")


class MaxComputeConfig:
    """The environment variables ElasticDL reads MaxCompute's settings from (names only)."""

    PROJECT_NAME = "MAXCOMPUTE_PROJECT"
    ACCESS_ID = "MAXCOMPUTE_AK"
    ACCESS_KEY = "MAXCOMPUTE_SK"
    ENDPOINT = "MAXCOMPUTE_ENDPOINT"
    TUNNEL_ENDPOINT = "MAXCOMPUTE_TUNNEL_ENDPOINT"


def is_odps_configured() -> bool:
    """False: elasticps reads and writes no MaxCompute (ODPS) tables, so a module's MaxCompute
    branch is never taken."""
    return False


class ODPSWriter:
    """ElasticDL's MaxCompute table writer: refused, in one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("elasticps writes no MaxCompute (ODPS) tables: a prediction job writes "
                                  "JSON lines under spec.output (docs/model-zoo.md)")


class BasePredictionOutputsProcessor(abc.ABC):
    """What a model module's ``PredictionOutputsProcessor`` derives from (ElasticDL's)."""

    @abc.abstractmethod
    def process(self, predictions: Any, worker_id: int) -> None:
        """One prediction task's outputs (tensors, one row per record) from worker ``worker_id``."""


def __getattr__(name: str) -> Any:
    if name == "Embedding":  # Keras's, imported only by the modules that use it
        from elasticps.backends.keras.layers import Embedding

        return Embedding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
