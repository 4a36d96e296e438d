"""The PyTorch backend as the registry hands it out (:data:`BACKEND`). Imports torch: the registry
imports this module only when a worker, a prediction or an export asks for ``framework: torch``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from elasticps.backends.api import BackendTrainer, ExportModel, TrainerOptions, Variable
from elasticps.backends.pytorch import trainer as torch_trainer
from elasticps.backends.pytorch.model_loading import TorchModule, load_torch_module


class TorchBackend:
    def configure_threads(self, num_threads: int) -> None:
        torch_trainer.configure_threads(num_threads)

    def load_model(self, model_def: str) -> TorchModule:
        return load_torch_module(model_def)

    def model_file(self, model: TorchModule) -> str | None:
        return getattr(sys.modules.get(model.name), "__file__", None)

    def trainer(self, model: TorchModule, params: Mapping[str, Any], options: TrainerOptions) -> BackendTrainer:
        if options.model_seed:
            torch_trainer.seed_everything(options.model_seed)
        return torch_trainer.TorchTrainer(
            model, params, options.minibatch_size, seed=options.seed, learning_rate=options.learning_rate,
            serve_tables=options.serve_tables,
        )  # fmt: skip

    def export_model(
        self, model: TorchModule, params: Mapping[str, Any], minibatch_size: int, features: np.ndarray, labels: np.ndarray | None
    ) -> ExportModel:
        trainer = torch_trainer.TorchTrainer(model, params, minibatch_size)
        trainer.build(features, labels)
        return _Built(trainer)


class _Built:
    """A built torch model: its parameters and floating-point buffers by name."""

    def __init__(self, trainer: torch_trainer.TorchTrainer) -> None:
        self._trainer = trainer
        self._parameters = frozenset(trainer.weights())  # once: assign is called per variable

    def variables(self) -> dict[str, Variable]:
        weights, state = self._trainer.weights(), self._trainer.state()
        return {
            **{name: Variable(tuple(int(d) for d in v.shape), True) for name, v in weights.items()},
            **{name: Variable(tuple(int(d) for d in v.shape), False) for name, v in state.items()},
        }

    def assign(self, name: str, value: np.ndarray) -> None:
        if name in self._parameters:
            self._trainer.assign({name: value})
        else:
            self._trainer.assign_state({name: value})

    def export(self, directory: Path) -> None:
        self._trainer.export(directory)


BACKEND = TorchBackend()
