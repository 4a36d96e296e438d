"""The optimizer configuration both roles share: normalised with Keras's defaults, bad values refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elasticps.api.optimizer import HYPER_PARAMETERS, OptimizerConfig, OptimizerError, normalized


def test_missing_hyper_parameters_take_keras_defaults() -> None:
    config = normalized(OptimizerConfig("sgd", {"learning_rate": 0.1}))
    assert dict(config.params) == {"learning_rate": 0.1, "momentum": 0.0, "nesterov": 0.0}


@pytest.mark.parametrize("name", sorted(HYPER_PARAMETERS))
def test_every_optimizer_normalises_to_all_its_parameters(name: str) -> None:
    assert set(normalized(OptimizerConfig(name, {})).params) == set(HYPER_PARAMETERS[name])


def test_numpy_and_bool_values_are_numbers() -> None:
    config = normalized(OptimizerConfig("sgd", {"learning_rate": np.float32(0.5), "nesterov": True}))
    assert config.params["learning_rate"] == 0.5 and config.params["nesterov"] == 1.0


@pytest.mark.parametrize(
    "config, message",
    [
        (OptimizerConfig("lamb", {}), "unknown optimizer 'lamb'"),
        (OptimizerConfig("sgd", {"beta_1": 0.9}), "unknown hyper-parameter 'beta_1'"),
        (OptimizerConfig("sgd", {"learning_rate": math.nan}), "must be a finite number"),
        (OptimizerConfig("sgd", {"learning_rate": "0.1"}), "must be a finite number"),  # type: ignore[dict-item]
        (OptimizerConfig("sgd", {"learning_rate": 0.0}), r"must be in \(0, 10000\]"),
        (OptimizerConfig("sgd", {"learning_rate": 1e30}), r"must be in \(0, 10000\]"),
        (OptimizerConfig("adam", {"beta_2": 1.0}), r"must be in \[0, 1\)"),
        (OptimizerConfig("sgd", {"nesterov": 0.5}), "must be 0.0"),
    ],
)
def test_bad_configurations_are_refused_naming_what(config: OptimizerConfig, message: str) -> None:
    with pytest.raises(OptimizerError, match=message):
        normalized(config)
