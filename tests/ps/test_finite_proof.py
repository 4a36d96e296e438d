"""The cheap path of a checked update (issue 13's cost): ``Optimizer.proves_finite`` proves from
bounds that an update stays finite, the dense table then applies it in place, bit for bit as the
unchecked ``Optimizer.apply``, with no scratch copy; whatever the bounds cannot prove takes the
exact scratch path. The proof must be sound: whenever it says finite, the in-place update is."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.errors import GradientError
from elasticps.ps.model import Model
from elasticps.ps.optimizers import magnitude, make_optimizer
from elasticps.ps.rules import Gradient, RoundAveraging
from elasticps.ps.tables import DENSE, DenseSum, DenseTable
from elasticps.ps.versions import ModelVersion

CONFIGS: dict[str, OptimizerConfig] = {
    "sgd": OptimizerConfig("sgd", {"learning_rate": 0.1}),
    "momentum": OptimizerConfig("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    "nesterov": OptimizerConfig("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": 1.0}),
    "adam": OptimizerConfig("adam", {"learning_rate": 0.01}),
    "amsgrad": OptimizerConfig("adam", {"learning_rate": 0.01, "amsgrad": 1.0}),
    "adagrad": OptimizerConfig("adagrad", {"learning_rate": 0.1}),
    "rmsprop": OptimizerConfig("rmsprop", {"learning_rate": 0.01}),
    "rmsprop-momentum": OptimizerConfig("rmsprop", {"learning_rate": 0.01, "momentum": 0.5}),
    "rmsprop-centered": OptimizerConfig("rmsprop", {"learning_rate": 0.01, "centered": 1.0}),
}
PROVABLE = [name for name in CONFIGS if name != "rmsprop-centered"]


def _model(config: OptimizerConfig, dtype: Any = np.float32, seed: int = 0) -> Model:
    rng = np.random.default_rng(seed)
    tensors = {
        "kernel": rng.normal(size=(16, 8)).astype(dtype),
        "bias": rng.normal(size=(8,)).astype(dtype),
        "scale": np.array(1.5, dtype=dtype),
    }
    return Model(DenseTable.create(tensors), make_optimizer(config))


def _gradient(model: Model, seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        name: np.asarray((rng.normal(size=value.shape) * scale).astype(value.dtype))
        for name, value in model.dense.variables.items()
    }


def _race(pusher: Any, count: int) -> None:
    """``pusher(seed)`` in ``count`` threads at once; re-raises the first failure; fails on a deadlock."""
    failures: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            pusher(seed)
        except BaseException as err:  # pragma: no cover - reported below
            failures.append(err)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "deadlock"
    assert failures == []


@pytest.mark.parametrize("case", list(CONFIGS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_checked_update_is_bit_for_bit_the_unchecked_one(case: str, dtype: Any) -> None:
    checked, plain = _model(CONFIGS[case], dtype), _model(CONFIGS[case], dtype)
    for step in range(12):
        gradient = _gradient(checked, seed=step)
        checked.apply({DENSE: gradient}, lr=0.05)
        for name, value in gradient.items():
            plain.optimizer.apply(name, plain.dense.variables[name], value, 0.05)
    for name, value in plain.dense.variables.items():
        assert checked.dense.variables[name].tobytes() == value.tobytes(), name
    theirs = plain.optimizer.state()
    for key, value in checked.optimizer.state().items():
        assert value.tobytes() == theirs[key].tobytes(), key


@pytest.mark.parametrize("case", PROVABLE)
def test_an_ordinary_update_is_proven_and_applied_in_place_without_scratch(case: str) -> None:
    model = _model(CONFIGS[case])
    for step in range(3):
        gradient = _gradient(model, seed=step)
        for name, value in gradient.items():
            assert model.optimizer.proves_finite(name, model.dense.variables[name], value, 0.05), name
        model.apply({DENSE: gradient}, lr=0.05)
    assert model.dense._spare == []  # no scratch room was ever made


def test_centered_rmsprop_takes_the_exact_path() -> None:
    model = _model(CONFIGS["rmsprop-centered"])
    gradient = _gradient(model, seed=0)
    assert not model.optimizer.proves_finite("kernel", model.dense.variables["kernel"], gradient["kernel"], 0.05)
    model.apply({DENSE: gradient}, lr=0.05)
    assert len(model.dense._spare) == 1


@pytest.mark.parametrize("case", PROVABLE)
def test_a_finite_update_the_bounds_cannot_prove_is_applied_exactly(case: str) -> None:
    # Variables near float32's largest value: no bound proves the update, the scratch path finds
    # it finite and applies it, bit for bit as the unchecked update.
    checked, plain = _model(CONFIGS[case]), _model(CONFIGS[case])
    for model in (checked, plain):
        model.dense.variables["kernel"][0, 0] = 3e37
    gradient = _gradient(checked, seed=3, scale=1e-3)
    assert not checked.optimizer.proves_finite("kernel", checked.dense.variables["kernel"], gradient["kernel"], 0.05)
    checked.apply({DENSE: gradient}, lr=0.05)
    assert len(checked.dense._spare) == 1
    for name, value in gradient.items():
        plain.optimizer.apply(name, plain.dense.variables[name], value, 0.05)
    for name, value in plain.dense.variables.items():
        assert checked.dense.variables[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("case", list(CONFIGS))
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_proof_is_sound_over_extreme_magnitudes(case: str, dtype: Any) -> None:
    """Random variables, slots, gradients and learning rates spanning the dtype's range: whenever
    the proof says finite, the unchecked in-place update leaves everything finite."""
    rng = np.random.default_rng(hash((case, np.dtype(dtype).name)) % 2**32)
    top = float(np.log10(np.finfo(dtype).max))
    proven = 0
    for trial in range(600):
        model = _model(CONFIGS[case], dtype, seed=trial)
        optimizer, param = model.optimizer, model.dense.variables["kernel"]

        def scaled(shape: tuple[int, ...], positive: bool = False) -> np.ndarray:
            # One magnitude per array (so that some draws are small enough to be proven), its
            # values spread over eight decades below it, up to the dtype's largest value.
            level = rng.uniform(-6, top + 0.3)
            with np.errstate(over="ignore"):
                values = 10.0 ** (level - rng.uniform(0, 8, size=shape))
            values = np.minimum(values, float(np.finfo(dtype).max)).astype(dtype)
            return values if positive else values * rng.choice([-1, 1], size=shape).astype(dtype)

        param[...] = scaled(param.shape)
        for slot, arr in optimizer._vars["kernel"].slots.items():
            arr[...] = scaled(arr.shape, positive=slot in type(optimizer)._NON_NEGATIVE)
        optimizer._vars["kernel"].step = int(rng.integers(0, 5))
        grad = scaled(param.shape)
        lr = float(10 ** rng.uniform(-6, 4))
        if not optimizer.proves_finite("kernel", param, grad, lr):
            continue
        proven += 1
        with np.errstate(all="ignore"):
            optimizer.apply("kernel", param, grad, lr)
        assert np.isfinite(param).all(), (trial, lr)
        for slot, arr in optimizer._vars["kernel"].slots.items():
            assert np.isfinite(arr).all(), (trial, slot)
    if case != "rmsprop-centered" and dtype is not np.float16:
        assert proven > 10  # the proof is not vacuous


def test_a_slot_loaded_negative_is_never_proven() -> None:
    model = _model(CONFIGS["adam"])
    state = model.optimizer.state()
    state["slot/v/kernel"] = np.full((16, 8), -1.0, np.float32)
    model.optimizer.load_state(state)
    gradient = _gradient(model, seed=0)
    assert not model.optimizer.proves_finite("kernel", model.dense.variables["kernel"], gradient["kernel"], 0.01)
    assert model.optimizer.proves_finite("bias", model.dense.variables["bias"], gradient["bias"], 0.01)
    before = {name: value.copy() for name, value in model.dense.variables.items()}
    with pytest.raises(GradientError, match="kernel"):  # sqrt(-1): the exact path refuses it
        model.apply({DENSE: gradient}, lr=0.01)
    for name, value in before.items():
        np.testing.assert_array_equal(model.dense.variables[name], value)
    state["slot/v/kernel"] = np.zeros((16, 8), np.float32)
    model.optimizer.load_state(state)
    assert model.optimizer.proves_finite("kernel", model.dense.variables["kernel"], gradient["kernel"], 0.01)


def test_adam_with_a_small_beta_2_never_overlaps_updates_of_a_variable_even_without_use_locking() -> None:
    assert not _model(CONFIGS["adam"]).optimizer.serialises  # Keras's beta_2 = 0.999 may overlap
    model = _model(OptimizerConfig("adam", {"learning_rate": 0.01, "beta_2": 0.9}))
    assert model.optimizer.serialises
    staged = model.dense.stage(_gradient(model, seed=0), model.optimizer, 0.01, locking=False)
    got: list[bool] = []
    other = threading.Thread(target=lambda: got.append(model.dense._locks["kernel"].acquire(timeout=0.2)))
    other.start()
    other.join()
    assert got == [False]  # held from the proof to the commit
    staged.commit()
    assert model.dense._locks["kernel"].acquire(timeout=1)
    model.dense._locks["kernel"].release()
    # SGD needs no such thing: use_locking alone decides.
    sgd = _model(CONFIGS["momentum"])
    staged = sgd.dense.stage(_gradient(sgd, seed=0), sgd.optimizer, 0.01, locking=False)
    assert not sgd.dense._locks["kernel"].locked()
    staged.commit()


@pytest.mark.parametrize("case", ["momentum", "adam"])
def test_a_sync_round_proven_at_the_dry_run_applies_the_average_at_the_commit(case: str) -> None:
    model, plain = _model(CONFIGS[case]), _model(CONFIGS[case])
    rule, version = RoundAveraging(), ModelVersion()
    rule.reset(model)
    one, two = _gradient(model, seed=1), _gradient(model, seed=2)
    rule.push(model, version, Gradient({DENSE: one}, 0, 0.05, "a", "a0"))
    rule.push(model, version, Gradient({DENSE: two}, 0, 0.05, "b", "b0"))
    rule.commit(model, version, 0, ["a", "b"], dry_run=True)
    assert model.dense._spare == []  # proven: nothing computed aside
    outcome = rule.commit(model, version, 0, ["a", "b"])
    assert outcome.applied == ("a0", "b0")
    sums = {name: np.zeros_like(value) for name, value in one.items()}
    for name in sums:
        np.add(sums[name], one[name], out=sums[name])
        np.add(sums[name], two[name], out=sums[name])
        np.multiply(sums[name], 1.0 / 2, out=sums[name])
        plain.optimizer.apply(name, plain.dense.variables[name], sums[name], 0.05)
    for name, value in plain.dense.variables.items():
        assert model.dense.variables[name].tobytes() == value.tobytes(), name
    # The sums were cleared for the next round: what it adds is all they hold.
    sums_kept = rule._sums[DENSE]
    assert isinstance(sums_kept, DenseSum)
    assert all(not total.any() for total in sums_kept.averaged(1).values())
    sums_kept.clear()
    sums_kept.add(two)
    assert all(np.array_equal(total, two[name]) for name, total in sums_kept.averaged(1).items())


def test_magnitude_bounds_the_largest_value() -> None:
    rng = np.random.default_rng(0)
    for dtype in (np.float16, np.float32, np.float64):
        for _ in range(50):
            values = (rng.normal(size=1000) * 10 ** rng.uniform(-5, 3)).astype(dtype)
            assert magnitude(values) >= float(np.abs(values).max())
        assert magnitude(np.zeros(0, dtype)) == 0.0
        assert not magnitude(np.array([1.0, np.nan], dtype)) <= 1e300
        assert not magnitude(np.array([1.0, np.inf], dtype)) <= 1e300
    assert magnitude(np.ones((4, 4), np.float32)[:, ::2]) == 1.0  # not contiguous: exact max


def test_an_unlocked_exact_update_runs_alone() -> None:
    from elasticps.ps.tables import APPLY_ROOMS

    model = _model(CONFIGS["momentum"])
    model.dense.variables["kernel"][0, 0] = 3e37  # no bound proves it: the exact path
    staged = model.dense.stage(_gradient(model, seed=0), model.optimizer, 0.01, locking=False)
    assert not model.dense._rooms.acquire(blocking=False)  # it holds every room
    staged.commit()
    for _ in range(APPLY_ROOMS):  # all given back
        assert model.dense._rooms.acquire(blocking=False)
    for _ in range(APPLY_ROOMS):
        model.dense._rooms.release()
    # A proven one holds one room, and so does a locked exact one.
    staged = model.dense.stage(_gradient(model, seed=1), model.optimizer, 0.01, locking=True)
    assert model.dense._rooms.acquire(blocking=False)
    model.dense._rooms.release()
    staged.discard()


@pytest.mark.parametrize("case", ["momentum", "adam", "rmsprop-centered"])
@pytest.mark.parametrize("locking", [False, True])
def test_concurrent_pushes_mixing_both_paths_neither_deadlock_nor_leave_non_finite_values(
    case: str, locking: bool
) -> None:
    from elasticps.ps.tables import APPLY_ROOMS

    model = _model(CONFIGS[case])

    def pusher(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for step in range(40):
            # Now and then a gradient the bounds cannot prove (the exact path), at times one whose
            # update overflows (refused).
            scale = float(rng.choice([1e-3, 1e-3, 1e-3, 1e33, 1e36]))
            try:
                gradient = _gradient(model, seed=seed * 100 + step, scale=scale)
                model.apply({DENSE: gradient}, 1e4 if scale > 1 else 0.01, locking=locking)
            except GradientError:
                pass

    _race(pusher, 8)
    for name, value in model.dense.variables.items():
        assert np.isfinite(value).all(), name
    for key, value in model.optimizer.state().items():
        assert np.isfinite(value).all(), key
    for _ in range(APPLY_ROOMS):  # every room given back
        assert model.dense._rooms.acquire(blocking=False)
    assert not any(lock.locked() for lock in model.dense._locks.values())
    assert model.dense._spare  # the exact path ran too


def test_the_bound_a_check_measured_serves_only_the_same_arrays_once() -> None:
    model = _model(CONFIGS["momentum"])
    gradient = _gradient(model, seed=0)
    model.dense.check(gradient)
    assert model.dense._bound("kernel", gradient["kernel"]) == magnitude(gradient["kernel"])
    assert model.dense._bound("kernel", gradient["kernel"].copy()) is None  # another array
    model.dense.stage(gradient, model.optimizer, 0.01).commit()
    assert model.dense._bound("kernel", gradient["kernel"]) is None  # used once
    seen: list[float | None] = []
    other = threading.Thread(target=lambda: seen.append(model.dense._bound("kernel", gradient["kernel"])))
    model.dense.check(gradient)
    other.start()
    other.join()
    assert seen == [None]  # another thread's check


@pytest.mark.parametrize("locking", [True, False], ids=["locked", "unlocked"])
@pytest.mark.parametrize("case", PROVABLE)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_carried_bounds_stay_bounds_push_after_push(case: str, dtype: Any, locking: bool) -> None:
    """Updates carry the bounds the proof computed instead of measuring again (serialised ones
    take them on when applied, unlocked ones reserve them): they must stay above the true
    magnitudes, and measuring takes over when they grow too loose to prove anything."""
    model = _model(CONFIGS[case], dtype)
    rng = np.random.default_rng(1)
    measured = 0
    for step in range(300):
        scale = float(10 ** rng.uniform(-4, 0))
        gradient = _gradient(model, seed=step, scale=scale)
        try:
            model.apply({DENSE: gradient}, lr=float(10 ** rng.uniform(-3, 0)), locking=locking)
        except GradientError:
            continue
        for name, value in model.dense.variables.items():
            var = model.optimizer._vars[name]
            if var.bounds is None:
                measured += 1
                continue
            assert var.bounds[0] >= float(np.abs(value.astype(np.float64)).max()), (step, name)
            for slot, arr in var.slots.items():
                assert var.bounds[1][slot] >= float(np.abs(arr.astype(np.float64)).max()), (step, name, slot)
    for value in model.dense.variables.values():
        assert np.isfinite(value).all()


@pytest.mark.parametrize("case", ["sgd", "momentum", "adagrad", "rmsprop-momentum"])
def test_unlocked_updates_overlapping_keep_the_reserved_bounds_above_the_values(case: str) -> None:
    """Unlocked updates racing on one variable reserve their bounds before they write: once all
    are done, every value and slot is below the bounds the variable carries, and no update had to
    measure after the first (one pass per push: its gradient's)."""
    model = _model(CONFIGS[case])
    measured: list[int] = []
    real = model.optimizer._bounded

    def counting(*args: Any, **kwargs: Any) -> Any:
        new, was_measured = real(*args, **kwargs)
        if was_measured:
            measured.append(1)
        return new, was_measured

    model.optimizer._bounded = counting  # type: ignore[method-assign]

    def pusher(seed: int) -> None:
        for step in range(50):
            model.apply({DENSE: _gradient(model, seed=seed * 100 + step, scale=0.1)}, 0.05, locking=False)

    _race(pusher, 6)
    assert len(measured) == len(model.dense.variables)  # each variable once, at its first push
    for name, value in model.dense.variables.items():
        var = model.optimizer._vars[name]
        assert var.bounds is not None, name
        assert var.bounds[0] >= float(np.abs(value.astype(np.float64)).max()), name
        for slot, arr in var.slots.items():
            assert var.bounds[1][slot] >= float(np.abs(arr.astype(np.float64)).max()), (name, slot)


@pytest.mark.parametrize("beta_2", [0.999, 0.93])
def test_unlocked_adam_updates_overlapping_keep_the_second_moment_non_negative(beta_2: float) -> None:
    """Adam with a beta_2 that lets updates of a variable overlap (see Optimizer.serialises):
    many threads racing leave every second moment >= 0 and everything finite."""
    model = _model(OptimizerConfig("adam", {"learning_rate": 0.01, "beta_2": beta_2}))
    assert not model.optimizer.serialises

    def pusher(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for step in range(60):
            scale = float(rng.choice([1e-3, 1.0, 30.0]))  # second moments swinging up and down
            model.apply({DENSE: _gradient(model, seed=seed * 100 + step, scale=scale)}, 0.01, locking=False)

    _race(pusher, 6)
    for name in model.dense.variables:
        assert (model.optimizer._vars[name].slots["v"] >= 0).all(), name
    for key, value in model.optimizer.state().items():
        assert np.isfinite(value).all(), key
