"""The model's non-trainable state on a shard (``ps/state_table.py``), with numpy only: the sync
round's mean, async's latest value, refusals that change nothing, checkpoints (with state, and
written before shards kept state) and the rollback to a checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps import checkpoint
from elasticps.ps.checkpointing import capture, rebuild
from elasticps.ps.errors import GradientError
from elasticps.ps.state_table import StateMean, StateTable
from elasticps.ps.store import ParameterStore, StoreSettings

ADAM = OptimizerConfig("adam", {"learning_rate": 0.1})
SYNC = TrainingMode()
ASYNC = TrainingMode(rule=UpdateRule.ASYNC)


def variables() -> dict[str, np.ndarray]:
    return {"dense/kernel": np.ones((2, 2), np.float32), "bn/gamma": np.ones(2, np.float32)}


def grads() -> dict[str, np.ndarray]:
    return {name: np.full_like(value, 0.5) for name, value in variables().items()}


def state(mean: float = 0.0, variance: float = 1.0) -> dict[str, np.ndarray]:
    return {"bn/moving_mean": np.full(2, mean, np.float32), "bn/moving_variance": np.full(2, variance, np.float32)}


def make_store(mode: TrainingMode = SYNC, **settings: object) -> ParameterStore:
    store = ParameterStore(StoreSettings(mode=mode, **settings))  # type: ignore[arg-type]
    assert store.initialize(variables(), ADAM, state=state())
    return store


def held(store: ParameterStore) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    with store.reading_model() as found:
        return (
            {n: v.copy() for n, v in found.variables.items()},
            {n: v.copy() for n, v in found.state.items()},
        )


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


# ---- sync: the mean of the round's members ---------------------------------------------------------
def test_a_committed_round_sets_the_state_to_the_mean_of_its_members_values() -> None:
    store = make_store()
    assert store.push(grads(), 0, worker="a", state=state(2.0, 3.0)).accepted
    assert store.push(grads(), 0, worker="b", state=state(4.0, 7.0)).accepted
    assert store.push(grads(), 0, worker="c", state=state(100.0, 100.0)).accepted  # not in the round
    _, before = held(store)
    assert_same(before, state())  # staged, not applied
    assert store.commit(0, ["a", "b"]).version == 1
    _, after = held(store)
    assert_same(after, state(3.0, 5.0))


def test_a_member_without_state_does_not_count_in_its_mean() -> None:
    store = make_store()
    store.push(grads(), 0, worker="a", state={"bn/moving_mean": np.full(2, 6.0, np.float32)})
    store.push(grads(), 0, worker="b")
    store.commit(0, ["a", "b"])
    _, after = held(store)
    assert_same(after, {**state(), "bn/moving_mean": np.full(2, 6.0, np.float32)})  # variance untouched


def test_a_workers_newer_push_replaces_its_staged_state() -> None:
    store = make_store()
    store.push(grads(), 0, worker="a", state=state(9.0, 9.0))
    store.push(grads(), 0, worker="a", state=state(1.0, 2.0))
    store.commit(0, ["a"])
    assert_same(held(store)[1], state(1.0, 2.0))


def test_the_state_neither_moves_the_version_nor_gets_optimizer_slots() -> None:
    store = make_store(ASYNC)
    assert not any(key.startswith("bn/moving") or "moving" in key for key in store.optimizer.state())
    outcome = store.push(grads(), 0, worker="a", state=state(5.0, 5.0))
    assert outcome.version == 1  # one push, one version: the gradients' own
    assert_same(held(store)[1], state(5.0, 5.0))  # the value, not an optimizer step toward it


def test_state_mean_counts_each_tensor_over_the_members_that_sent_it() -> None:
    mean = StateMean()
    mean.add({"m": np.array([1.0, 2.0], np.float32), "v": np.array([4.0], np.float16)})
    mean.add({"m": np.array([3.0, 6.0], np.float32)})
    averaged = mean.averaged(count=2)
    assert_same(averaged, {"m": np.array([2.0, 4.0], np.float32), "v": np.array([4.0], np.float16)})
    mean.clear()
    assert mean.averaged(count=0) == {}


# ---- async: the latest value ---------------------------------------------------------------------
def test_async_the_latest_pushed_value_replaces_the_state() -> None:
    store = make_store(ASYNC)
    store.push(grads(), 0, worker="a", state=state(2.0, 3.0))
    assert_same(held(store)[1], state(2.0, 3.0))
    store.push(grads(), 0, worker="b", state=state(8.0, 9.0))  # stale by one: still the latest value
    assert_same(held(store)[1], state(8.0, 9.0))
    store.push(grads(), 2, worker="a")  # no state: the state stays
    assert_same(held(store)[1], state(8.0, 9.0))


# ---- refusals ------------------------------------------------------------------------------------
BAD = {
    "shape": ({**state(), "bn/moving_mean": np.zeros(3, np.float32)}, "shape"),
    "dtype": ({**state(), "bn/moving_mean": np.zeros(2, np.float64)}, "dtype"),
    "nan": ({**state(), "bn/moving_variance": np.array([1.0, np.nan], np.float32)}, "NaN"),
    "infinity": ({**state(), "bn/moving_variance": np.array([np.inf, 1.0], np.float32)}, "infinity"),
    "unknown": ({**state(), "bn/other": np.zeros(2, np.float32)}, "holds no state 'bn/other'"),
    "a variable's name": ({"dense/kernel": np.zeros((2, 2), np.float32)}, "both a variable and a state"),
}


@pytest.mark.parametrize("mode", [SYNC, ASYNC], ids=["sync", "async"])
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_state_tensor_is_refused_and_changes_nothing(mode: TrainingMode, case: str) -> None:
    values, message = BAD[case]
    store = make_store(mode)
    before = held(store)
    with pytest.raises(GradientError, match=message):
        store.push(grads(), 0, worker="a", state=values)
    assert store.version == 0
    assert_same(held(store)[0], before[0])
    assert_same(held(store)[1], before[1])
    if mode is SYNC:
        assert store.rule.staged == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"steps": np.zeros(2, np.int64)}, "not a float type"),
        ({"bn/moving_mean": np.array([np.nan], np.float32)}, "NaN or infinity"),
        ({"dense/kernel": np.zeros((2, 2), np.float32)}, "both a variable and a state"),
    ],
)
def test_a_model_with_bad_state_is_refused(values: dict[str, np.ndarray], message: str) -> None:
    store = ParameterStore(StoreSettings())
    with pytest.raises(GradientError, match=message):
        store.initialize(variables(), ADAM, state=values)
    assert not store.initialized


# ---- checkpoints, restore and rollback -----------------------------------------------------------
def test_a_checkpoint_holds_the_state_and_restores_it(tmp_path: Path) -> None:
    store = make_store(checkpoint_dir=tmp_path, checkpoint_steps=1)
    store.push(grads(), 0, worker="a", state=state(2.0, 3.0))
    store.commit(0, ["a"])
    store.flush_checkpoints()
    saved = checkpoint.load(checkpoint.path_of(tmp_path / "ps-0", 1))
    assert_same({k: v for k, v in saved.arrays.items() if k.startswith("state/")},
                {f"state/{k}": v for k, v in state(2.0, 3.0).items()})
    assert saved.meta["state_table"] is True

    restarted = ParameterStore(StoreSettings(checkpoint_dir=tmp_path, checkpoint_steps=1))
    assert restarted.restore() and restarted.version == 1
    assert_same(held(restarted)[1], state(2.0, 3.0))
    assert_same(held(restarted)[0], held(store)[0])
    with pytest.raises(GradientError, match="holds no state"):  # a table with a state section refuses new names
        restarted.push(grads(), 1, worker="a", state={"bn/new": np.zeros(1, np.float32)})


def test_a_rollback_brings_back_the_checkpointed_state(tmp_path: Path) -> None:
    store = make_store(checkpoint_dir=tmp_path, checkpoint_steps=1)
    for version, value in enumerate([2.0, 5.0]):
        store.push(grads(), version, worker="a", state=state(value, value))
        store.commit(version, ["a"])
        store.flush_checkpoints()  # each version on disk (a waiting snapshot is replaced by a newer one)
    assert_same(held(store)[1], state(5.0, 5.0))
    store.roll_back(1, incarnation=1)
    assert (store.version, store.incarnation) == (1, 1)
    assert_same(held(store)[1], state(2.0, 2.0))


def write_old_checkpoint(directory: Path, version: int) -> None:
    """A checkpoint as shards wrote it before they kept state: variables, optimizer, no state."""
    store = ParameterStore(StoreSettings())
    store.initialize(variables(), ADAM)
    old = capture_without_state(store, version)
    checkpoint.save(directory, old)


def capture_without_state(store: ParameterStore, version: int) -> checkpoint.Checkpoint:
    found = store.snapshot()
    meta = {k: v for k, v in found.meta.items() if k != "state_table"}
    arrays = {k: v for k, v in found.arrays.items() if not k.startswith("state/")}
    return checkpoint.Checkpoint(version=version, arrays=arrays, meta=meta)


@pytest.mark.parametrize("mode", [SYNC, ASYNC], ids=["sync", "async"])
def test_a_checkpoint_without_state_loads_and_adopts_the_pushed_state(tmp_path: Path, mode: TrainingMode) -> None:
    write_old_checkpoint(tmp_path / "ps-0", version=4)
    store = ParameterStore(StoreSettings(mode=mode, checkpoint_dir=tmp_path))
    assert store.restore() and store.version == 4
    assert_same(held(store)[0], variables())
    assert held(store)[1] == {}  # no state until a worker pushes it
    with pytest.raises(GradientError, match="not a float type"):  # adopted tensors are still checked
        store.push(grads(), 4, worker="a", state={"seed": np.zeros(2, np.int64)})
    with pytest.raises(GradientError, match="NaN"):
        store.push(grads(), 4, worker="a", state={"bn/moving_mean": np.array([np.nan], np.float32)})
    assert store.push(grads(), 4, worker="a", state=state(2.0, 3.0)).accepted
    if mode is SYNC:
        assert held(store)[1] == {}  # staged with its gradient
        store.commit(4, ["a"])
    assert_same(held(store)[1], state(2.0, 3.0))
    # Adopted once, the tensors are checked like any other.
    with pytest.raises(GradientError, match="shape"):
        store.push(grads(), 5, worker="a", state={"bn/moving_mean": np.zeros(5, np.float32)})


def test_capture_and_rebuild_keep_the_state_and_its_dtypes() -> None:
    store = ParameterStore(StoreSettings())
    values = {"m": np.array([1.5], np.float16), "v": np.array([[2.5]], np.float64)}
    store.initialize(variables(), ADAM, state=values)
    back = rebuild(store.snapshot(), shard=0)
    assert_same(dict(back.state.values), values)
    assert not back.state.adopts_new


def test_a_restored_table_without_a_state_section_adopts() -> None:
    table = StateTable.restored({"var/w": np.zeros(1)}, saved=False)
    assert table.values == {} and table.adopts_new
    table.check({"m": np.zeros(2, np.float32)})  # a new name: fine
    table.apply({"m": np.full(2, 3.0, np.float32)}, optimizer=None, lr=0.0)  # type: ignore[arg-type]
    assert_same(dict(table.values), {"m": np.full(2, 3.0, np.float32)})
