"""The synchronous rules of the parameter store (seed 000), on ParameterStore directly.

A gradient is accepted only when ``0 <= version_ps - version <= sync_version_tolerance``; the store
sums ``grads_to_wait`` accepted gradients, applies their average once, and bumps the version by one.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.store import ParameterStore, StoreSettings

SGD = OptimizerConfig("sgd", {"learning_rate": 0.1})
LR = 0.1


def initial() -> dict[str, np.ndarray]:
    return {
        "dense/kernel": np.array([[1.0, -2.0], [0.5, 4.0]], dtype=np.float32),
        "dense/bias": np.array([0.25, -1.5, 3.0], dtype=np.float64),
    }


def grads(scale: float) -> dict[str, np.ndarray]:
    return {
        "dense/kernel": np.array([[1.0, 2.0], [-3.0, 0.5]], dtype=np.float32) * np.float32(scale),
        "dense/bias": np.array([2.0, -1.0, 0.5], dtype=np.float64) * scale,
    }


def sgd_step(params: dict[str, np.ndarray], gradient: dict[str, np.ndarray], lr: float) -> dict[str, np.ndarray]:
    """What plain SGD gives, computed the same way (in the variable's dtype): param - grad * lr."""
    return {n: p - gradient[n] * p.dtype.type(lr) for n, p in params.items()}


def make_store(**settings: object) -> ParameterStore:
    store = ParameterStore(StoreSettings(**settings))  # type: ignore[arg-type]
    assert store.initialize(initial(), SGD)
    return store


def current(store: ParameterStore) -> dict[str, np.ndarray]:
    with store.reading() as (_, variables):
        return {n: v.copy() for n, v in variables.items()}


def assert_params(store: ParameterStore, expected: dict[str, np.ndarray]) -> None:
    got = current(store)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def step_counts(store: ParameterStore) -> dict[str, int]:
    return {k: int(v) for k, v in store.optimizer.state().items() if k.startswith("step/")}


def test_gradient_of_the_current_version_is_applied_and_bumps_the_version() -> None:
    store = make_store()
    outcome = store.push(grads(1.0), version=0)
    assert outcome.accepted is True
    assert outcome.version == 1
    assert outcome.staleness == 0
    assert outcome.learning_rate == LR
    assert store.version == 1
    assert_params(store, sgd_step(initial(), grads(1.0), LR))


def test_explicit_learning_rate_of_the_push_is_used() -> None:
    store = make_store()
    outcome = store.push(grads(1.0), version=0, learning_rate=0.5)
    assert outcome.learning_rate == 0.5
    assert_params(store, sgd_step(initial(), grads(1.0), 0.5))


def test_gradient_of_an_older_version_is_rejected_and_changes_nothing() -> None:
    store = make_store()
    store.push(grads(1.0), version=0)
    before = current(store)
    outcome = store.push(grads(7.0), version=0)
    assert outcome.accepted is False
    assert outcome.version == 1
    assert outcome.staleness == 1
    assert outcome.learning_rate == 0.0
    assert store.version == 1
    assert_params(store, before)


def test_rejected_gradient_is_not_accumulated() -> None:
    store = make_store(grads_to_wait=2)
    store.push(grads(1.0), version=0)
    store.push(grads(3.0), version=0)  # applies the average, version 1
    after_first = current(store)
    assert not store.push(grads(100.0), version=0).accepted  # stale: must not count
    assert store.push(grads(1.0), version=1).accepted
    assert store.version == 1  # only one accepted gradient towards version 2
    assert_params(store, after_first)
    assert store.push(grads(5.0), version=1).accepted
    assert store.version == 2
    assert_params(store, sgd_step(after_first, grads(3.0), LR))  # mean of 1 and 5


def test_grads_to_wait_two_averages_and_applies_once() -> None:
    store = make_store(grads_to_wait=2)
    first = store.push(grads(1.0), version=0)
    assert first.accepted is True
    assert first.version == 0
    assert store.version == 0
    assert_params(store, initial())
    assert step_counts(store) == {"step/dense/kernel": 0, "step/dense/bias": 0}

    second = store.push(grads(3.0), version=0)
    assert second.accepted is True
    assert second.version == 1
    assert store.version == 1
    # The average (1 + 3) / 2 = 2 applied once, not the sum and not twice.
    average = {n: (g1 + g3) * g1.dtype.type(0.5) for (n, g1), g3 in zip(grads(1.0).items(), grads(3.0).values())}
    expected = sgd_step(initial(), average, LR)
    assert_params(store, expected)
    np.testing.assert_array_equal(expected["dense/bias"], np.array([0.25, -1.5, 3.0]) - np.array([4.0, -2.0, 1.0]) * 0.1)
    assert step_counts(store) == {"step/dense/kernel": 1, "step/dense/bias": 1}

    # The accumulator was reset: the next round averages only its own gradients.
    store.push(grads(2.0), version=1)
    store.push(grads(2.0), version=1)
    assert store.version == 2
    assert_params(store, sgd_step(expected, grads(2.0), LR))


def test_the_caller_gradients_are_not_modified() -> None:
    store = make_store(grads_to_wait=2)
    sent = grads(3.0)
    store.push(sent, version=0)
    store.push(grads(1.0), version=0)
    for name, value in grads(3.0).items():
        np.testing.assert_array_equal(sent[name], value)


def test_version_tolerance_one_accepts_one_behind_rejects_two_behind() -> None:
    store = make_store(sync_version_tolerance=1)
    store.push(grads(1.0), version=0)
    store.push(grads(1.0), version=1)
    assert store.version == 2
    before = current(store)

    too_old = store.push(grads(1.0), version=0)
    assert too_old.accepted is False
    assert too_old.staleness == 2
    assert store.version == 2
    assert_params(store, before)

    one_behind = store.push(grads(1.0), version=1)
    assert one_behind.accepted is True
    assert one_behind.staleness == 1
    assert one_behind.version == 3
    assert_params(store, sgd_step(before, grads(1.0), LR))


def test_tolerance_zero_rejects_one_behind() -> None:
    store = make_store()
    store.push(grads(1.0), version=0)
    assert store.push(grads(1.0), version=0).accepted is False


def test_future_version_is_rejected() -> None:
    """A gradient from a version the PS never reached (the PS restarted from an older checkpoint)."""
    store = make_store(sync_version_tolerance=3)
    outcome = store.push(grads(1.0), version=1)
    assert outcome.accepted is False
    assert outcome.version == 0
    assert outcome.learning_rate == 0.0
    assert store.version == 0
    assert_params(store, initial())


def test_backup_workers_third_push_after_the_update_is_rejected() -> None:
    """grads_to_wait=2 with 3 workers: the slowest worker's gradient (of the old version) is dropped."""
    store = make_store(grads_to_wait=2)
    a = store.push(grads(1.0), version=0)
    b = store.push(grads(3.0), version=0)
    assert (a.accepted, a.version, b.accepted, b.version) == (True, 0, True, 1)
    after_update = current(store)
    c = store.push(grads(50.0), version=0)
    assert c.accepted is False
    assert c.version == 1
    assert store.version == 1
    assert_params(store, after_update)
    # The dropped gradient did not start the next round either.
    store.push(grads(1.0), version=1)
    assert store.version == 1
    assert_params(store, after_update)


def test_sync_reading_is_consistent_an_update_waits_for_the_reader() -> None:
    store = make_store()
    done = threading.Event()

    def push() -> None:
        store.push(grads(1.0), version=0)
        done.set()

    with store.reading() as (version, variables):
        pusher = threading.Thread(target=push)
        pusher.start()
        assert not done.wait(0.2)  # blocked behind the reader
        assert version == 0
        np.testing.assert_array_equal(variables["dense/bias"], initial()["dense/bias"])
    pusher.join(10)
    assert done.is_set()
    assert store.version == 1


def test_grads_to_wait_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="grads_to_wait"):
        ParameterStore(StoreSettings(grads_to_wait=0))


