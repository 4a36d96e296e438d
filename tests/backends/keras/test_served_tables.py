"""The worker's side of PS-served embedding tables (issue 17), on a real KerasTrainer: the ids a
minibatch touches (through layers whose inputs the model computes), one pull per table of the
distinct ids, the looked-up values, and each id's gradient summed over its occurrences and over
the layers sharing its table."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticps.api.embedding import initial_rows  # noqa: E402
from elasticps.backends.keras.trainer import KerasTrainer  # noqa: E402
from elasticps.backends.keras.model_loading import ModelError, ModelModule  # noqa: E402
from elasticps.backends.keras.layers import Embedding  # noqa: E402
from elasticps.backends.keras.zoo import deepfm  # noqa: E402


def shared_table_model() -> keras.Model:
    """Two layers on one table "t": ids[:, :2] and ids[:, 1:] (id column 1 seen by both), summed."""
    ids = keras.Input(shape=(3,), dtype="int64", name="ids")
    left = Embedding("t", 2)(ids[:, :2])
    right = Embedding("t", 2)(ids[:, 1:])
    total = keras.ops.sum(left, axis=(1, 2)) + keras.ops.sum(right, axis=(1, 2))
    return keras.Model(ids, keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(total[:, None]))


def module(make: Any) -> ModelModule:
    return ModelModule(name="test_module", custom_model=make, loss=lambda y, p: tf.reshape(p, [-1]),
                       optimizer=lambda: keras.optimizers.SGD(0.1), feed=None, eval_metrics_fn=None)


class Source:
    """Rows whose values are their id (every column): the pulls it answered, in order."""

    def __init__(self, dims: Mapping[str, int]) -> None:
        self.dims = dims
        self.asked: list[dict[str, np.ndarray]] = []
        self.training: list[bool] = []  # each pull's: false for evaluation and prediction

    def __call__(self, ids: Mapping[str, np.ndarray], training: bool = True) -> dict[str, np.ndarray]:
        self.asked.append({t: v.copy() for t, v in ids.items()})
        self.training.append(training)
        return {t: self.rows(t, v) for t, v in ids.items()}

    def rows(self, table: str, ids: np.ndarray) -> np.ndarray:
        return np.repeat(ids.astype(np.float32)[:, None], self.dims[table], axis=1)

    def held(self, tables: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every id asked so far, as the PS would hold it."""
        out = {}
        for table in tables:
            ids = np.unique(np.concatenate([a[table] for a in self.asked if table in a] or [np.empty(0, np.int64)]))
            out[table] = (ids, self.rows(table, ids))
        return out


def test_one_pull_per_table_and_each_ids_gradient_summed_over_occurrences_and_layers() -> None:
    trainer = KerasTrainer(module(shared_table_model), {}, minibatch_size=4, serve_tables=True)
    assert [t.name for t in trainer.tables()] == ["t"]
    (kernel,) = trainer.model.trainable_variables  # the Dense layer's: no table, no row buffer among them
    assert kernel.path.endswith("/kernel")
    source = Source({"t": 2})
    trainer.serve_rows(source, source.held)
    x = np.array([[5, 7, 9], [7, 7, 1], [5, 3, 9], [1, 1, 1]], np.int64)
    trainer.build(x, np.zeros(4, np.int64))
    source.asked.clear()  # building takes the rows' first values, not the source's
    loss, dense = trainer.gradients(tf.constant(x), tf.zeros(4, tf.int64))
    assert len(source.asked) == 1
    np.testing.assert_array_equal(source.asked[0]["t"], [1, 3, 5, 7, 9])  # distinct, sorted, once
    # Every lookup adds its id twice (two columns); column 1 is looked up by both layers.
    looked_up = np.concatenate([x[:, :2], x[:, 1:]], axis=1)
    np.testing.assert_allclose(loss, np.mean(2.0 * looked_up.sum(axis=1)), rtol=1e-6)
    rows = trainer.row_gradients()["t"]
    ids, counts = np.unique(looked_up, return_counts=True)
    np.testing.assert_array_equal(rows.ids, ids)
    np.testing.assert_allclose(rows.grads, np.repeat(counts[:, None] / 4.0, 2, axis=1), rtol=1e-6)
    assert list(dense) == [kernel.path]


