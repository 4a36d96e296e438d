"""The Keras side of a worker on a tiny model: SSP local steps use the job's learning rate."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerError
from elasticps.worker.keras_trainer import KerasTrainer
from elasticps.worker.model_loading import ModelError, ModelModule


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




# ---- model state: the non-trainable floating-point variables --------------------------------------
def bn_module() -> ModelModule:
    return ModelModule(
        name="bn",
        custom_model=lambda: keras.Sequential(
            [
                keras.Input((2,)),
                keras.layers.Dense(3),
                keras.layers.BatchNormalization(),
                keras.layers.Dropout(0.5),  # its seed generator's state is integer: not synchronised
                keras.layers.Dense(1),
            ],
            name="bn",
        ),
        loss=lambda labels, predictions: keras.losses.mean_squared_error(labels, predictions),
        optimizer=lambda: keras.optimizers.SGD(0.1),
        feed=None,
        eval_metrics_fn=None,
    )


def test_the_state_is_batchnorms_moving_statistics_and_a_gradient_step_moves_them() -> None:
    trainer = KerasTrainer(bn_module(), {}, minibatch_size=8)
    features = np.full((8, 2), 3.0, np.float32)
    trainer.build(features, np.ones(8, np.float32))
    state = trainer.state()
    assert sorted(state) == ["bn/batch_normalization/moving_mean", "bn/batch_normalization/moving_variance"]
    assert not set(state) & set(trainer.weights())
    np.testing.assert_array_equal(state["bn/batch_normalization/moving_mean"], np.zeros(3, np.float32))
    np.testing.assert_array_equal(state["bn/batch_normalization/moving_variance"], np.ones(3, np.float32))
    (x, y), = trainer.batches(features, np.ones(8, np.float32), "training")
    trainer.gradients(x, y)  # a training forward pass updates the moving statistics
    assert not np.allclose(trainer.state()["bn/batch_normalization/moving_mean"], 0.0)


def test_assigned_state_is_what_evaluation_uses() -> None:
    trainer = KerasTrainer(bn_module(), {}, minibatch_size=8)
    features, labels = np.ones((8, 2), np.float32), np.zeros(8, np.float32)
    trainer.build(features, labels)
    before = trainer.evaluate(features, labels)["loss"]
    pulled = {name: np.full_like(value, 7.0) for name, value in trainer.state().items()}
    trainer.assign_state(pulled)
    for name, value in trainer.state().items():
        np.testing.assert_array_equal(value, pulled[name], err_msg=name)
    assert trainer.evaluate(features, labels)["loss"] != pytest.approx(before)
    with pytest.raises(ModelError, match="state 'other'"):
        trainer.assign_state({"other": np.zeros(1, np.float32)})


def test_warm_up_traces_the_gradient_step_and_changes_no_weight_and_no_state() -> None:
    # The first run of the step (tracing) takes seconds with a real model; a worker does it before
    # its first pull (worker/training.py), so its first gradient is computed on a fresh model.
    trainer = KerasTrainer(bn_module(), {}, minibatch_size=8)
    features, labels = np.full((8, 2), 3.0, np.float32), np.ones(8, np.float32)
    trainer.build(features[:1], labels[:1])
    weights, state = trainer.weights(), trainer.state()
    trainer.warm_up(features, labels)
    assert trainer._step.experimental_get_tracing_count() == 1
    for name, value in {**weights, **state}.items():
        np.testing.assert_array_equal({**trainer.weights(), **trainer.state()}[name], value, err_msg=name)
    (x, y), = trainer.batches(features, labels, "training")
    trainer.gradients(x, y)  # the first real step runs what the warm-up traced
    assert trainer._step.experimental_get_tracing_count() == 1


def test_after_warming_up_two_minibatch_sizes_no_size_traces_the_step_again() -> None:
    # A job whose tasks end in a shorter minibatch (worker/training.py warms up both sizes): the
    # second trace is for any batch size, so no later step pays for a trace.
    trainer = KerasTrainer(bn_module(), {}, minibatch_size=8)
    features, labels = np.full((8, 2), 3.0, np.float32), np.ones(8, np.float32)
    trainer.warm_up(features, labels)
    trainer.warm_up(features[:5], labels[:5])
    traced = trainer._step.experimental_get_tracing_count()
    for size in (8, 5, 3, 1):
        (x, y), = trainer.batches(features[:size], labels[:size], "training")
        trainer.gradients(x, y)
    assert trainer._step.experimental_get_tracing_count() == traced == 2
