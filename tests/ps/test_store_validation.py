"""The store refuses bad gradients and models before anything changes (both modes)."""

from __future__ import annotations

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.store import GradientError, ParameterStore, RoundError, StoreSettings, UninitializedError

SGD = OptimizerConfig("sgd", {"learning_rate": 0.1})
RULES = pytest.mark.parametrize("rule", [UpdateRule.SYNC, UpdateRule.ASYNC], ids=["sync", "async"])


def initial() -> dict[str, np.ndarray]:
    return {
        "kernel": np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32),
        "bias": np.array([0.5, -0.5, 1.5], dtype=np.float32),
    }


def good() -> dict[str, np.ndarray]:
    return {"kernel": np.ones((2, 3), dtype=np.float32), "bias": np.ones(3, dtype=np.float32)}


def with_value(name: str, index: tuple[int, ...], value: float) -> dict[str, np.ndarray]:
    gradient = good()
    gradient[name][index] = value
    return gradient


BAD: dict[str, tuple[dict[str, np.ndarray], str]] = {
    "wrong shape": ({**good(), "kernel": np.ones((3, 2), dtype=np.float32)}, "shape"),
    "wrong rank": ({**good(), "bias": np.ones((1, 3), dtype=np.float32)}, "shape"),
    "wrong dtype": ({**good(), "bias": np.ones(3, dtype=np.float64)}, "dtype"),
    "unknown variable": ({**good(), "other": np.ones(3, dtype=np.float32)}, "other"),
    "missing variable": ({"kernel": np.ones((2, 3), dtype=np.float32)}, "bias"),
    "nan": (with_value("kernel", (1, 2), float("nan")), "NaN"),
    "+inf": (with_value("bias", (0,), float("inf")), "infinity"),
    "-inf": (with_value("bias", (2,), float("-inf")), "infinity"),
    "+inf and -inf": ({**with_value("bias", (0,), float("inf")), "kernel": with_value("kernel", (0, 0), float("-inf"))["kernel"]}, "infinity"),
}


def make_store(rule: UpdateRule) -> ParameterStore:
    store = ParameterStore(StoreSettings(mode=TrainingMode(rule=rule)))
    assert store.initialize(initial(), SGD)
    return store


def update(store: ParameterStore, gradient: dict[str, np.ndarray], version: int, worker: str = "w") -> None:
    """One applied update in either mode: sync stages the push, then commits a round of it alone."""
    assert store.push(gradient, version=version, worker=worker).accepted
    if store.settings.mode.rule is UpdateRule.SYNC:
        store.commit(version, [worker])


def snapshot(store: ParameterStore) -> tuple[int, dict[str, np.ndarray]]:
    with store.reading() as (_, version, variables):
        return version, {n: v.copy() for n, v in variables.items()}


@RULES
@pytest.mark.parametrize("case", list(BAD))
def test_bad_gradient_is_refused_and_nothing_changes(rule: UpdateRule, case: str) -> None:
    gradient, named = BAD[case]
    store = make_store(rule)
    update(store, good(), version=0)
    version, before = snapshot(store)
    with pytest.raises(GradientError, match=named):
        store.push(gradient, version=version)
    after_version, after = snapshot(store)
    assert after_version == version == 1
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert {k: int(v) for k, v in store.optimizer.state().items()} == {"step/kernel": 1, "step/bias": 1}


@pytest.mark.parametrize("case", ["wrong shape", "nan", "+inf and -inf", "missing variable"])
def test_refused_gradient_is_not_staged_in_sync(case: str) -> None:
    store = make_store(UpdateRule.SYNC)
    with pytest.raises(GradientError):
        store.push(BAD[case][0], version=0, worker="bad")
    with pytest.raises(RoundError, match="no staged gradient"):
        store.commit(0, ["bad"], dry_run=True)  # the refused push was not staged
    store.push(good(), version=0, worker="a")
    tripled = {n: g * np.float32(3.0) for n, g in good().items()}
    store.push(tripled, version=0, worker="b")
    with pytest.raises(GradientError):
        store.push(BAD[case][0], version=0, worker="b")  # refused: b's staged gradient stays
    assert store.version == 0
    store.commit(0, ["a", "b"])
    assert store.version == 1
    _, after = snapshot(store)
    for name, value in initial().items():
        np.testing.assert_array_equal(after[name], value - np.float32(2.0) * np.float32(0.1), err_msg=name)