def test_deepfm_hashes_ids_into_its_id_space_before_the_tables() -> None:
    trainer = KerasTrainer(module(lambda: deepfm.custom_model(dim=2, hidden=4, fields=3, id_space=10)), {},
                           minibatch_size=4, serve_tables=True)
    source = Source({"deepfm_factors": 2, "deepfm_linear": 1})
    trainer.serve_rows(source, source.held)
    x = np.array([[123, -4, 10**15 + 7]], np.int64)
    trainer.build(x, np.zeros(1, np.int64))
    source.asked.clear()
    trainer.gradients(tf.constant(x), tf.zeros(1, tf.int64))
    assert sorted(source.asked[0]) == ["deepfm_factors", "deepfm_linear"]
    np.testing.assert_array_equal(source.asked[0]["deepfm_factors"], np.unique(np.mod(x, 10)))  # [3, 6, 7]
    assert set(trainer.row_gradients()) == {"deepfm_factors", "deepfm_linear"}


def test_a_subclassed_model_with_a_served_table_is_refused_with_the_reason() -> None:
    class Bag(keras.Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.table = Embedding("t", 2)
            self.out = keras.layers.Dense(1)

        def call(self, ids: Any) -> Any:
            return self.out(keras.ops.sum(self.table(ids), axis=1))

    trainer = KerasTrainer(module(Bag), {}, minibatch_size=2, serve_tables=True)
    with pytest.raises(ModelError, match="functional or sequential"):
        trainer.build(np.array([[1, 2]], np.int64), np.zeros(1, np.int64))


def test_the_export_holds_the_rows_the_ps_holds_and_loads_and_predicts_without_a_ps(tmp_path: Any) -> None:
    # Named as the zoo module it is: the export's proof loads it beside the module (its own layers).
    zoo = dataclasses.replace(module(lambda: deepfm.custom_model(dim=2, hidden=4, fields=3)), name=deepfm.__name__)
    trainer = KerasTrainer(zoo, {}, minibatch_size=4, serve_tables=True)
    source = Source({"deepfm_factors": 2, "deepfm_linear": 1})
    trainer.serve_rows(source, source.held)
    x = np.array([[5, 7, 9], [7, 1, 3]], np.int64)
    trainer.build(x, np.zeros(2, np.int64))
    trainer.gradients(tf.constant(x), tf.zeros(2, tf.int64))  # the "PS" now holds ids 1, 3, 5, 7, 9
    served = trainer.predict(x, np.zeros(2, np.int64))
    assert source.training[-1] is False and source.training[0] is True  # prediction asks the PS to make no row
    trainer.export(tmp_path)
    needs = json.loads((tmp_path / "loading.json").read_text())["model.keras"]["needs"]
    assert needs == ["import elasticps.backends.keras.layers", f"import {deepfm.__name__}"]
    loaded = keras.models.load_model(tmp_path / "model.keras")
    tables = {layer.spec.name: layer for layer in loaded.layers if isinstance(layer, Embedding)}
    assert {name: layer.held for name, layer in tables.items()} == {"deepfm_factors": 5, "deepfm_linear": 5}
    np.testing.assert_array_equal(tables["deepfm_factors"].held_ids.numpy(), [1, 3, 5, 7, 9])
    np.testing.assert_allclose(np.asarray(loaded.predict(x, verbose=0)), served, rtol=1e-6)
    # An id it does not hold looks up its first values, as the PS answers an id with no row.
    unseen = np.array([[5, 7, 1234]], np.int64)
    assert np.isfinite(np.asarray(loaded.predict(unseen, verbose=0))).all()
    for name, layer in tables.items():
        far = np.array([1234, -2**40, 2**62], np.int64)
        np.testing.assert_array_equal(np.asarray(layer(far[None, :]))[0], initial_rows(layer.spec, far))
        # and so in a graph, as model.predict and a served model run it (its uint64 constants once
        # went through float64 there: a capped job's export then scored other than its evaluation)
        graph = tf.function(lambda ids, layer=layer: layer(ids))
        np.testing.assert_array_equal(np.asarray(graph(tf.constant(far[None, :])))[0], initial_rows(layer.spec, far))
