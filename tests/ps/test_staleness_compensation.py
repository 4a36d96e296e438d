"""Staleness compensation (``ps/staleness.py``): each optimizer's arithmetic against a hand
computation, every path of the optimizer (apply, proven, staged) alike, and an async store that
takes each push's own staleness under concurrent pushes."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig, OptimizerError
from elasticps.api.spec import StalenessCompensation
from elasticps.ps.optimizers import Optimizer, make_optimizer
from elasticps.ps.rules import AsyncApply, make_rule
from elasticps.ps.settings import StoreSettings
from elasticps.ps.staleness import COMPENSATIONS, MEMORY, MomentumCorrection, implicit_momentum, uncompensated
from elasticps.ps.store import ParameterStore

LR = 0.1
M0 = np.array([0.2, -0.4, 1.0], np.float64)  # a momentum slot before the stale push
W0 = np.array([1.0, 2.0, -3.0], np.float64)
G = np.array([0.5, -1.0, 2.0], np.float64)  # the stale gradient


@pytest.mark.parametrize(("stale", "expected"), [(0, 0.0), (1, 0.5), (2, 2 / 3), (3, 0.75), (9, 0.9), (99, 0.99)])
def test_the_implicit_momentum_of_a_push_is_its_staleness_over_staleness_plus_one(stale: int, expected: float) -> None:
    assert implicit_momentum(stale) == pytest.approx(expected)
    assert uncompensated(stale) == 0.0


def test_every_compensation_of_the_spec_has_a_rule() -> None:
    assert set(COMPENSATIONS) == set(StalenessCompensation)


def test_momentum_correction_takes_the_larger_of_the_pushs_staleness_and_the_recent_mean() -> None:
    correction = MomentumCorrection(memory=4)
    # A stale push is corrected by its own staleness while the mean is below it.
    assert correction(3) == implicit_momentum(3)  # mean 0.75
    assert correction(3) == implicit_momentum(3)  # mean 1.3125
    # A fresh push among stale ones is corrected as they are, by the mean (here 0.984375).
    assert correction(0) == pytest.approx(implicit_momentum(1.3125 * 0.75))
    assert correction.mean == pytest.approx(0.984375)


def test_alone_at_the_end_the_momentum_comes_back_gradually() -> None:
    """Two workers (most pushes one version late), then one alone (every push fresh): the momentum
    0.9 - implicit rises over tens of pushes, not at once."""
    correction = MomentumCorrection()
    for _ in range(1000):
        correction(1)
    alone = [0.9 - correction(0) for _ in range(3 * MEMORY)]
    assert alone[0] == pytest.approx(0.9 - implicit_momentum(1 - 1 / MEMORY), abs=1e-3)  # about 0.4, not 0.9
    assert all(later >= earlier for earlier, later in zip(alone, alone[1:]))
    assert alone[MEMORY // 2] < 0.6 < alone[-1] < 0.9


def test_each_shard_gets_its_own_running_mean() -> None:
    first, second = (COMPENSATIONS[StalenessCompensation.MOMENTUM_CORRECTION]() for _ in range(2))
    assert isinstance(first, MomentumCorrection) and first is not second
    first(10)
    assert second.mean == 0.0 and first.mean > 0.0  # type: ignore[attr-defined]


def optimizer(name: str, **params: float) -> Optimizer:
    opt = make_optimizer(OptimizerConfig(name, {"learning_rate": LR, **params}))
    opt.register("w", W0.shape, np.float64)
    return opt


def with_momentum(opt: Optimizer, slot: str, value: np.ndarray) -> Optimizer:
    state = opt.state()
    state[f"slot/{slot}/w"] = value.copy()
    opt.load_state(state)
    return opt


def sgd_expected(momentum: float, nesterov: bool) -> np.ndarray:
    """Keras's SGD by hand with the push's momentum: m = mu m - lr g; w + m (Nesterov: + mu m - lr g)."""
    m = momentum * M0 - LR * G
    return W0 + (momentum * m - LR * G if nesterov else m)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize(("implicit", "effective"), [(0.0, 0.9), (0.5, 0.4), (0.75, 0.15), (0.95, 0.0)])
def test_sgd_momentum_is_lowered_by_the_implicit_momentum(nesterov: bool, implicit: float, effective: float) -> None:
    opt = with_momentum(optimizer("sgd", momentum=0.9, nesterov=float(nesterov)), "momentum", M0)
    w = W0.copy()
    opt.apply("w", w, G, LR, implicit_momentum=implicit)
    np.testing.assert_allclose(w, sgd_expected(effective, nesterov), rtol=1e-12)
    np.testing.assert_allclose(opt.state()["slot/momentum/w"], effective * M0 - LR * G, rtol=1e-12)


def test_plain_sgd_has_no_momentum_to_lower() -> None:
    opt = optimizer("sgd")
    w = W0.copy()
    opt.apply("w", w, G, LR, implicit_momentum=0.5)
    np.testing.assert_allclose(w, W0 - LR * G, rtol=1e-12)


def test_rmsprop_momentum_is_lowered_by_the_implicit_momentum() -> None:
    rho, eps = 0.9, 1e-7
    opt = with_momentum(optimizer("rmsprop", momentum=0.8, rho=rho, epsilon=eps), "momentum", M0)
    w = W0.copy()
    opt.apply("w", w, G, LR, implicit_momentum=0.5)
    velocity = (1 - rho) * G * G  # from 0
    mom = 0.3 * M0 + LR * G / np.sqrt(velocity + eps)  # momentum 0.8 - 0.5
    np.testing.assert_allclose(w, W0 - mom, rtol=1e-12)


@pytest.mark.parametrize(("name", "params"), [("adam", {}), ("adam", {"amsgrad": 1.0}), ("adagrad", {})])
def test_adam_and_adagrad_apply_every_push_as_configured(name: str, params: dict[str, float]) -> None:
    corrected, plain = optimizer(name, **params), optimizer(name, **params)
    assert not corrected.CORRECTS_MOMENTUM
    w1, w2 = W0.copy(), W0.copy()
    for _ in range(3):
        corrected.apply("w", w1, G, LR, implicit_momentum=0.5)
        plain.apply("w", w2, G, LR)
    np.testing.assert_array_equal(w1, w2)


def test_no_implicit_momentum_is_the_configured_update_bit_for_bit() -> None:
    a, b = optimizer("sgd", momentum=0.9), optimizer("sgd", momentum=0.9)
    w1, w2 = W0.astype(np.float64), W0.astype(np.float64)
    for step in range(4):
        a.apply("w", w1, G * (step + 1), LR)
        b.apply("w", w2, G * (step + 1), LR, implicit_momentum=0.0)
    np.testing.assert_array_equal(w1, w2)


@pytest.mark.parametrize("name", ["sgd", "rmsprop"])
def test_the_proven_and_the_staged_updates_are_the_applied_one(name: str) -> None:
    results = []
    for path in ("apply", "proven", "staged"):
        opt = with_momentum(optimizer(name, momentum=0.9), "momentum", M0)
        w = W0.copy()
        if path == "apply":
            opt.apply("w", w, G, LR, implicit_momentum=0.5)
        elif path == "proven":
            assert opt.proves_finite("w", w, G, LR, tracked=True)
            opt.apply_proven("w", w, G, LR, tracked=True, implicit_momentum=0.5)
        else:
            scratch = opt.new_scratch()
            assert opt.stage("w", w, G, LR, scratch, implicit_momentum=0.5)
            opt.commit("w", w, scratch)
        results.append((w, opt.state()["slot/momentum/w"]))
    for w, m in results[1:]:
        np.testing.assert_array_equal(w, results[0][0])
        np.testing.assert_array_equal(m, results[0][1])


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan])
def test_an_implicit_momentum_outside_0_1_is_refused(bad: float) -> None:
    opt = optimizer("sgd", momentum=0.9)
    w = W0.copy()
    with pytest.raises(OptimizerError, match="implicit momentum"):
        opt.apply("w", w, G, LR, implicit_momentum=bad)
    np.testing.assert_array_equal(w, W0)


# ---- the async rule ------------------------------------------------------------------------------
def async_store(compensation: StalenessCompensation) -> ParameterStore:
    mode = TrainingMode(rule=UpdateRule.ASYNC, compensation=compensation)
    store = ParameterStore(StoreSettings(mode=mode))
    store.initialize({"w": W0.copy()}, OptimizerConfig("sgd", {"learning_rate": LR, "momentum": 0.9}))
    return store


def test_the_async_rule_takes_the_jobs_compensation() -> None:
    for compensation in StalenessCompensation:
        rule = make_rule(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC, compensation=compensation)))
        assert isinstance(rule, AsyncApply)
        if compensation is StalenessCompensation.NONE:
            assert rule.compensation is uncompensated
        else:
            assert isinstance(rule.compensation, MomentumCorrection)


def test_a_stale_push_is_applied_with_the_momentum_its_staleness_leaves() -> None:
    store = async_store(StalenessCompensation.MOMENTUM_CORRECTION)
    g1 = np.array([1.0, 0.0, -1.0])
    assert store.push({"w": g1}, version=0, learning_rate=LR).staleness == 0  # fresh: momentum 0.9
    outcome = store.push({"w": G}, version=0, learning_rate=LR)  # computed before g1 landed
    assert outcome.staleness == 1
    m1 = -LR * g1
    m2 = 0.4 * m1 - LR * G  # 0.9 less 1 / (1 + 1)
    with store.reading() as (_, version, variables):
        assert version == 2
        np.testing.assert_allclose(variables["w"], W0 + m1 + m2, rtol=1e-12)
    uncorrected = async_store(StalenessCompensation.NONE)
    uncorrected.push({"w": g1}, version=0, learning_rate=LR)
    uncorrected.push({"w": G}, version=0, learning_rate=LR)
    with uncorrected.reading() as (_, _, variables):
        np.testing.assert_allclose(variables["w"], W0 + m1 + (0.9 * m1 - LR * G), rtol=1e-12)


def test_each_push_is_compensated_by_its_own_staleness_under_concurrent_pushes() -> None:
    """Eight threads push 25 gradients each, computed on versions 0..4 behind (and more, as the
    others push): every update the optimizer made used the implicit momentum of the staleness its
    own push reported. The running mean is made the push's own staleness (memory 1), so any value
    leaking from another push would show."""
    store = async_store(StalenessCompensation.MOMENTUM_CORRECTION)
    rule = store.rule
    assert isinstance(rule, AsyncApply)
    rule.compensation = MomentumCorrection(memory=1)
    opt: Any = store.optimizer
    used: dict[float, float] = {}  # the gradient's tag -> the implicit momentum its update used
    lock = threading.Lock()

    def spied(method: Any) -> Any:
        def call(name: str, param: np.ndarray, grad: np.ndarray, lr: float, *args: Any, **kwargs: Any) -> Any:
            with lock:
                used[float(grad[0])] = kwargs.get("implicit_momentum", 0.0)
            return method(name, param, grad, lr, *args, **kwargs)

        return call

    opt.apply_proven = spied(opt.apply_proven)
    opt.stage = spied(opt.stage)
    reported: dict[float, int] = {}
    start = threading.Barrier(8)

    def worker(index: int) -> None:
        start.wait()
        for step in range(25):
            tag = 1e-6 * (index * 100 + step + 1)  # tiny: the model stays finite and proven
            computed_on = max(0, store.version - step % 5)
            outcome = store.push({"w": np.full(3, tag)}, version=computed_on, learning_rate=LR)
            assert outcome.accepted
            with lock:
                reported[tag] = outcome.staleness

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reported) == 200 and set(used) == set(reported)
    assert {stale for stale in reported.values()} >= {0, 1, 2, 3, 4}  # a spread, not one value
    for tag, stale in reported.items():
        assert used[tag] == implicit_momentum(stale), (tag, stale)


def test_an_optimizer_without_heavy_ball_momentum_is_said_once_and_trained_as_configured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mode = TrainingMode(rule=UpdateRule.ASYNC)
    for name, said in (("adam", True), ("adagrad", True), ("sgd", False)):
        caplog.clear()
        with caplog.at_level("INFO", logger="elasticps.ps.rules"):
            ParameterStore(StoreSettings(mode=mode)).initialize({"w": W0.copy()}, OptimizerConfig(name, {"learning_rate": LR}))
        lines = [r.getMessage() for r in caplog.records if "staleness compensation" in r.getMessage()]
        assert lines == ([f"staleness compensation: {name} has no heavy-ball momentum to correct; every push is "
                          "applied as configured"] if said else []), name  # fmt: skip
