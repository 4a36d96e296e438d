"""The Keras side of a worker on a tiny model: SSP local steps use the job's learning rate."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerError
from elasticps.worker.keras_trainer import KerasTrainer
from elasticps.worker.model_loading import ModelModule


def module(optimizer: Any) -> ModelModule:
    return ModelModule(
        name="tiny",
        custom_model=lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
        loss=lambda labels, predictions: keras.losses.mean_squared_error(labels, predictions),
        optimizer=optimizer,
        feed=None,
        eval_metrics_fn=None,
    )


def local_step(trainer: KerasTrainer) -> dict[str, np.ndarray]:
    """How far one apply_local of gradient 1 everywhere moves each weight."""
    trainer.build(np.zeros((1, 2), np.float32), np.zeros((1, 1), np.float32))
    before = trainer.weights()
    trainer.apply_local({name: np.ones_like(value) for name, value in before.items()})
    return {name: before[name] - value for name, value in trainer.weights().items()}


@pytest.mark.parametrize(("job_lr", "moved"), [(0.25, 0.25), (0.0, 0.5)])
def test_a_local_step_uses_the_jobs_learning_rate_when_set(job_lr: float, moved: float) -> None:
    trainer = KerasTrainer(module(lambda: keras.optimizers.SGD(0.5)), {}, minibatch_size=4, learning_rate=job_lr)
    for name, delta in local_step(trainer).items():
        np.testing.assert_allclose(delta, moved, rtol=1e-6, err_msg=name)  # plain SGD: lr x gradient
    assert trainer.optimizer_config(job_lr).params["learning_rate"] == moved  # the PS's rate, the same


def test_a_schedule_is_refused_rather_than_overridden() -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=10, decay_rate=0.9)
    with pytest.raises(OptimizerError, match="schedule"):
        KerasTrainer(module(lambda: keras.optimizers.SGD(schedule)), {}, minibatch_size=4, learning_rate=0.1)


