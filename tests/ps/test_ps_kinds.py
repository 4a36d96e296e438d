"""The shard's table kinds (issue 32): every kind has an entry in ``ps/kinds.py``; a model is made
and a checkpoint restored through those entries, each declared table by the kind its spec carries
(a checkpoint written before kinds: embedding tables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from elasticps.api.embedding import TableSpec
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.api.table_kinds import TableKind
from elasticps.ps import checkpoint
from elasticps.ps.checkpointing import Checkpointing, capture, rebuild
from elasticps.ps.embeddings import EmbeddingTable
from elasticps.ps.kinds import KINDS, Kind, Making, Restoring
from elasticps.ps.model import Model
from elasticps.ps.optimizers import make_optimizer
from elasticps.ps.state_table import StateTable
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.ps.tables import DenseTable, Table

ADAM = OptimizerConfig("adam", {"learning_rate": 0.1})
SPEC = TableSpec("items", 3, seed=5)
IDS = np.array([2, 4, 6], np.int64)  # shard 0 of 2


def test_every_kind_has_an_entry() -> None:
    assert set(KINDS) == set(TableKind)


def trained(shard: int = 0, shards: int = 2) -> Model:
    """A model of the three kinds, made through the registry, its rows pulled and pushed once."""
    optimizer = make_optimizer(ADAM)
    tables: dict[str, Table[Any]] = {
        KINDS[TableKind.DENSE].key(None): KINDS[TableKind.DENSE].create(
            Making(shard, shards, optimizer, tensors={"w": np.ones(2, np.float32)})),
        KINDS[TableKind.STATE].key(None): KINDS[TableKind.STATE].create(
            Making(shard, shards, optimizer, tensors={"mean": np.zeros(2, np.float32)})),
        KINDS[SPEC.kind].key(SPEC): KINDS[SPEC.kind].create(Making(shard, shards, optimizer, spec=SPEC)),
    }
    model = Model.of(tables, optimizer)
    table = model.embeddings["items"]
    assert isinstance(table, EmbeddingTable)
    table.pull(IDS)
    table.push(IDS, np.ones((3, 3), np.float32), 0.1)
    return model


def test_a_model_made_through_the_registry_has_each_table_under_its_kinds_key() -> None:
    model = trained()
    assert list(model.tables) == ["dense", "state", "emb/items"]
    assert isinstance(model.dense, DenseTable) and isinstance(model.state, StateTable)
    assert model.keys == {"items": "emb/items"}


def test_a_checkpoint_records_each_declared_tables_kind_and_restores_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model = trained()
    saved = capture(model, 7, 0)
    assert saved.meta["tables"] == [{"name": "items", "dim": 3, "initializer": "uniform", "scale": 0.05, "seed": 5,
                                     "kind": "embedding"}]
    restored_with: list[Restoring] = []
    entry = KINDS[TableKind.EMBEDDING]

    def restore(found: Restoring) -> Table[Any]:
        restored_with.append(found)
        return entry.restore(found)

    monkeypatch.setitem(KINDS, TableKind.EMBEDDING, Kind(entry.key, entry.create, restore))  # type: ignore[index]
    back = rebuild(saved, 0)
    assert [found.spec for found in restored_with] == [SPEC]
    np.testing.assert_array_equal(back.embeddings["items"].held()[1], model.embeddings["items"].held()[1])
    np.testing.assert_array_equal(back.dense.variables["w"], model.dense.variables["w"])


def test_a_checkpoint_written_before_kinds_restores_its_tables_as_embedding_tables(tmp_path: Path) -> None:
    model = trained()
    saved = capture(model, 7, 0)
    old_meta = {**saved.meta, "tables": [{k: v for k, v in spec.items() if k != "kind"} for spec in saved.meta["tables"]]}
    checkpoint.save(tmp_path / "ps-0", checkpoint.Checkpoint(7, saved.arrays, old_meta))
    restored = Checkpointing(tmp_path / "ps-0", shard=0).restore()
    assert restored is not None
    back, version = restored
    assert version == 7 and back.embeddings["items"].spec == SPEC and SPEC.kind is TableKind.EMBEDDING
    np.testing.assert_array_equal(back.embeddings["items"].held()[1], model.embeddings["items"].held()[1])


def test_a_checkpoint_naming_an_unknown_kind_is_refused_naming_it(tmp_path: Path) -> None:
    saved = capture(trained(), 7, 0)
    meta = {**saved.meta, "tables": [{**saved.meta["tables"][0], "kind": "frobnicated"}]}
    with pytest.raises(checkpoint.CheckpointError, match="table kind 'frobnicated' is unknown"):
        rebuild(checkpoint.Checkpoint(7, saved.arrays, meta), 0)
    checkpoint.save(tmp_path / "ps-0", checkpoint.Checkpoint(7, saved.arrays, meta))
    assert Checkpointing(tmp_path / "ps-0", shard=0).restore() is None  # skipped, as any unusable file


def test_the_store_makes_a_pushed_models_tables_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[TableKind] = []
    for kind, entry in list(KINDS.items()):
        def create(making: Making, kind: TableKind = kind, entry: Kind = entry) -> Table[Any]:
            made.append(kind)
            return entry.create(making)

        monkeypatch.setitem(KINDS, kind, Kind(entry.key, create, entry.restore))  # type: ignore[index]
    store = ParameterStore(StoreSettings(shard=1, mode=TrainingMode(rule=UpdateRule.ASYNC)))
    assert store.initialize({"w": np.zeros(2, np.float32)}, ADAM, state={"m": np.zeros(1, np.float32)},
                            tables=[SPEC], shards=2)
    assert made == [TableKind.DENSE, TableKind.STATE, TableKind.EMBEDDING]
    assert store.rows_held() == {"items": 0}