def test_nan_in_float16_gradient_is_refused() -> None:
    store = ParameterStore(StoreSettings())
    store.initialize({"h": np.zeros(4, dtype=np.float16)}, SGD)
    with pytest.raises(GradientError, match="NaN"):
        store.push({"h": np.array([1, 2, np.nan, 3], dtype=np.float16)}, version=0)
    assert store.version == 0


def test_large_finite_gradient_is_accepted() -> None:
    """Finite values whose sum overflows are still finite: the check must not refuse them."""
    store = ParameterStore(StoreSettings())
    store.initialize({"w": np.zeros(4, dtype=np.float32), "h": np.zeros(3, dtype=np.float16)}, SGD)
    outcome = store.push(
        {"w": np.full(4, 3e38, dtype=np.float32), "h": np.full(3, 60000, dtype=np.float16)}, version=0, worker="a"
    )
    assert outcome.accepted is True
    store.commit(0, ["a"])
    _, after = snapshot(store)
    np.testing.assert_array_equal(after["w"], np.full(4, -(np.float32(3e38) * np.float32(0.1)), dtype=np.float32))


def test_large_finite_initial_model_is_accepted() -> None:
    store = ParameterStore(StoreSettings())
    assert store.initialize({"w": np.full(4, 1e308)}, SGD)
    _, after = snapshot(store)
    np.testing.assert_array_equal(after["w"], np.full(4, 1e308))


@RULES
def test_push_before_initialize_raises_uninitialized(rule: UpdateRule) -> None:
    store = ParameterStore(StoreSettings(mode=TrainingMode(rule=rule)))
    assert store.initialized is False
    with pytest.raises(UninitializedError):
        store.push(good(), version=0)
    assert store.version == 0
    assert store.initialized is False


def test_initialize_twice_keeps_the_first_model() -> None:
    store = ParameterStore(StoreSettings())
    assert store.initialize(initial(), SGD) is True
    other = {n: v + np.float32(100) for n, v in initial().items()}
    assert store.initialize(other, OptimizerConfig("adam", {"learning_rate": 0.5})) is False
    version, after = snapshot(store)
    assert version == 0
    for name, value in initial().items():
        np.testing.assert_array_equal(after[name], value)
    assert store.optimizer.config.name == "sgd"
    assert store.optimizer.learning_rate == 0.1


def test_initialize_copies_the_given_arrays() -> None:
    given = initial()
    store = ParameterStore(StoreSettings())
    store.initialize(given, SGD)
    given["bias"][:] = 99.0
    _, after = snapshot(store)
    np.testing.assert_array_equal(after["bias"], initial()["bias"])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_initial_model_that_is_not_finite_is_refused(bad: float) -> None:
    store = ParameterStore(StoreSettings())
    model = initial()
    model["kernel"][0, 1] = bad
    with pytest.raises(GradientError, match="kernel"):
        store.initialize(model, SGD)
    assert store.initialized is False
    # The refused model left the shard empty: a good one can still be pushed.
    assert store.initialize(initial(), SGD) is True


def test_initial_model_with_an_integer_variable_is_refused() -> None:
    store = ParameterStore(StoreSettings())
    with pytest.raises(GradientError, match="steps"):
        store.initialize({**initial(), "steps": np.zeros(2, dtype=np.int64)}, SGD)
    assert store.initialized is False


@RULES
@pytest.mark.parametrize("learning_rate", [float("inf"), float("-inf"), float("nan"), -0.1])
def test_bad_push_learning_rate_is_refused_and_nothing_changes(rule: UpdateRule, learning_rate: float) -> None:
    store = make_store(rule)
    with pytest.raises(GradientError, match="learning rate"):
        store.push(
            {n: g * np.float32(50) for n, g in good().items()}, version=0, learning_rate=learning_rate, worker="w"
        )
    version, after = snapshot(store)
    assert version == 0
    for name, value in initial().items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    # Nothing of the refused push was kept: the next push applies exactly its own gradient.
    update(store, good(), version=0)
    _, after = snapshot(store)
    for name, value in initial().items():
        np.testing.assert_array_equal(after[name], value - np.float32(0.1), err_msg=name)
