"""The Keras side of a worker on a tiny model: SSP local steps use the job's learning rate."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from elasticps.backends.keras.trainer import KerasTrainer, fused_assign, minibatch_sizes, split_flat
from elasticps.backends.keras.model_loading import ModelError, ModelModule
from elasticps.callbacks import LearningRateScheduler


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


def test_a_schedule_is_never_overridden_by_the_jobs_rate() -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=10, decay_rate=0.9)
    with pytest.raises(ModelError, match="learningRate 0.1 and the module's learning-rate schedule.*keep one"):
        KerasTrainer(module(lambda: keras.optimizers.SGD(schedule)), {}, minibatch_size=4, learning_rate=0.1)
    with_callback = dataclasses.replace(module(lambda: keras.optimizers.SGD(0.5)),
                                        schedule=LearningRateScheduler(lambda version: 0.1))
    with pytest.raises(ModelError, match="keep one"):
        KerasTrainer(with_callback, {}, minibatch_size=4, learning_rate=0.1)
    both = dataclasses.replace(module(lambda: keras.optimizers.SGD(schedule)), schedule=LearningRateScheduler(lambda v: 0.1))
    with pytest.raises(ModelError, match="the optimizer's learning rate is a schedule and callbacks"):
        KerasTrainer(both, {}, minibatch_size=4)


def test_a_keras_schedule_is_taken_by_model_version_and_the_ps_gets_its_first_rate() -> None:
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([100, 200], [0.1, 0.01, 0.001])
    trainer = KerasTrainer(module(lambda: keras.optimizers.SGD(schedule, momentum=0.9)), {}, minibatch_size=4)
    assert [trainer.learning_rate_at(v) for v in (0, 100, 101, 200, 201, 10**6)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    )
    config = trainer.optimizer_config(0.0)
    assert config.params["learning_rate"] == pytest.approx(0.1) and config.params["momentum"] == pytest.approx(0.9)


def test_a_callbacks_schedule_sets_the_local_optimizers_rate_for_localsgd_steps() -> None:
    scheduled = dataclasses.replace(module(lambda: keras.optimizers.SGD(0.5)),
                                    schedule=LearningRateScheduler(lambda version: 0.5 if version < 10 else 0.125))
    trainer = KerasTrainer(scheduled, {}, minibatch_size=4)
    assert trainer.learning_rate_at(3) == 0.5 and trainer.learning_rate_at(10) == 0.125
    trainer.build(np.zeros((1, 2), np.float32), np.zeros((1, 1), np.float32))
    before = trainer.weights()
    trainer.apply_local({name: np.ones_like(value) for name, value in before.items()}, trainer.learning_rate_at(10))
    for name, value in trainer.weights().items():
        np.testing.assert_allclose(before[name] - value, 0.125, rtol=1e-6)


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf"), "fast", None])
def test_a_schedule_giving_no_learning_rate_is_a_model_error_naming_the_version(bad: Any) -> None:
    scheduled = dataclasses.replace(module(lambda: keras.optimizers.SGD(0.5)),
                                    schedule=LearningRateScheduler(lambda version: 0.1 if version < 5 else bad))
    trainer = KerasTrainer(scheduled, {}, minibatch_size=4)
    assert trainer.learning_rate_at(4) == 0.1
    with pytest.raises(ModelError, match=r"tiny: the learning-rate schedule gave .* at model version 7: a learning "
                                         r"rate is a finite number > 0"):
        trainer.learning_rate_at(7)




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
    keras.utils.clear_session()  # layer names as in a fresh process, whatever ran before in this one
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


# ---- the hot path: traced once, one buffer of gradients, one assign --------------------------------
def two_layer_module() -> ModelModule:
    return ModelModule(
        name="two",
        custom_model=lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)]),
        loss=lambda labels, predictions: keras.losses.mean_squared_error(labels, predictions),
        optimizer=lambda: keras.optimizers.SGD(0.1),
        feed=None,
        eval_metrics_fn=None,
    )


def records(count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(count)
    return rng.normal(size=(count, 3)).astype(np.float32), rng.normal(size=(count, 1)).astype(np.float32)


def test_minibatches_cover_the_task_once_in_full_minibatches_then_the_rest() -> None:
    assert minibatch_sizes(10, 4) == [4, 4, 2]
    assert minibatch_sizes(8, 4) == [4, 4]
    assert minibatch_sizes(0, 4) == []
    trainer = KerasTrainer(two_layer_module(), {}, minibatch_size=4)
    features, labels = records(10)
    trainer.build(features, labels)
    batches = list(trainer.batches(features, labels, "training"))
    assert [len(y) for _, y in batches] == [4, 4, 2]
    seen = np.concatenate([np.asarray(x) for x, _ in batches])
    assert sorted(map(tuple, seen)) == sorted(map(tuple, features))  # shuffled, each record once
    pairs = {tuple(row): tuple(label) for x, y in batches for row, label in zip(np.asarray(x), np.asarray(y))}
    assert all(pairs[tuple(row)] == tuple(label) for row, label in zip(features, labels))  # still paired
    in_order = np.concatenate([np.asarray(x) for x, _ in trainer.batches(features, labels, "evaluation")])
    np.testing.assert_array_equal(in_order, features)


def test_the_gradient_step_is_traced_once_for_every_minibatch_size_and_task() -> None:
    trainer = KerasTrainer(two_layer_module(), {}, minibatch_size=4)
    for count in (10, 7, 3):  # tasks of several sizes: last minibatches of 2, 3 and 3 records
        features, labels = records(count)
        for x, y in trainer.batches(features, labels, "training"):
            trainer.gradients(x, y)
        trainer.evaluate(features, labels)
    assert trainer._step.experimental_get_tracing_count() == 1
    assert trainer._eval.experimental_get_tracing_count() == 1


def test_gradients_are_each_variables_own_though_they_come_out_in_one_buffer() -> None:
    trainer = KerasTrainer(two_layer_module(), {}, minibatch_size=4)
    features, labels = records(4)
    trainer.build(features, labels)
    (x, y), = trainer.batches(features, labels, "evaluation")
    loss, gradients = trainer.gradients(x, y)
    model = trainer.model
    with tf.GradientTape() as tape:
        expected_loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x, training=True)))
    expected = tape.gradient(expected_loss, model.trainable_variables)
    assert list(gradients) == [v.path for v in model.trainable_variables]
    for (name, value), want in zip(gradients.items(), expected):
        assert value.shape == tuple(want.shape), name
        np.testing.assert_allclose(value, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert loss == pytest.approx(float(expected_loss), rel=1e-5)


def test_split_flat_gives_views_of_consecutive_parts() -> None:
    flat = np.arange(10, dtype=np.float32)
    first, second = split_flat(flat, [(2, 3), (4,)], [6, 4])
    np.testing.assert_array_equal(first, [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(second, [6, 7, 8, 9])
    assert np.shares_memory(first, flat) and np.shares_memory(second, flat)  # views, no copies


def test_one_assign_takes_all_pulled_variables_or_those_of_the_shards_that_moved() -> None:
    trainer = KerasTrainer(two_layer_module(), {}, minibatch_size=4)
    trainer.build(*records(1))
    names = list(trainer.weights())
    everything = {name: np.full_like(value, 2.0) for name, value in trainer.weights().items()}
    trainer.assign(everything)
    for name, value in trainer.weights().items():
        np.testing.assert_array_equal(value, everything[name], err_msg=name)
    some = {names[1]: np.full_like(everything[names[1]], 5.0)}
    trainer.assign(some)
    after = trainer.weights()
    np.testing.assert_array_equal(after[names[1]], some[names[1]])
    np.testing.assert_array_equal(after[names[0]], everything[names[0]])  # untouched
    trainer.assign({name: np.full_like(value, 3.0) for name, value in everything.items()})  # the traced one again
    assert all(np.all(value == 3.0) for value in trainer.weights().values())
    with pytest.raises(ModelError, match="variable 'other'"):
        trainer.assign({"other": np.zeros(1, np.float32)})


def test_a_fused_assign_of_one_dtype_puts_each_value_in_its_own_variable_and_keeps_none_of_them() -> None:
    shapes = [(1024, 1024), (3, 5), (1,), (7,)]  # a large variable: TensorFlow may share aligned numpy memory
    variables = [tf.Variable(np.zeros(shape, np.float32)) for shape in shapes]
    assign = fused_assign(variables)
    for round_ in range(2):
        values = [np.random.default_rng(round_ * 10 + i).random(shape, np.float32) for i, shape in enumerate(shapes)]
        assign(values)
        for variable, value in zip(variables, values):
            np.testing.assert_array_equal(variable.numpy(), value)
    held = [variable.numpy().copy() for variable in variables]

    def breaks_after_the_first() -> Iterator[np.ndarray]:
        yield np.full(shapes[0], 9.0, np.float32)  # written into the assign's buffer
        raise RuntimeError("the pull broke")

    with pytest.raises(RuntimeError):
        assign(breaks_after_the_first())
    for value in values:
        value[...] = -1.0  # nor are the caller's arrays any variable's memory
    for variable, value in zip(variables, held):  # the buffer is no variable's memory
        np.testing.assert_array_equal(variable.numpy(), value)


def test_a_fused_assign_of_mixed_dtypes_assigns_each_variable_in_its_own_dtype() -> None:
    variables = [tf.Variable(np.zeros((2, 3), np.float32)), tf.Variable(np.zeros(4, np.float64))]
    assign = fused_assign(variables)
    values = [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.float64) / 3]
    assign(values)
    for variable, value in zip(variables, values):
        assert variable.dtype.as_numpy_dtype == value.dtype
        np.testing.assert_array_equal(variable.numpy(), value)


def test_a_model_without_state_has_an_empty_one() -> None:
    trainer = KerasTrainer(two_layer_module(), {}, minibatch_size=4)
    trainer.build(*records(1))
    assert trainer.state() == {}


def test_a_data_function_that_cannot_run_in_a_graph_runs_eagerly() -> None:
    calls: list[int] = []

    def feed(dataset: Any, mode: str) -> Any:
        calls.append(1)
        if not tf.executing_eagerly():
            raise NotImplementedError("eager only")
        return dataset

    module = ModelModule("eager", two_layer_module().custom_model, two_layer_module().loss, two_layer_module().optimizer, feed, None)
    trainer = KerasTrainer(module, {}, minibatch_size=4)
    features, labels = records(6)
    trainer.build(features, labels)
    assert sum(len(y) for _, y in trainer.batches(features, labels, "training")) == 6
    assert len(calls) == 3  # the failed trace, then eagerly for the build and the task


def test_past_the_cap_of_traced_assigns_a_new_set_of_names_is_assigned_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import elasticps.backends.keras.trainer as keras_trainer

    monkeypatch.setattr(keras_trainer, "MAX_ASSIGNERS", 1)
    trainer = KerasTrainer(two_layer_module(), {}, minibatch_size=4)
    trainer.build(*records(1))
    first, second = list(trainer.weights())[:2]
    trainer.assign({first: np.full_like(trainer.weights()[first], 1.0)})
    trainer.assign({second: np.full_like(trainer.weights()[second], 4.0)})  # not traced: the cap is reached
    assert len(trainer._assigners) == 1
    assert np.all(trainer.weights()[first] == 1.0) and np.all(trainer.weights()[second] == 4.0)


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


def test_after_one_warm_up_no_minibatch_size_traces_the_step_again() -> None:
    # A job whose tasks end in a shorter minibatch: the step is traced for any batch size, so one
    # warm-up (worker/training.py) spares every later step a trace.
    trainer = KerasTrainer(bn_module(), {}, minibatch_size=8)
    features, labels = np.full((8, 2), 3.0, np.float32), np.ones(8, np.float32)
    trainer.warm_up(features, labels)
    for size in (8, 5, 3, 1):
        (x, y), = trainer.batches(features[:size], labels[:size], "training")
        trainer.gradients(x, y)
    assert trainer._step.experimental_get_tracing_count() == 1
