"""Rolling a sync shard back to one of its checkpoints under a new incarnation (``store.roll_back``),
and the refusal of gradients computed on another incarnation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.checkpoint import CheckpointError
from elasticps.ps.store import ParameterStore, StoreSettings

SGD = OptimizerConfig("sgd", {"learning_rate": 0.5})
MODEL = {"w": np.array([1.0, 2.0], dtype=np.float32)}


def make(tmp_path: Path, steps: int = 2, rule: UpdateRule = UpdateRule.SYNC) -> ParameterStore:
    store = ParameterStore(
        StoreSettings(mode=TrainingMode(rule=rule), checkpoint_dir=tmp_path, checkpoint_steps=steps, keep_checkpoint_max=5)
    )
    store.initialize(MODEL, SGD)
    return store


def weights(store: ParameterStore) -> np.ndarray:
    with store.reading() as (_, _, variables):
        return variables["w"].copy()


def rounds(store: ParameterStore, count: int, gradient: float = 1.0) -> None:
    """``count`` sync rounds of one worker, on the store's incarnation; checkpoints flushed after each."""
    for _ in range(count):
        version = store.version
        grads = {"w": np.full(2, gradient, dtype=np.float32)}
        assert store.push(grads, version, worker="w", incarnation=store.incarnation).accepted
        store.commit(version, ["w"])
        store.flush_checkpoints()


def test_roll_back_installs_the_checkpoint_of_that_version_under_the_new_incarnation(tmp_path: Path) -> None:
    store = make(tmp_path)
    rounds(store, 2)
    at_2 = weights(store)
    rounds(store, 3)
    assert store.version == 5
    assert store.checkpoint_versions() == [4, 2]
    store.roll_back(2, 7)
    assert (store.incarnation, store.version) == (7, 2)
    np.testing.assert_array_equal(weights(store), at_2)
    with store.reading() as (incarnation, version, _):
        assert (incarnation, version) == (7, 2)
    rounds(store, 1)  # training goes on from there, on the new incarnation
    assert store.version == 3


def test_roll_back_to_a_version_without_a_checkpoint_raises_and_changes_nothing(tmp_path: Path) -> None:
    store = make(tmp_path)
    rounds(store, 3)
    before = weights(store)
    with pytest.raises(CheckpointError):
        store.roll_back(3, 1)
    assert (store.incarnation, store.version) == (0, 3)
    np.testing.assert_array_equal(weights(store), before)


def test_a_store_without_checkpoints_cannot_roll_back() -> None:
    store = ParameterStore(StoreSettings())
    store.initialize(MODEL, SGD)
    assert store.checkpoint_versions() == []
    with pytest.raises(CheckpointError):
        store.roll_back(0, 1)


def test_roll_back_drops_gradients_staged_before_it(tmp_path: Path) -> None:
    store = make(tmp_path)
    rounds(store, 2)
    assert store.push({"w": np.ones(2, dtype=np.float32)}, 2, worker="late").accepted
    store.roll_back(2, 1)
    with pytest.raises(Exception, match="late|staged|gradient"):
        store.commit(2, ["late"])
    assert store.version == 2


@pytest.mark.parametrize("rule", [UpdateRule.SYNC, UpdateRule.ASYNC])
def test_a_push_from_another_incarnation_is_refused_and_changes_nothing(rule: UpdateRule) -> None:
    store2 = ParameterStore(StoreSettings(mode=TrainingMode(rule=rule)))
    store2.initialize(MODEL, SGD, version=4, incarnation=3)
    for stale in (0, 2, 4):
        outcome = store2.push({"w": np.ones(2, dtype=np.float32)}, 4, worker="w", incarnation=stale)
        assert not outcome.accepted
        assert outcome.version == 4
    assert (store2.incarnation, store2.version) == (3, 4)
    np.testing.assert_array_equal(weights(store2), MODEL["w"])
    assert store2.push({"w": np.ones(2, dtype=np.float32)}, 4, worker="w", incarnation=3).accepted


def test_a_push_staged_under_the_old_incarnation_cannot_join_a_round_after_the_rollback(tmp_path: Path) -> None:
    store = make(tmp_path)
    rounds(store, 2)
    store.roll_back(2, 1)
    assert not store.push({"w": np.ones(2, dtype=np.float32)}, 2, worker="old", incarnation=0).accepted
    assert store.push({"w": np.ones(2, dtype=np.float32)}, 2, worker="new", incarnation=1).accepted
    store.commit(2, ["new"])
    assert store.version == 3


def test_after_a_rollback_a_version_reached_again_is_checkpointed_anew(tmp_path: Path) -> None:
    store = make(tmp_path)
    rounds(store, 5, gradient=1.0)  # checkpoints at 2 and 4 (incarnation 0)
    store.roll_back(2, 1)
    rounds(store, 2, gradient=-3.0)  # version 4 again, other weights (incarnation 1)
    at_4 = weights(store)
    rounds(store, 1, gradient=-3.0)
    store.roll_back(4, 2)  # what a second restart would do: every shard back to its checkpoint of 4
    np.testing.assert_array_equal(weights(store), at_4)


def test_a_rollback_removes_the_checkpoints_of_the_abandoned_versions(tmp_path: Path) -> None:
    store = make(tmp_path)
    rounds(store, 5, gradient=1.0)  # checkpoints at 2 and 4
    store.flush_checkpoints()
    assert store.checkpoint_versions() == [4, 2]
    store.roll_back(2, 1)
    assert store.checkpoint_versions() == [2]  # 4 was of incarnation 0: a later rollback must not find it
