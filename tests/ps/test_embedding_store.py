"""Embedding tables in a PS shard's store (issue 17): made with the model, rows pulled lazily,
row gradients in pushes under every rule, checked before anything changes, checkpointed whole.

Counted: rows held per shard, each row's update count (a row a push does not name is not touched),
the values against a hand-computed lazy update."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elasticps.api.embedding import TableSpec, initial_rows
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps import checkpoint
from elasticps.ps.errors import GradientError, ModelMismatch
from elasticps.ps.store import ParameterStore, RoundError, StoreSettings

SGD = OptimizerConfig("sgd", {"learning_rate": 0.5})
ADAM = OptimizerConfig("adam", {"learning_rate": 0.1, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7})
TABLE = TableSpec("cat", 3, seed=7)
DENSE = {"w": np.ones((2,), np.float32)}
ZERO = {"w": np.zeros((2,), np.float32)}


def store(rule: UpdateRule = UpdateRule.SYNC, shard: int = 0, shards: int = 2, optimizer: OptimizerConfig = SGD,
          checkpoint_dir: Path | None = None, every: int = 0) -> ParameterStore:
    settings = StoreSettings(shard=shard, mode=TrainingMode(rule=rule), checkpoint_dir=checkpoint_dir,
                             checkpoint_steps=every)
    s = ParameterStore(settings)
    assert s.initialize(DENSE, optimizer, tables=[TABLE], shards=shards)
    return s


def rows(ids: list[int], grads: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    return {"cat": {"ids": np.array(ids, np.int64), "gradient": grads.astype(np.float32)}}


def test_rows_are_made_on_first_pull_only_for_the_ids_asked() -> None:
    s = store(shard=1, shards=2)
    assert s.rows_held() == {"cat": 0}
    _, version, pulled = s.pull_embeddings({"cat": np.array([9, 1, 10**12 + 1], np.int64)})
    assert version == 0
    np.testing.assert_array_equal(pulled["cat"]["rows"], initial_rows(TABLE, np.array([9, 1, 10**12 + 1])))
    assert s.rows_held() == {"cat": 3}
    s.pull_embeddings({"cat": np.array([1, 3], np.int64)})
    assert s.rows_held() == {"cat": 4}  # 1 was held already
    with pytest.raises(GradientError, match="belongs to shard 0"):
        s.pull_embeddings({"cat": np.array([2], np.int64)})
    with pytest.raises(GradientError, match="no embedding table 'other'"):
        s.pull_embeddings({"other": np.array([1], np.int64)})


def test_a_sync_round_averages_each_ids_gradient_over_the_members_and_touches_no_other_row() -> None:
    s = store(shards=1)
    ids = np.array([1, 2, 3], np.int64)
    _, _, before = s.pull_embeddings({"cat": ids})
    g_a = np.array([[1.0, 0, 0], [2.0, 2, 2]], np.float32)  # worker a: ids 1, 2
    g_b = np.array([[4.0, 4, 4]], np.float32)  # worker b: id 2 only
    assert s.push(ZERO, 0, worker="a", embeddings=rows([1, 2], g_a)).accepted
    assert s.push(ZERO, 0, worker="b", embeddings=rows([2], g_b)).accepted
    _, _, staged = s.pull_embeddings({"cat": ids})
    np.testing.assert_array_equal(staged["cat"]["rows"], before["cat"]["rows"])  # staged only
    s.commit(0, ["a", "b"])
    _, version, after = s.pull_embeddings({"cat": ids})
    assert version == 1
    lr = np.float32(0.5)
    np.testing.assert_allclose(after["cat"]["rows"][0], before["cat"]["rows"][0] - lr * g_a[0] / 2, rtol=1e-6)
    np.testing.assert_allclose(after["cat"]["rows"][1], before["cat"]["rows"][1] - lr * (g_a[1] + g_b[0]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(after["cat"]["rows"][2], before["cat"]["rows"][2])  # id 3: in no push


def test_a_round_whose_row_update_overflows_is_refused_on_its_dry_run() -> None:
    s = store(shards=1)
    s.push(ZERO, 0, worker="a", embeddings=rows([1], np.full((1, 3), 3e38)))
    s.push(ZERO, 0, worker="b", embeddings=rows([1], np.full((1, 3), 3e38)))
    with pytest.raises(RoundError, match="NaN or infinite"):
        s.commit(0, ["a", "b"], dry_run=True)
    assert s.version == 0


def test_async_pushes_apply_at_once_with_lazy_adam_per_row() -> None:
    s = store(UpdateRule.ASYNC, shards=1, optimizer=ADAM)
    _, _, first = s.pull_embeddings({"cat": np.array([5, 6], np.int64)})
    g = np.array([[0.5, -0.5, 1.0]], np.float32)
    s.push(ZERO, 0, embeddings=rows([5], g))
    s.push(ZERO, 1, embeddings=rows([5], g))
    _, version, after = s.pull_embeddings({"cat": np.array([5, 6], np.int64)})
    assert version == 2
    # Row 5 took two Adam steps (its own count 1, 2); row 6 none.
    m = v = np.zeros(3)
    w = first["cat"]["rows"][0].astype(np.float64)
    for t in (1, 2):
        m = 0.9 * m + 0.1 * g[0]
        v = 0.999 * v + 0.001 * g[0] ** 2
        w = w - 0.1 * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m / (np.sqrt(v) + 1e-7)
    np.testing.assert_allclose(after["cat"]["rows"][0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(after["cat"]["rows"][1], first["cat"]["rows"][1])


@pytest.mark.parametrize(
    "parts, message",
    [
        (rows([1, 1], np.ones((2, 3))), "ids repeat"),
        (rows([1], np.full((1, 3), np.nan)), "NaN or infinity"),
        (rows([2], np.ones((1, 3))), "belongs to shard 0"),
        (rows([1], np.ones((1, 2))), r"gradient is \[1, 2\], expected \[1, 3\]"),
        ({"cat": {"ids": np.array([1], np.int64)}}, "sends 'ids' and 'gradient'"),
        ({"nope": {"ids": np.array([1], np.int64), "gradient": np.ones((1, 3), np.float32)}}, "no table 'emb/nope'"),
    ],
)
def test_a_bad_row_gradient_is_refused_and_changes_nothing(parts: dict[str, dict[str, np.ndarray]], message: str) -> None:
    s = store(UpdateRule.ASYNC, shard=1, shards=2)
    _, _, before = s.pull_embeddings({"cat": np.array([1], np.int64)})
    with pytest.raises(GradientError, match=message):
        s.push({"w": np.full((2,), 1.0, np.float32)}, 0, embeddings=parts)
    _, version, after = s.pull_embeddings({"cat": np.array([1], np.int64)})
    assert version == 0 and s.rows_held() == {"cat": 1}
    np.testing.assert_array_equal(after["cat"]["rows"], before["cat"]["rows"])
    with s.reading() as (_, _, variables):
        np.testing.assert_array_equal(variables["w"], DENSE["w"])  # the dense part was not applied either


def test_a_model_with_other_tables_is_another_model() -> None:
    s = store(shards=1)
    assert not s.initialize(DENSE, SGD, tables=[TABLE], shards=1)  # the same: nothing changes
    with pytest.raises(ModelMismatch, match="embedding tables"):
        s.initialize(DENSE, SGD, tables=[TableSpec("cat", 4)], shards=1)
    with pytest.raises(GradientError, match="twice"):
        ParameterStore(StoreSettings()).initialize(DENSE, SGD, tables=[TABLE, TABLE])


def test_a_restored_shard_has_every_row_it_had_with_its_slots_and_counts(tmp_path: Path) -> None:
    s = store(UpdateRule.ASYNC, shard=1, shards=2, optimizer=ADAM, checkpoint_dir=tmp_path, every=2)
    ids = np.arange(1, 2001, 2, dtype=np.int64)  # 1000 ids of shard 1
    s.pull_embeddings({"cat": ids})
    rng = np.random.default_rng(0)
    for version in range(4):
        touched = rng.choice(ids, 300, replace=False)
        s.push(ZERO, version, embeddings=rows(sorted(touched.tolist()), rng.normal(size=(300, 3))))
    s.flush_checkpoints()
    held = s.snapshot().arrays
    restored = ParameterStore(StoreSettings(shard=1, mode=TrainingMode(rule=UpdateRule.ASYNC),
                                            checkpoint_dir=tmp_path, checkpoint_steps=2))
    assert restored.restore() and restored.version == 4
    assert restored.rows_held() == {"cat": 1000}
    again = restored.snapshot().arrays
    for key in ("emb/cat/ids", "emb/cat/rows", "emb/cat/steps", "emb/cat/slot/m", "emb/cat/slot/v"):
        np.testing.assert_array_equal(again[key], held[key], err_msg=key)
    # and the restored table keeps training lazily: one more push moves exactly its rows
    restored.push(ZERO, 4, embeddings=rows([1], np.ones((1, 3))))
    assert restored.snapshot().arrays["emb/cat/steps"].sum() == held["emb/cat/steps"].sum() + 1


def test_staleness_aware_async_divides_a_rows_learning_rate_by_its_staleness() -> None:
    settings = StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.ASYNC, staleness_lr=True))
    s = ParameterStore(settings)
    s.initialize(DENSE, SGD, tables=[TABLE], shards=1)
    _, _, first = s.pull_embeddings({"cat": np.array([4], np.int64)})
    g = np.ones((1, 3), np.float32)
    s.push(ZERO, 0, embeddings=rows([4], g))  # fresh: lr 0.5
    s.push(ZERO, 0, embeddings=rows([4], g))  # computed on version 0, applied at 1: stale 1, lr 0.5
    outcome = s.push(ZERO, 0, embeddings=rows([4], g))  # stale 2: lr 0.25
    assert outcome.staleness == 2 and outcome.learning_rate == 0.25
    _, _, after = s.pull_embeddings({"cat": np.array([4], np.int64)})
    np.testing.assert_allclose(after["cat"]["rows"][0], first["cat"]["rows"][0] - (0.5 + 0.5 + 0.25), rtol=1e-6)


def test_a_checkpoint_whose_tables_do_not_fit_is_skipped_for_the_older_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file that verifies (its checksum is right) but whose table rows repeat an id, or whose
    optimizer is unknown: the shard restores the next older checkpoint, with a warning naming the
    file, instead of failing to start."""
    s = store(UpdateRule.ASYNC, shard=0, shards=1, optimizer=ADAM, checkpoint_dir=tmp_path, every=2)
    s.pull_embeddings({"cat": np.arange(10, dtype=np.int64)})
    for version in range(2):
        s.push(ZERO, version, embeddings=rows([1, 2], np.ones((2, 3))))
    s.flush_checkpoints()
    good = checkpoint.load_latest(tmp_path / "ps-0")
    assert good is not None and good.version == 2
    repeated = {**good.arrays, "emb/cat/ids": np.zeros_like(good.arrays["emb/cat/ids"])}
    checkpoint.save(tmp_path / "ps-0", checkpoint.Checkpoint(4, repeated, good.meta), keep=10)
    unknown = {**good.meta, "optimizer": {"name": "no-such-optimizer", "params": {}}}
    checkpoint.save(tmp_path / "ps-0", checkpoint.Checkpoint(6, good.arrays, unknown), keep=10)
    restored = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.ASYNC),
                                            checkpoint_dir=tmp_path, checkpoint_steps=2))
    with caplog.at_level("WARNING"):
        assert restored.restore() and restored.version == 2
    assert restored.rows_held() == {"cat": 10}
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 2 and "000000000006" in skipped[0] and "000000000004" in skipped[1], skipped
    assert "repeat" in skipped[1]


