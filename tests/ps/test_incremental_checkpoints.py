"""Incremental checkpoints (issue 38; ``spec.training.checkpointFullEvery``): one whole checkpoint in
N, the ones between holding the dense tensors whole and each embedding table's rows used since the
whole one, with the ids evicted since. A restore puts a delta and its base together, and the model
it gives is the model of that version exactly (every row, count, last use, slot, the clock),
through makes, updates, TTL and cap evictions and rows made again; bytes follow the rows changed;
retention keeps the whole checkpoints kept deltas need; a delta whose base does not read back is
not restorable, and says why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elasticps.api.embedding import TableSpec
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.api.row_policy import RowPolicies, RowPolicy
from elasticps.ps import checkpoint
from elasticps.ps.checkpointing import base_of
from elasticps.ps.checkpoint_deltas import merged
from elasticps.ps.embeddings import EmbeddingTable
from elasticps.ps.optimizers import make_optimizer
from elasticps.ps.store import ParameterStore, StoreSettings

SPEC = TableSpec("t", 8, seed=2)
ADAM = OptimizerConfig("adam", {"learning_rate": 0.01})


def by_id(arrays: dict[str, np.ndarray], name: str = "t") -> dict[str, np.ndarray]:
    """A table's arrays in id order (a delta's rows land at other positions than the live table's)."""
    prefix = f"emb/{name}/"
    order = np.argsort(arrays[prefix + "ids"])
    return {key: (value if key.endswith("/clock") else value[order]) for key, value in arrays.items()
            if key.startswith(prefix) and not key.endswith("/gone")}  # fmt: skip


def test_a_whole_snapshot_and_a_delta_of_it_make_the_table_now_through_evictions_and_rows_made_again() -> None:
    rng = np.random.default_rng(5)
    table = EmbeddingTable(SPEC, make_optimizer(ADAM), policy=RowPolicy(ttl=6, max_rows=300))
    for _ in range(10):
        ids = np.unique(rng.integers(0, 1000, 80)).astype(np.int64)
        table.pull(ids)
        table.push(ids, rng.normal(size=(ids.size, 8)).astype(np.float32), 0.01)
    table.log_evictions()  # as a whole checkpoint's capture does when deltas follow
    whole, clock = table.snapshot(), table.clock
    for _ in range(25):  # more rows than the cap, some past the TTL, some ids back after eviction
        ids = np.unique(rng.integers(0, 1000, 80)).astype(np.int64)
        table.pull(ids)
        table.push(ids, rng.normal(size=(ids.size, 8)).astype(np.float32), 0.01)
    assert table.stats().evicted > 0
    delta = table.delta(clock)
    assert delta["emb/t/gone"].size > 0 and delta["emb/t/ids"].size < table.rows_held + delta["emb/t/gone"].size
    now = by_id(table.snapshot())
    back = by_id(merged(whole, delta, "t"))
    assert set(back) == set(now)
    for key in now:
        np.testing.assert_array_equal(back[key], now[key], err_msg=key)


def store(tmp_path: Path, full_every: int, keep: int = 50, policy: str = "") -> ParameterStore:
    settings = StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.ASYNC), checkpoint_dir=tmp_path,
                             checkpoint_steps=1, keep_checkpoint_max=keep, checkpoint_full_every=full_every,
                             row_policies=RowPolicies.parse(policy))  # fmt: skip
    made = ParameterStore(settings)
    made.initialize({"w": np.zeros(4, np.float32)}, ADAM, tables=[SPEC])
    return made


def step(shard: ParameterStore, ids: np.ndarray, rng: np.random.Generator) -> None:
    shard.pull_embeddings({"t": ids})
    grads = rng.normal(size=(ids.size, 8)).astype(np.float32)
    shard.push({"w": np.ones(4, np.float32)}, shard.version, embeddings={"t": {"ids": ids, "gradient": grads}})
    shard.flush_checkpoints()  # every version on disk (a busy writer skips a version a newer one replaces)


