"""The PS's hot path: a push updates the dense variables in place and allocates nothing in proportion
to the model, async and sync alike; large variables are updated a block at a time with the same
values, bit for bit, as one whole-array update."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.optimizers import make_optimizer
BLOCK_ELEMENTS = 1 << 16
from elasticps.ps.store import ParameterStore, StoreSettings

SIZES = (1 << 18, 1 << 22)  # 1 MiB and 16 MiB of float32 parameters
VARIABLES = 4
# What one push may allocate, whatever the model's size: the call's own objects (dicts, outcome),
# far below a single variable of the smaller model (64 KiB).
PUSH_BYTES = 16 << 10

CONFIGS = {
    "sgd": OptimizerConfig("sgd", {"learning_rate": 0.01}),
    "momentum": OptimizerConfig("sgd", {"learning_rate": 0.01, "momentum": 0.9}),
    "nesterov": OptimizerConfig("sgd", {"learning_rate": 0.01, "momentum": 0.9, "nesterov": 1.0}),
    "adam": OptimizerConfig("adam", {"learning_rate": 0.001}),
    "amsgrad": OptimizerConfig("adam", {"learning_rate": 0.001, "amsgrad": 1.0}),
    "adagrad": OptimizerConfig("adagrad", {"learning_rate": 0.01}),
    "rmsprop": OptimizerConfig("rmsprop", {"learning_rate": 0.001, "momentum": 0.5}),
    "centered": OptimizerConfig("rmsprop", {"learning_rate": 0.001, "centered": 1.0}),
}


def model(parameters: int) -> dict[str, np.ndarray]:
    each = parameters // VARIABLES
    return {f"layer{i}/kernel": np.full(each, 0.5, dtype=np.float32) for i in range(VARIABLES)}


def gradients(parameters: int) -> dict[str, np.ndarray]:
    return {name: np.full_like(value, 1e-3) for name, value in model(parameters).items()}


def peak_bytes(call: Callable[[], object]) -> int:
    """The most memory ``call`` held at once beyond what was held before it (tracemalloc; numpy
    reports its array buffers to it)."""
    tracemalloc.start()
    try:
        call()  # warm-up: this thread's block buffers, first-use caches
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "rmsprop"])
@pytest.mark.parametrize("parameters", SIZES)
def test_an_async_push_allocates_nothing_in_proportion_to_the_model(optimizer: str, parameters: int) -> None:
    store = ParameterStore(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC)))
    store.initialize(model(parameters), CONFIGS[optimizer])
    grads = gradients(parameters)
    with store.reading() as (_, _, variables):
        held = {name: value.__array_interface__["data"][0] for name, value in variables.items()}

    assert peak_bytes(lambda: store.push(grads, store.version)) < PUSH_BYTES

    with store.reading() as (_, version, variables):
        assert version == 2
        # In place: the live arrays are the ones the model was installed with.
        assert {name: value.__array_interface__["data"][0] for name, value in variables.items()} == held
        if optimizer == "sgd":
            step = np.float32(0.01) * np.float32(1e-3)
            expected = np.float32(np.float32(0.5) - step) - step
            assert all(np.all(value == expected) for value in variables.values())


@pytest.mark.parametrize("parameters", SIZES)
def test_a_sync_round_sums_in_place_and_allocates_nothing_in_proportion_to_the_model(parameters: int) -> None:
    store = ParameterStore(StoreSettings(mode=TrainingMode(rule=UpdateRule.SYNC)))
    store.initialize(model(parameters), CONFIGS["sgd"])
    grads = gradients(parameters)

    def round_of_two() -> None:
        version = store.version
        store.push(grads, version, worker="a")
        store.push(grads, version, worker="b")
        store.commit(version, ["a", "b"])

    assert peak_bytes(round_of_two) < PUSH_BYTES
    assert store.version == 2


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("shape", [(3 * BLOCK_ELEMENTS + 5,), (7, BLOCK_ELEMENTS // 3 + 1)])
def test_a_variable_updated_by_blocks_gets_the_whole_array_values(name: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(7)
    param = rng.normal(size=shape).astype(np.float32)
    blocked, whole = make_optimizer(CONFIGS[name]), make_optimizer(CONFIGS[name])
    blocked.register("v", shape, np.float32)
    whole.register("v", shape, np.float32)
    mine, reference = param.copy(), param.copy()
    for _ in range(3):
        grad = rng.normal(size=shape).astype(np.float32)
        blocked.apply("v", mine, grad, 0.01, implicit_momentum=0.5)
        # The reference: the optimizer's formulas over the whole arrays at once.
        state = whole._vars["v"]
        state.step += 1
        whole._update(state, reference, grad, np.float32(0.01), 0.5)
    assert np.array_equal(mine, reference)
    for slot, value in whole._vars["v"].slots.items():
        assert np.array_equal(blocked._vars["v"].slots[slot], value), slot