@pytest.mark.parametrize(
    "config",
    [
        OptimizerConfig("sgd", {"learning_rate": 0.1}),
        OptimizerConfig("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": 1.0}),
        OptimizerConfig("adam", {"learning_rate": 0.1}),
        OptimizerConfig("adam", {"learning_rate": 0.1, "amsgrad": 1.0}),
        OptimizerConfig("adagrad", {"learning_rate": 0.1}),
        OptimizerConfig("rmsprop", {"learning_rate": 0.1, "momentum": 0.5, "centered": 1.0}),
    ],
    ids=lambda c: f"{c.name}-{'-'.join(sorted(c.params))}",
)
def test_scalar_variable_updates_like_a_one_element_vector(config: OptimizerConfig) -> None:
    """A 0-d variable (a Keras scalar weight) gets exactly the update of a shape-(1,) one."""
    store = ParameterStore(StoreSettings())
    store.initialize({"scalar": np.array(1.5, dtype=np.float32), "vector": np.array([1.5], dtype=np.float32)}, config)
    for step, g in enumerate([0.5, -2.0, 1.25]):
        outcome = store.push(
            {"scalar": np.array(g, dtype=np.float32), "vector": np.array([g], dtype=np.float32)}, version=step
        )
        assert outcome.accepted
    params = current(store)
    assert params["scalar"].shape == ()
    assert params["scalar"] != np.float32(1.5)
    np.testing.assert_array_equal(params["scalar"].reshape(1), params["vector"])
    state = store.optimizer.state()
    for key, value in state.items():
        if key.endswith("/scalar"):
            assert value.shape == ()
            np.testing.assert_array_equal(value.reshape(-1), state[key.removesuffix("scalar") + "vector"].reshape(-1), err_msg=key)