def test_every_version_restores_to_the_model_it_was_whole_or_delta(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shard = store(tmp_path, full_every=4, policy="ttl=5,maxRows=400")
    step(shard, np.arange(300, dtype=np.int64), rng)  # version 1: whole
    models = {1: shard.snapshot()}
    for _ in range(11):
        step(shard, np.unique(rng.integers(0, 2000, 60)).astype(np.int64), rng)
        models[shard.version] = shard.snapshot()  # the model each version's checkpoint must give back
    shard.flush_checkpoints()
    kinds = {v: base_of(checkpoint.load(checkpoint.path_of(tmp_path / "ps-0", v)).meta) for v in models}
    assert kinds == {1: None, 2: 1, 3: 1, 4: 1, 5: None, 6: 5, 7: 5, 8: 5, 9: None, 10: 9, 11: 9, 12: 9}
    assert shard.checkpoint_versions() == sorted(models, reverse=True)
    for version, expected in models.items():
        back = shard._checkpoints.load(version)
        got = {key: value for table in back.tables.values() for key, value in table.snapshot().items()}
        want = {key: value for key, value in expected.arrays.items() if not key.startswith("opt/")}
        for key, value in by_id(want).items():
            np.testing.assert_array_equal(by_id(got)[key], value, err_msg=f"version {version}: {key}")
        np.testing.assert_array_equal(got["var/w"], want["var/w"])
        optimizer = {f"opt/{key}": value for key, value in back.optimizer.state().items()}
        for key, value in expected.arrays.items():
            if key.startswith("opt/"):
                np.testing.assert_array_equal(optimizer[key], value, err_msg=f"version {version}: {key}")
    # A new process at the same folder resumes the newest version, from a delta and its base.
    again = ParameterStore(shard.settings)
    assert again.restore() and again.version == 12
    assert again.rows_held() == shard.rows_held()


def test_a_delta_holds_the_rows_changed_since_its_base_and_its_bytes_follow_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    shard = store(tmp_path, full_every=10)
    held = np.arange(20_000, dtype=np.int64)
    step(shard, held, rng)  # version 1: whole, 20,000 rows
    step(shard, held[:200], rng)  # version 2: a delta of 1% of them
    shard.flush_checkpoints()
    folder = tmp_path / "ps-0"
    whole, delta = (checkpoint.path_of(folder, v).stat().st_size for v in (1, 2))
    assert checkpoint.load(checkpoint.path_of(folder, 2)).arrays["emb/t/ids"].size == 200
    assert 0.009 < delta / whole < 0.015, (delta, whole)  # 1% of the rows: about 1% of the bytes


def test_retention_keeps_the_whole_checkpoints_kept_deltas_need_and_a_delta_without_one_is_not_restorable(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(2)
    shard = store(tmp_path, full_every=5, keep=2)
    for _ in range(8):  # whole at 1 and 6; deltas 2-5 of 1, 7-8 of 6
        step(shard, np.unique(rng.integers(0, 500, 50)).astype(np.int64), rng)
    shard.flush_checkpoints()
    folder = tmp_path / "ps-0"
    on_disk = sorted(v for v in (checkpoint.version_of(p) for p in checkpoint.list_checkpoints(folder)) if v is not None)
    assert on_disk == [6, 7, 8]  # the 2 newest, and the whole one they are deltas of
    assert shard.checkpoint_versions() == [8, 7, 6]
    base = checkpoint.path_of(folder, 6)
    data = bytearray(base.read_bytes())
    data[-40] ^= 0x01  # the base is damaged: its deltas cannot be restored either
    base.write_bytes(bytes(data))
    assert shard.checkpoint_versions() == []
    unreadable = shard.unreadable_checkpoints()
    assert any("a delta of version 6, which does not read back" in line for line in unreadable), unreadable
    assert ParameterStore(shard.settings).restore() is False


def test_export_from_checkpoints_takes_a_delta_with_its_base(tmp_path: Path) -> None:
    from elasticps.worker.checkpoint_export import newest_common

    rng = np.random.default_rng(3)
    shard = store(tmp_path, full_every=3)
    step(shard, np.arange(100, dtype=np.int64), rng)  # whole
    step(shard, np.arange(10, dtype=np.int64), rng)  # a delta of 10 rows
    version, found = newest_common([tmp_path / "ps-0"])
    assert version == 2 and base_of(checkpoint.load(checkpoint.path_of(tmp_path / "ps-0", 2)).meta) == 1
    assert found[0].arrays["emb/t/ids"].size == 100  # made whole: every row of version 2
    np.testing.assert_array_equal(by_id(dict(found[0].arrays))["emb/t/rows"], by_id(dict(shard.snapshot().arrays))["emb/t/rows"])


def test_a_table_keeps_no_evictions_unless_incremental_checkpoints_ask() -> None:
    table = EmbeddingTable(SPEC, make_optimizer(ADAM), policy=RowPolicy(max_rows=32))
    for start in range(0, 400, 40):
        table.pull(np.arange(start, start + 40, dtype=np.int64))
    assert table.stats().evicted > 0 and table._gone == []  # a capped stream without deltas holds no log
