"""The Keras backend as the registry hands it out (:data:`BACKEND`). Imports TensorFlow, through
the trainer: the registry imports this module only when a worker, a prediction or an export asks
for Keras, so the PS, the coordinator and the operator never pay for it."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from elasticps.backends.api import BackendTrainer, ExportModel, TrainerOptions, Variable
from elasticps.backends.keras import trainer as keras_trainer
from elasticps.backends.keras.model_loading import ModelModule, load_model_module


class KerasBackend:
    def configure_threads(self, num_threads: int) -> None:
        keras_trainer.configure_threads(num_threads)

    def load_model(self, model_def: str) -> ModelModule:
        return load_model_module(model_def)

    def model_file(self, model: ModelModule) -> str | None:
        return getattr(sys.modules.get(model.name), "__file__", None)

    def trainer(self, model: ModelModule, params: Mapping[str, Any], options: TrainerOptions) -> BackendTrainer:
        if options.model_seed:
            keras_trainer.seed_everything(options.model_seed)
        return keras_trainer.KerasTrainer(
            model,
            params,
            options.minibatch_size,
            seed=options.seed,
            learning_rate=options.learning_rate,
            metadata=options.metadata,
            serve_tables=options.serve_tables,
        )

    def export_model(
        self,
        model: ModelModule,
        params: Mapping[str, Any],
        minibatch_size: int,
        features: np.ndarray,
        labels: np.ndarray | None,
    ) -> ExportModel:
        import keras

        keras.utils.clear_session()  # layer names as a worker's first model has them (no _1 suffixes)
        trainer = keras_trainer.KerasTrainer(model, params, minibatch_size)
        trainer.build(features, labels)
        return _Built(trainer)


class _Built:
    """A built Keras model whose variables are named by their Keras path."""

    def __init__(self, trainer: keras_trainer.KerasTrainer) -> None:
        self._trainer = trainer
        self._variables = {v.path: v for v in trainer.model.variables}

    def variables(self) -> dict[str, Variable]:
        return {
            name: Variable(tuple(int(d) for d in v.shape), bool(v.trainable)) for name, v in self._variables.items()
        }

    def assign(self, name: str, value: np.ndarray) -> None:
        variable = self._variables[name]
        variable.assign(np.asarray(value, dtype=variable.dtype))

    def export(self, directory: Path) -> None:
        self._trainer.export(directory)


BACKEND = KerasBackend()
