"""Every PS optimizer is element-wise: a variable split into row slices over shards trains bit for
bit as the whole variable on one shard (the stores directly, sync and async, with state)."""

from __future__ import annotations

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.psclient.sharding import place, tensor_infos
from elasticps.ps.store import ParameterStore, StoreSettings

OPTIMIZERS = [
    OptimizerConfig("sgd", {"learning_rate": 0.1}),
    OptimizerConfig("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    OptimizerConfig("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": 1.0}),
    OptimizerConfig("adam", {"learning_rate": 0.01}),
    OptimizerConfig("adam", {"learning_rate": 0.01, "amsgrad": 1.0}),
    OptimizerConfig("adagrad", {"learning_rate": 0.05}),
    OptimizerConfig("rmsprop", {"learning_rate": 0.01}),
    OptimizerConfig("rmsprop", {"learning_rate": 0.01, "momentum": 0.5, "centered": 1.0}),
]


def model() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    variables = {
        "net/kernel": rng.standard_normal((23, 6)).astype(np.float32),
        "net/wide": rng.standard_normal((7, 2, 3)),  # float64
        "net/bias": rng.standard_normal(6).astype(np.float32),
    }
    return variables, {"net/mean": rng.standard_normal((9, 2)).astype(np.float32)}


def gradient(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(50 + step)
    return {name: (rng.standard_normal(v.shape) * 3).astype(v.dtype) for name, v in model()[0].items()}


def held(stores: list[ParameterStore]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    variables: dict[str, np.ndarray] = {}
    state: dict[str, np.ndarray] = {}
    for store in stores:
        with store.reading_model() as found:
            variables.update({n: v.copy() for n, v in found.variables.items()})
            state.update({n: v.copy() for n, v in found.state.items()})
    return variables, state


@pytest.mark.parametrize("rule", [UpdateRule.SYNC, UpdateRule.ASYNC], ids=["sync", "async"])
@pytest.mark.parametrize("config", OPTIMIZERS, ids=lambda c: f"{c.name}-{'-'.join(f'{k}{v}' for k, v in c.params.items())}")
def test_slices_train_as_the_whole_variable(config: OptimizerConfig, rule: UpdateRule) -> None:
    variables, state = model()
    placement = place(tensor_infos(variables, state), 3, split_bytes=64)
    assert all(placement.tensors[n].split for n in ("net/kernel", "net/wide", "net/mean"))
    mode = TrainingMode(rule=rule)
    shards = [ParameterStore(StoreSettings(shard=i, mode=mode)) for i in range(3)]
    single = ParameterStore(StoreSettings(mode=mode))
    parts, state_parts = placement.split(variables), placement.split(state)
    for shard, store in enumerate(shards):
        store.initialize(parts[shard], config, state=state_parts[shard])
    single.initialize(variables, config, state=state)
    for step in range(5):
        grads, values = gradient(step), {"net/mean": np.full((9, 2), float(step), np.float32)}
        for shard, store in enumerate(shards):
            store.push(placement.split(grads)[shard], step, worker="w", state=placement.split(values)[shard])
        single.push(grads, step, worker="w", state=values)
        if rule is UpdateRule.SYNC:
            for store in [*shards, single]:
                store.commit(step, ["w"])
    pieces, pieces_state = held(shards)
    whole, whole_state = held([single])
    for name, value in {**whole, **whole_state}.items():
        entry = placement.tensors[name]
        joined = np.concatenate([{**pieces, **pieces_state}[p.held] for p in entry.pieces])
        np.testing.assert_array_equal(joined, value, err_msg=name)
        if name in variables:
            assert not np.array_equal(value, variables[name])  # it trained
