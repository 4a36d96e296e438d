"""Store checkpoints: every ``checkpoint_steps`` versions; a new store restores the newest good one."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from elasticps.ps import checkpoint
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.store import ParameterStore, StoreSettings

ADAM = OptimizerConfig("adam", {"learning_rate": 0.01, "beta_1": 0.8})
ASYNC = TrainingMode(rule=UpdateRule.ASYNC)


def initial() -> dict[str, np.ndarray]:
    return {
        "dense/kernel": np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], dtype=np.float32),
        "dense/bias": np.array([0.1, -0.2, 0.3]),
        "scalar": np.array(3.0, dtype=np.float32),
    }


def gradient(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {name: rng.standard_normal(value.shape).astype(value.dtype) for name, value in initial().items()}


def settings(directory: Path, shard: int = 1) -> StoreSettings:
    return StoreSettings(shard=shard, checkpoint_dir=directory, checkpoint_steps=2)


def round_of_one(store: ParameterStore, step: int) -> None:
    """Sync: one worker's gradient staged, then its round committed (one version more)."""
    assert store.push(gradient(step), version=store.version, worker="w").accepted
    store.commit(store.version, ["w"])


def trained(directory: Path, versions: int) -> ParameterStore:
    store = ParameterStore(settings(directory))
    store.initialize(initial(), ADAM)
    for step in range(versions):
        round_of_one(store, step)
        store.flush_checkpoints()  # each due version on disk: none replaced while waiting
    return store


def params(store: ParameterStore) -> dict[str, np.ndarray]:
    with store.reading() as (_, _, variables):
        return {n: v.copy() for n, v in variables.items()}


def assert_same_state(a: ParameterStore, b: ParameterStore) -> None:
    assert a.version == b.version
    pa, pb = params(a), params(b)
    assert list(pa) == list(pb)
    for name in pa:
        assert pa[name].dtype == pb[name].dtype, name
        assert pa[name].shape == pb[name].shape, name
        np.testing.assert_array_equal(pa[name], pb[name], err_msg=name)
    sa, sb = a.optimizer.state(), b.optimizer.state()
    assert sorted(sa) == sorted(sb)
    for key in sa:
        np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)
    assert a.optimizer.config == b.optimizer.config


def test_checkpoints_are_written_every_checkpoint_steps_versions(tmp_path: Path) -> None:
    trained(tmp_path, 5)
    files = checkpoint.list_checkpoints(tmp_path / "ps-1")
    assert [p.name for p in files] == ["ckpt-000000000004.eps", "ckpt-000000000002.eps"]


def test_restore_gives_the_same_params_and_optimizer_state(tmp_path: Path) -> None:
    original = trained(tmp_path, 4)
    restored = ParameterStore(settings(tmp_path))
    assert restored.restore() is True
    assert restored.initialized
    assert restored.version == 4
    assert_same_state(original, restored)
    steps = {k: int(v) for k, v in restored.optimizer.state().items() if k.startswith("step/")}
    assert steps == {"step/dense/kernel": 4, "step/dense/bias": 4, "step/scalar": 4}

    # Continuing training gives identical results (Adam's slots and step counts came back).
    for step in range(4, 7):
        a = original.push(gradient(step), version=original.version, worker="w")
        b = restored.push(gradient(step), version=restored.version, worker="w")
        assert a == b
        assert original.commit(step, ["w"]) == restored.commit(step, ["w"])
    assert_same_state(original, restored)


def test_restore_refuses_a_second_initialization(tmp_path: Path) -> None:
    trained(tmp_path, 2)
    restored = ParameterStore(settings(tmp_path))
    assert restored.restore()
    assert restored.initialize({n: v + 1 for n, v in initial().items()}, ADAM) is False
    assert restored.version == 2


def test_restore_without_checkpoints(tmp_path: Path) -> None:
    assert ParameterStore(settings(tmp_path)).restore() is False
    assert ParameterStore(StoreSettings()).restore() is False  # no checkpoint_dir at all


def test_checkpoints_of_another_shard_are_not_used(tmp_path: Path) -> None:
    trained(tmp_path, 4)
    other = ParameterStore(settings(tmp_path, shard=0))
    assert other.restore() is False
    assert other.initialized is False


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trained(tmp_path, 4)
    at_two = trained(tmp_path / "reference", 2)  # the same training, stopped at version 2
    newest = tmp_path / "ps-1" / "ckpt-000000000004.eps"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit inside the payload
    newest.write_bytes(bytes(data))

    restored = ParameterStore(settings(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert restored.restore() is True
    assert restored.version == 2
    assert_same_state(at_two, restored)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("ckpt-000000000004.eps" in r.getMessage() for r in warnings), [r.getMessage() for r in warnings]


def test_async_store_checkpoints_and_restores(tmp_path: Path) -> None:
    store = ParameterStore(
        StoreSettings(mode=ASYNC, checkpoint_dir=tmp_path, checkpoint_steps=3, keep_checkpoint_max=1)
    )
    store.initialize(initial(), ADAM)
    for step in range(7):
        store.push(gradient(step), version=0)
    store.flush_checkpoints()
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "ps-0")] == ["ckpt-000000000006.eps"]
    restored = ParameterStore(StoreSettings(mode=ASYNC, checkpoint_dir=tmp_path))
    assert restored.restore()
    assert restored.version == 6
