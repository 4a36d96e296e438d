"""The PS's numpy optimizers reproduce Keras 3's optimizers step for step."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from elasticps.api.optimizer import OptimizerConfig, OptimizerError  # noqa: E402
from elasticps.ps.optimizers import Optimizer, make_optimizer  # noqa: E402

SHAPES = {"dense/kernel": (7, 5), "dense/bias": (5,)}
STEPS = 20

# (PS name, hyper-parameters as the PS takes them, the Keras class and kwargs).
# Non-default values so that every option's code path is exercised.
CASES: dict[str, tuple[str, dict[str, float], Any, dict[str, Any]]] = {
    "sgd": ("sgd", {"learning_rate": 0.05}, keras.optimizers.SGD, {"learning_rate": 0.05}),
    "sgd-momentum": (
        "sgd",
        {"learning_rate": 0.05, "momentum": 0.9},
        keras.optimizers.SGD,
        {"learning_rate": 0.05, "momentum": 0.9},
    ),
    "sgd-nesterov": (
        "sgd",
        {"learning_rate": 0.05, "momentum": 0.8, "nesterov": 1.0},
        keras.optimizers.SGD,
        {"learning_rate": 0.05, "momentum": 0.8, "nesterov": True},
    ),
    "adam": (
        "adam",
        {"learning_rate": 0.01, "beta_1": 0.85, "beta_2": 0.99, "epsilon": 1e-6},
        keras.optimizers.Adam,
        {"learning_rate": 0.01, "beta_1": 0.85, "beta_2": 0.99, "epsilon": 1e-6},
    ),
    "adam-amsgrad": (
        "adam",
        {"learning_rate": 0.01, "amsgrad": 1.0},
        keras.optimizers.Adam,
        {"learning_rate": 0.01, "amsgrad": True},
    ),
    "adagrad": (
        "adagrad",
        {"learning_rate": 0.1, "initial_accumulator_value": 0.2},
        keras.optimizers.Adagrad,
        {"learning_rate": 0.1, "initial_accumulator_value": 0.2},
    ),
    "rmsprop": ("rmsprop", {"learning_rate": 0.01}, keras.optimizers.RMSprop, {"learning_rate": 0.01}),
    "rmsprop-momentum": (
        "rmsprop",
        {"learning_rate": 0.01, "rho": 0.8, "momentum": 0.9},
        keras.optimizers.RMSprop,
        {"learning_rate": 0.01, "rho": 0.8, "momentum": 0.9},
    ),
    "rmsprop-centered": (
        "rmsprop",
        {"learning_rate": 0.01, "momentum": 0.5, "centered": 1.0},
        keras.optimizers.RMSprop,
        {"learning_rate": 0.01, "momentum": 0.5, "centered": True},
    ),
}


def _initial_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}


def _gradients(steps: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()} for _ in range(steps)
    ]


def _ours(name: str, params: dict[str, float], init: dict[str, np.ndarray]) -> tuple[Optimizer, dict[str, np.ndarray]]:
    opt = make_optimizer(OptimizerConfig(name, params))
    values = {var: arr.copy() for var, arr in init.items()}
    for var, arr in values.items():
        opt.register(var, arr.shape, arr.dtype)
    return opt, values


def _keras(
    cls: Any, kwargs: dict[str, Any], init: dict[str, np.ndarray], grads: Sequence[dict[str, np.ndarray]], names: Sequence[str]
) -> dict[str, np.ndarray]:
    """Run the Keras optimizer eagerly on variables ``names`` only."""
    opt = cls(**kwargs)
    variables = [keras.Variable(init[n].copy(), name=n.replace("/", "_")) for n in names]
    for step in grads:
        opt.apply_gradients(zip([step[n] for n in names], variables))
    return {n: np.asarray(v.numpy()) for n, v in zip(names, variables)}


def _assert_close(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
    for name, expected in theirs.items():
        np.testing.assert_allclose(ours[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_keras(case: str) -> None:
    name, params, cls, kwargs = CASES[case]
    init, grads = _initial_params(), _gradients(STEPS)
    opt, values = _ours(name, params, init)
    for step in grads:
        for var, grad in step.items():
            opt.apply(var, values[var], grad, opt.learning_rate)
    expected = _keras(cls, kwargs, init, grads, list(SHAPES))
    _assert_close(values, expected)
    # Something actually moved (a no-op optimizer would otherwise pass on
    # tiny learning rates).
    assert not np.allclose(values["dense/kernel"], init["dense/kernel"])
    for arr in values.values():
        assert arr.dtype == np.float32


@pytest.mark.parametrize("case", sorted(CASES))
def test_learning_rate_is_the_one_passed_to_apply(case: str) -> None:
    name, params, cls, kwargs = CASES[case]
    init, grads = _initial_params(), _gradients(8)
    opt, values = _ours(name, params, init)
    lr = opt.learning_rate / 3
    for step in grads:
        for var, grad in step.items():
            opt.apply(var, values[var], grad, lr)
    assert opt.learning_rate == params["learning_rate"]  # not mutated by apply
    expected = _keras(cls, {**kwargs, "learning_rate": lr}, init, grads, list(SHAPES))
    _assert_close(values, expected)


@pytest.mark.parametrize("case", ["adam", "adam-amsgrad"])
def test_step_counts_are_per_variable(case: str) -> None:
    # Adam's bias correction depends on the step: B updated twice while A is
    # updated five times must look like a Keras optimizer that saw B's two
    # gradients only.
    name, params, cls, kwargs = CASES[case]
    init = _initial_params()
    grads = _gradients(5)
    opt, values = _ours(name, params, init)
    order = ["dense/kernel", "dense/kernel", "dense/bias", "dense/kernel", "dense/kernel", "dense/bias", "dense/kernel"]
    used = {"dense/kernel": 0, "dense/bias": 0}
    for var in order:
        opt.apply(var, values[var], grads[used[var]][var], opt.learning_rate)
        used[var] += 1
    assert used == {"dense/kernel": 5, "dense/bias": 2}
    state = opt.state()
    assert int(state["step/dense/kernel"]) == 5
    assert int(state["step/dense/bias"]) == 2
    _assert_close(values, _keras(cls, kwargs, init, grads[:2], ["dense/bias"]))
    _assert_close(values, _keras(cls, kwargs, init, grads, ["dense/kernel"]))


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_round_trip_continues_identically(case: str) -> None:
    name, params, _, _ = CASES[case]
    init, grads = _initial_params(), _gradients(10)
    first, values = _ours(name, params, init)
    for step in grads[:5]:
        for var, grad in step.items():
            first.apply(var, values[var], grad, first.learning_rate)

    state = first.state()
    for var in SHAPES:
        step_count = state[f"step/{var}"]
        assert step_count.shape == () and step_count.dtype == np.int64 and int(step_count) == 5
    assert all(key.startswith(("slot/", "step/")) for key in state)

    # A fresh optimizer loaded from the checkpoint, plus the parameters.
    second = make_optimizer(first.config)
    for var, arr in values.items():
        second.register(var, arr.shape, arr.dtype)
    second.load_state({**state, **{f"param/{k}": v for k, v in values.items()}})
    resumed = {var: arr.copy() for var, arr in values.items()}
    # state() handed out copies: scribbling on them changes nothing.
    for arr in state.values():
        arr[...] = 0

    for step in grads[5:]:
        for var, grad in step.items():
            first.apply(var, values[var], grad, first.learning_rate)
            second.apply(var, resumed[var], grad, second.learning_rate)
    for var in SHAPES:
        np.testing.assert_array_equal(resumed[var], values[var])
    after_first, after_second = first.state(), second.state()
    assert after_first.keys() == after_second.keys()
    for key in after_first:
        np.testing.assert_array_equal(after_second[key], after_first[key])


def test_load_state_rejects_missing_misshapen_and_foreign_keys() -> None:
    opt, _ = _ours("adam", {}, _initial_params())
    good = opt.state()

    missing = dict(good)
    del missing["slot/v/dense/bias"]
    with pytest.raises(OptimizerError, match="slot/v/dense/bias"):
        opt.load_state(missing)

    misshapen = dict(good)
    misshapen["slot/m/dense/kernel"] = np.zeros((5, 7), np.float32)
    with pytest.raises(OptimizerError, match="slot/m/dense/kernel"):
        opt.load_state(misshapen)

    bad_step = {**good, "step/dense/bias": np.array(1.5)}
    with pytest.raises(OptimizerError, match="step/dense/bias"):
        opt.load_state(bad_step)

    # A checkpoint of Adam with AMSGrad has a slot this optimizer lacks.
    with pytest.raises(OptimizerError, match="v_hat"):
        opt.load_state({**good, "slot/v_hat/dense/bias": np.zeros(5, np.float32)})

    # Nothing was changed by the failed loads.
    for key, arr in opt.state().items():
        np.testing.assert_array_equal(arr, good[key])


def test_normalised_config_has_keras_defaults() -> None:
    expected = {
        "sgd": {"learning_rate": 0.01, "momentum": 0.0, "nesterov": 0.0},
        "adam": {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "amsgrad": 0.0},
        "adagrad": {"learning_rate": 0.001, "initial_accumulator_value": 0.1, "epsilon": 1e-7},
        "rmsprop": {"learning_rate": 0.001, "rho": 0.9, "momentum": 0.0, "epsilon": 1e-7, "centered": 0.0},
    }
    for name, params in expected.items():
        opt = make_optimizer(OptimizerConfig(name, {}))
        assert opt.config == OptimizerConfig(name, params)
        assert opt.learning_rate == params["learning_rate"]
    assert make_optimizer(OptimizerConfig("sgd", {"nesterov": True})).config.params["nesterov"] == 1.0


def test_slots_follow_options() -> None:
    def slots(name: str, params: dict[str, float]) -> set[str]:
        opt = make_optimizer(OptimizerConfig(name, params))
        opt.register("w", (3,), np.float32)
        return {key.split("/")[1] for key in opt.state() if key.startswith("slot/")}

    assert slots("sgd", {"nesterov": 1.0}) == set()
    assert slots("sgd", {"momentum": 0.9}) == {"momentum"}
    assert slots("adam", {}) == {"m", "v"}
    assert slots("adam", {"amsgrad": 1.0}) == {"m", "v", "v_hat"}
    assert slots("adagrad", {}) == {"accumulator"}
    assert slots("rmsprop", {}) == {"velocity"}
    assert slots("rmsprop", {"momentum": 0.9, "centered": 1.0}) == {"velocity", "momentum", "average_gradient"}


@pytest.mark.parametrize(
    ("name", "params", "named"),
    [
        ("adamw", {}, "adamw"),
        ("Adam", {}, "Adam"),
        ("sgd", {"beta_1": 0.9}, "beta_1"),
        ("adam", {"rho": 0.9}, "rho"),
        ("rmsprop", {"learning_rat": 0.1}, "learning_rat"),
        ("sgd", {"learning_rate": 0.0}, "learning_rate"),
        ("adam", {"learning_rate": -1e-3}, "learning_rate"),
        ("adam", {"learning_rate": float("nan")}, "learning_rate"),
        ("sgd", {"momentum": 1.5}, "momentum"),
        ("sgd", {"nesterov": 0.5}, "nesterov"),
        ("adam", {"beta_1": 1.0}, "beta_1"),
        ("adam", {"epsilon": -1.0}, "epsilon"),
        ("adagrad", {"initial_accumulator_value": -0.1}, "initial_accumulator_value"),
        ("rmsprop", {"centered": 2.0}, "centered"),
        ("rmsprop", {"rho": "0.9"}, "rho"),
    ],
)
def test_invalid_configs_raise_naming_the_culprit(name: str, params: dict[str, Any], named: str) -> None:
    with pytest.raises(OptimizerError, match=named):
        make_optimizer(OptimizerConfig(name, params))


def test_apply_rejects_misuse() -> None:
    opt, values = _ours("sgd", {}, _initial_params())
    bias = values["dense/bias"]
    with pytest.raises(OptimizerError, match="dense/other"):
        opt.apply("dense/other", bias, bias, 0.1)
    with pytest.raises(OptimizerError, match="dense/bias"):
        opt.apply("dense/bias", bias, np.zeros(4, np.float32), 0.1)
    with pytest.raises(OptimizerError, match="dense/bias"):
        opt.register("dense/bias", (5,), np.float32)
    with pytest.raises(OptimizerError, match="learning rate"):
        opt.apply("dense/bias", bias, bias.copy(), -0.1)


def test_gradient_is_cast_and_left_untouched() -> None:
    init = _initial_params()
    grad64 = np.random.default_rng(3).standard_normal(SHAPES["dense/bias"])
    original = grad64.copy()
    a, values_a = _ours("adam", {}, init)
    b, values_b = _ours("adam", {}, init)
    a.apply("dense/bias", values_a["dense/bias"], grad64, 0.01)
    b.apply("dense/bias", values_b["dense/bias"], grad64.astype(np.float32), 0.01)
    np.testing.assert_array_equal(grad64, original)
    np.testing.assert_array_equal(values_a["dense/bias"], values_b["dense/bias"])
    assert values_a["dense/bias"].dtype == np.float32


def test_concurrent_applies_to_different_variables() -> None:
    # Each thread owns one variable; the result must equal a sequential run.
    init, grads = _initial_params(), _gradients(STEPS)
    name, params, _, _ = CASES["adam-amsgrad"]
    sequential, expected = _ours(name, params, init)
    for step in grads:
        for var, grad in step.items():
            sequential.apply(var, expected[var], grad, 0.01)

    concurrent, values = _ours(name, params, init)

    def run(var: str) -> None:
        for step in grads:
            concurrent.apply(var, values[var], step[var], 0.01)

    threads = [threading.Thread(target=run, args=(var,)) for var in SHAPES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for var in SHAPES:
        np.testing.assert_array_equal(values[var], expected[var])


def test_module_does_not_import_tensorflow() -> None:
    code = (
        "import sys, elasticps.ps.optimizers\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
