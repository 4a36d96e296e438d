"""The update-rule seam: one registry entry per mode, rules chosen once, the learning-rate choices.

The rules' semantics are tested through the store (test_store_sync.py, test_store_async.py); here:
that the registry picks the right rule for each mode, and that the staleness-aware learning rate is
a per-call wrapper around another choice.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.model import Model
from elasticps.ps.rules import (
    AVERAGING,
    RULES,
    AsyncApply,
    Gradient,
    ModelAveraging,
    PushOutcome,
    RoundAveraging,
    RoundError,
    Rule,
    make_rule,
)
from elasticps.ps.settings import StoreSettings
from elasticps.ps.staleness import LearningRate, StalenessAware, as_given
from elasticps.ps.store import ParameterStore
from elasticps.ps.versions import ModelVersion

SGD = OptimizerConfig("sgd", {"learning_rate": 0.5})


def test_every_update_rule_of_the_api_has_a_rule_on_the_ps() -> None:
    assert set(RULES) == set(UpdateRule)


def test_sync_mode_gets_round_averaging_with_the_settings() -> None:
    rule = make_rule(StoreSettings(sync_version_tolerance=2))
    assert isinstance(rule, RoundAveraging)
    assert rule.sync_version_tolerance == 2
    assert rule.consistent_reads is True
    assert rule.staged == 0


@pytest.mark.parametrize("use_locking", [False, True])
def test_async_mode_gets_async_apply_with_the_learning_rate_as_given(use_locking: bool) -> None:
    rule = make_rule(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC, use_locking=use_locking)))
    assert isinstance(rule, AsyncApply)
    assert rule.use_locking is use_locking
    assert rule.learning_rate is as_given
    assert rule.consistent_reads is False


def test_staleness_lr_wraps_the_async_rules_learning_rate() -> None:
    rule = make_rule(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC, staleness_lr=True)))
    assert isinstance(rule, AsyncApply)
    assert rule.learning_rate == StalenessAware(as_given)


def test_the_store_builds_its_rule_once_from_the_settings() -> None:
    store = ParameterStore(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC)))
    assert isinstance(store.rule, AsyncApply)
    assert store.consistent_reads is False
    assert store.rule is store.rule
    assert ParameterStore(StoreSettings()).consistent_reads is True


def test_an_async_rule_has_no_rounds_to_commit() -> None:
    store = ParameterStore(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC)))
    store.initialize({"w": np.array([1.0, 2.0])}, SGD)
    with pytest.raises(RoundError, match="no rounds"):
        store.commit(0, ["a"])
    assert store.version == 0


def test_round_averaging_stages_one_gradient_per_worker() -> None:
    store = ParameterStore(StoreSettings())
    store.initialize({"w": np.array([1.0, 2.0])}, SGD)
    rule = store.rule
    assert isinstance(rule, RoundAveraging)
    store.push({"w": np.array([1.0, 1.0])}, version=0, worker="a")
    store.push({"w": np.array([2.0, 2.0])}, version=0, worker="a")  # replaces a's first
    store.push({"w": np.array([3.0, 3.0])}, version=0, worker="b")
    assert rule.staged == 2
    store.commit(0, ["a", "b"])
    assert rule.staged == 0


# ---- LocalSGD's model averaging ------------------------------------------------------------------
LOCAL_SGD = TrainingMode(rule=UpdateRule.LOCAL_SGD)
MOMENTUM = OptimizerConfig("sgd", {"learning_rate": 0.05, "momentum": 0.9})


def test_localsgd_gets_model_averaging_with_the_sync_settings() -> None:
    rule = make_rule(StoreSettings(mode=LOCAL_SGD, sync_version_tolerance=1))
    assert isinstance(rule, ModelAveraging) and rule.sync_version_tolerance == 1
    assert rule.consistent_reads is True


def test_model_averaging_makes_the_shards_weights_the_members_models_averaged() -> None:
    # The worker's momentum optimizer and its learning rate on the push are the workers' own:
    # the shard applies the mean delta as it is.
    store = ParameterStore(StoreSettings(mode=LOCAL_SGD))
    store.initialize({"w": np.array([1.0, 2.0])}, MOMENTUM)
    assert store.optimizer.config == AVERAGING
    trained = {"a": np.array([0.5, 2.5]), "b": np.array([1.5, 0.5])}
    for worker, weights in trained.items():
        delta = np.array([1.0, 2.0]) - weights  # pulled minus trained
        assert store.push({"w": delta}, version=0, learning_rate=0.05, worker=worker).accepted
    store.commit(0, ["a", "b"])
    with store.reading() as (_, version, variables):
        assert version == 1
        np.testing.assert_allclose(variables["w"], (trained["a"] + trained["b"]) / 2)
    # Plain averaging keeps no slot: the next round starts from the averaged model alone.
    store.push({"w": np.array([0.0, 0.0])}, version=1, worker="a")
    store.commit(1, ["a"])
    with store.reading() as (_, _, variables):
        np.testing.assert_allclose(variables["w"], (trained["a"] + trained["b"]) / 2)


def test_model_averaging_refuses_a_delta_of_an_older_round_as_sync_does() -> None:
    store = ParameterStore(StoreSettings(mode=LOCAL_SGD))
    store.initialize({"w": np.array([1.0, 2.0])}, MOMENTUM)
    store.push({"w": np.array([1.0, 1.0])}, version=0, worker="a")
    store.commit(0, ["a"])
    assert not store.push({"w": np.array([1.0, 1.0])}, version=0, worker="b").accepted


# ---- learning-rate choices --------------------------------------------------------------------


@pytest.mark.parametrize(("stale", "expected"), [(0, 0.3), (1, 0.3), (2, 0.15), (3, 0.1), (12, 0.025)])
def test_staleness_aware_divides_by_the_staleness_when_positive(stale: int, expected: float) -> None:
    assert StalenessAware()(0.3, stale) == pytest.approx(expected, rel=0, abs=1e-15)
    assert StalenessAware()(0.3, stale) == (0.3 / stale if stale > 0 else 0.3)  # the same float op


def test_staleness_aware_is_computed_per_call_and_keeps_no_state() -> None:
    aware = StalenessAware()
    assert [aware(1.0, s) for s in (4, 0, 2, 4)] == [0.25, 1.0, 0.5, 0.25]
    assert aware == StalenessAware()  # frozen: nothing remembered between calls
    with pytest.raises(AttributeError):
        aware.inner = as_given  # type: ignore[misc]


def test_staleness_aware_wraps_any_other_choice() -> None:
    def halved(base_lr: float, stale: int) -> float:
        return base_lr / 2

    wrapped: LearningRate = StalenessAware(halved)
    assert wrapped(1.0, 0) == 0.5
    assert wrapped(1.0, 5) == 0.1


def test_as_given_ignores_the_staleness() -> None:
    assert [as_given(0.2, s) for s in (0, 1, 9)] == [0.2, 0.2, 0.2]


# ---- a rule injected into the store -------------------------------------------------------------


class Doubling(Rule):
    """A rule of a test's own: applies every push twice as hard, at once; reads are live."""

    consistent_reads = False

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.workers: list[str] = []

    def guard(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    def push(self, model: Model, version: ModelVersion, gradient: Gradient) -> PushOutcome:
        self.seen.append(gradient.computed_on)
        self.workers.append(gradient.worker)
        model.apply(gradient.update, 2 * gradient.base_lr)
        return PushOutcome(True, version.advance(), 0, 2 * gradient.base_lr)


def test_a_new_rule_plugs_into_the_store_without_touching_it() -> None:
    rule = Doubling()
    store = ParameterStore(StoreSettings(), rule=rule)
    store.initialize({"w": np.array([1.0, 2.0])}, SGD)
    outcome = store.push({"w": np.array([1.0, 1.0])}, version=7, worker="w-3")
    assert outcome == PushOutcome(True, 1, 0, 1.0)
    assert rule.seen == [7]
    assert rule.workers == ["w-3"]
    with store.reading() as (_, version, variables):
        assert version == 1
        np.testing.assert_array_equal(variables["w"], [0.0, 1.0])