def test_a_round_one_shard_refuses_for_its_rows_is_applied_by_no_shard() -> None:
    """Two shards, one round: the rows the members sent shard 1 overflow when summed, shard 0's are
    fine. The coordinator's dry run on every shard aborts the round before any shard applied it:
    both stay at version 0 with their variables and rows as they were; the members' next
    gradients commit on both."""
    from elasticps.coordinator.shards import RoundAborted, Shards
    from elasticps.ps.main import LocalShard

    stores = [store(shard=i, shards=2) for i in range(2)]
    shards = Shards([LocalShard(s) for s in stores])
    own = {0: np.array([2], np.int64), 1: np.array([1], np.int64)}  # an id of each shard
    before = [s.pull_embeddings({"cat": own[i]})[2]["cat"]["rows"].copy() for i, s in enumerate(stores)]
    try:
        for worker in ("a", "b"):
            assert stores[0].push(ZERO, 0, worker=worker, embeddings=rows([2], np.full((1, 3), 1.0))).accepted
            assert stores[1].push(ZERO, 0, worker=worker, embeddings=rows([1], np.full((1, 3), 3e38))).accepted
        with pytest.raises(RoundAborted, match="NaN or infinite"):
            shards.commit(0, ["a", "b"])
        assert [s.version for s in stores] == [0, 0]
        for i, s in enumerate(stores):
            np.testing.assert_array_equal(s.pull_embeddings({"cat": own[i]})[2]["cat"]["rows"], before[i])
            with s.reading() as (_, _, variables):
                np.testing.assert_array_equal(variables["w"], DENSE["w"])
        for worker in ("a", "b"):  # trained again: finite this time
            stores[0].push(ZERO, 0, worker=worker, embeddings=rows([2], np.full((1, 3), 1.0)))
            stores[1].push(ZERO, 0, worker=worker, embeddings=rows([1], np.full((1, 3), 2.0)))
        assert shards.commit(0, ["a", "b"]) == [1, 1]
        lr = np.float32(0.5)
        for i, (s, grad) in enumerate(zip(stores, (1.0, 2.0))):
            after = s.pull_embeddings({"cat": own[i]})[2]["cat"]["rows"]
            np.testing.assert_allclose(after, before[i] - lr * np.float32(grad), rtol=1e-6)
    finally:
        shards.close()
