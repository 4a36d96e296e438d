"""Keras optimizer -> the PS's OptimizerConfig, and refusal of what the PS cannot reproduce."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from elasticps.api.optimizer import OptimizerConfig, OptimizerError
from elasticps.ps.optimizers import make_optimizer  # noqa: E402
from elasticps.backends.keras.optimizer_spec import optimizer_config  # noqa: E402


def test_sgd_with_nesterov_momentum() -> None:
    config = optimizer_config(keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True))
    # 0.1, not the float32-rounded 0.10000000149011612 Keras stores.
    assert config == OptimizerConfig("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": 1.0})


def test_adam_defaults() -> None:
    config = optimizer_config(keras.optimizers.Adam())
    assert config == OptimizerConfig(
        "adam", {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "amsgrad": 0.0}
    )
    # The same as the PS's own defaults for an empty config.
    assert config == make_optimizer(OptimizerConfig("adam", {})).config


def test_other_supported_classes() -> None:
    assert optimizer_config(keras.optimizers.Adagrad(0.05, initial_accumulator_value=0.2)) == OptimizerConfig(
        "adagrad", {"learning_rate": 0.05, "initial_accumulator_value": 0.2, "epsilon": 1e-7}
    )
    assert optimizer_config(keras.optimizers.RMSprop(momentum=0.5, centered=True)) == OptimizerConfig(
        "rmsprop", {"learning_rate": 0.001, "rho": 0.9, "momentum": 0.5, "epsilon": 1e-7, "centered": 1.0}
    )


def test_learning_rate_override() -> None:
    config = optimizer_config(keras.optimizers.Adam(0.01, amsgrad=True), learning_rate=0.004)
    assert config.params["learning_rate"] == 0.004
    assert config.params["amsgrad"] == 1.0
    with pytest.raises(OptimizerError, match="learning_rate"):
        optimizer_config(keras.optimizers.Adam(), learning_rate=0.0)


@pytest.mark.parametrize(
    ("optimizer", "named"),
    [
        (lambda: keras.optimizers.SGD(0.1, clipnorm=1.0), "clipnorm"),
        (lambda: keras.optimizers.Adam(clipvalue=0.5), "clipvalue"),
        (lambda: keras.optimizers.Adam(global_clipnorm=1.0), "global_clipnorm"),
        (lambda: keras.optimizers.Adam(weight_decay=1e-4), "weight_decay"),
        (lambda: keras.optimizers.Adam(use_ema=True), "use_ema"),
        (lambda: keras.optimizers.SGD(gradient_accumulation_steps=2), "gradient_accumulation_steps"),
        (lambda: keras.optimizers.RMSprop(loss_scale_factor=128.0), "loss_scale_factor"),
        (
            lambda: keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9)),
            "schedule",
        ),
        (lambda: keras.optimizers.Adamax(), "Adamax"),
        (lambda: keras.optimizers.AdamW(), "AdamW"),
    ],
)
def test_unsupported_optimizers_raise(optimizer: Any, named: str) -> None:
    with pytest.raises(OptimizerError, match=named) as info:
        optimizer_config(optimizer())
    assert "\n" not in str(info.value)


def test_schedule_is_refused_even_with_an_override() -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9)
    with pytest.raises(OptimizerError, match="schedule"):
        optimizer_config(keras.optimizers.Adam(schedule), learning_rate=0.01)


def test_config_drives_the_ps_optimizer_like_keras() -> None:
    # End to end: the translated config makes the PS optimizer follow Keras.
    rng = np.random.default_rng(0)
    init = rng.standard_normal((4, 3)).astype(np.float32)
    grads = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(10)]

    theirs = keras.optimizers.RMSprop(0.01, momentum=0.9, centered=True)
    ours = make_optimizer(optimizer_config(theirs))
    variable = keras.Variable(init.copy())
    for grad in grads:
        theirs.apply_gradients([(grad, variable)])

    param = init.copy()
    ours.register("w", param.shape, param.dtype)
    for grad in grads:
        ours.apply("w", param, grad, ours.learning_rate)
    np.testing.assert_allclose(param, variable.numpy(), rtol=1e-5, atol=1e-6)
