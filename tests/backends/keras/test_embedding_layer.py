"""``elasticps.backends.keras.layers.Embedding`` in one plain process, and ``elasticps.backends.keras.zoo.deepfm`` on it."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticps.api.embedding import EmbeddingError, TableSpec, initial_rows  # noqa: E402
from elasticps.backends.keras.layers import Embedding, first_rows  # noqa: E402
from elasticps.backends.keras.zoo import deepfm  # noqa: E402


def test_a_local_table_gives_each_id_its_row_id_mod_local_rows() -> None:
    layer = Embedding("t", 4, seed=3, local_rows=100)
    ids = np.array([[1, 101, -1], [7, 99, 2**40]], dtype=np.int64)
    out = np.asarray(layer(ids))
    assert out.shape == (2, 3, 4)
    expected = initial_rows(TableSpec("t", 4, seed=3), np.mod(ids, 100).reshape(-1)).reshape(2, 3, 4)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out[0, 0], out[0, 1])  # 1 and 101 share a row locally


@pytest.mark.parametrize("initializer", ["uniform", "normal"])
@pytest.mark.parametrize("dim", [1, 8])
def test_first_rows_in_tensorflow_are_the_ps_first_values_eagerly_and_in_a_graph(initializer: str, dim: int) -> None:
    spec = TableSpec("t", dim, initializer=initializer, seed=5)
    ids = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)
    expected = initial_rows(spec, ids)
    np.testing.assert_array_equal(first_rows(spec, tf.constant(ids)).numpy(), expected)
    np.testing.assert_array_equal(tf.function(lambda t: first_rows(spec, t))(tf.constant(ids)).numpy(), expected)


def test_bad_tables_are_refused_when_the_model_is_made() -> None:
    with pytest.raises(EmbeddingError, match="dim 0"):
        Embedding("t", 0)
    with pytest.raises(ValueError, match="local_rows 0"):
        Embedding("t", 4, local_rows=0)


def test_a_model_with_the_layer_saves_and_loads(tmp_path: Path) -> None:
    model = deepfm.custom_model(dim=4, hidden=8, local_rows=64)
    ids = np.arange(39 * 3, dtype=np.int64).reshape(3, 39)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=False, compile=False)
    np.testing.assert_allclose(np.asarray(loaded(ids)), np.asarray(model(ids)), rtol=1e-6)


def synthetic_ctr(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """39 fields of ids; a click is likely when field 0's id is even and field 5's id is below 20."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, size=(n, 39)) + np.arange(39) * 1000
    score = 2.0 * (ids[:, 0] % 2 == 0) + 1.5 * (ids[:, 5] % 1000 < 20) - 2.0
    clicks = rng.random(n) < 1 / (1 + np.exp(-3 * score))
    return ids.astype(np.int64), clicks.astype(np.int64)


def test_deepfm_learns_clicks_in_one_plain_process() -> None:
    keras.utils.set_random_seed(1)
    x, y = synthetic_ctr(6000, 0)
    test_x, test_y = synthetic_ctr(2000, 1)
    model = deepfm.custom_model(dim=4, hidden=16, local_rows=1 << 16)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=deepfm.loss)
    before = deepfm.auc(test_y, model.predict(test_x, verbose=0))
    model.fit(x, y, batch_size=128, epochs=3, verbose=0)
    logits = model.predict(test_x, verbose=0)
    assert deepfm.auc(test_y, logits) > max(0.8, before + 0.2)
    assert deepfm.log_loss(test_y, logits) < deepfm.log_loss(test_y, np.zeros_like(logits))


def test_auc_by_ranks_agrees_with_counting_pairs() -> None:
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    s = np.round(rng.random(300), 1)  # many ties
    pos, neg = s[y], s[~y]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert deepfm.auc(y, s) == pytest.approx(pairs / (pos.size * neg.size), abs=1e-12)
    with pytest.raises(ValueError, match="clicks and non-clicks"):
        deepfm.auc(np.ones(3), np.zeros(3))


def test_the_fm_term_is_the_sum_of_every_field_pairs_dot_product() -> None:
    e = np.random.default_rng(2).standard_normal((3, 5, 4)).astype(np.float32)
    brute = np.array([sum(e[n, i] @ e[n, j] for i in range(5) for j in range(i + 1, 5)) for n in range(3)])
    np.testing.assert_allclose(np.asarray(deepfm.PairwiseInteractions()(e)).reshape(-1), brute, rtol=1e-5)


def test_keras_and_elasticdl_arguments_make_the_same_table_named_by_the_layer() -> None:
    keras_style = Embedding(1000, 8, name="words")  # keras.layers.Embedding(input_dim, output_dim)
    assert (keras_style.spec.name, keras_style.spec.dim, keras_style.local_rows) == ("words", 8, 1000)
    by_name = Embedding(input_dim=50, output_dim=4, name="ids")
    assert (by_name.spec.name, by_name.spec.dim, by_name.local_rows) == ("ids", 4, 50)
    elasticdl_style = Embedding(output_dim=16, mask_zero=True, input_length=10)  # ElasticDL's, unnamed
    assert elasticdl_style.spec.dim == 16 and elasticdl_style.spec.name == elasticdl_style.name
    assert Embedding(6).spec.dim == 6  # ElasticDL's Embedding(output_dim)
    assert Embedding("t", output_dim=3).spec == TableSpec("t", 3)
    second = Embedding(output_dim=16)
    assert second.spec.name != elasticdl_style.spec.name  # Keras names layers apart: two tables
    assert Embedding("t", 4, embeddings_initializer="zeros").spec.initializer == "zeros"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("t",), {}, "row width is missing"),
        (("t", 4), {"output_dim": 4}, "same argument"),
        ((10, 4), {"output_dim": 4}, "give the table and dim"),
        (("t", 4), {"embeddings_initializer": keras.initializers.Zeros()}, "embeddings_initializer"),
    ],
)
def test_arguments_that_do_not_say_one_table_are_refused(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Embedding(*args, **kwargs)


def test_mask_zero_masks_the_ids_zero_for_the_layers_after_it_and_survives_a_save(tmp_path: Path) -> None:
    ids = np.array([[3, 0, 5], [0, 0, 1]], dtype=np.int64)
    layer = Embedding(input_dim=10, output_dim=2, mask_zero=True, name="masked")
    np.testing.assert_array_equal(np.asarray(layer.compute_mask(ids)), ids != 0)
    assert Embedding("plain", 2).compute_mask(ids) is None
    inputs = keras.Input((3,), dtype="int64")
    pooled = keras.layers.GlobalAveragePooling1D()(layer(inputs))  # averages the unmasked rows only
    model = keras.Model(inputs, pooled)
    rows = initial_rows(layer.spec, np.arange(10, dtype=np.int64))
    np.testing.assert_allclose(np.asarray(model(ids))[1], rows[1], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(model(ids))[0], (rows[3] + rows[5]) / 2, rtol=1e-6)
    path = tmp_path / "masked.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(np.asarray(loaded(ids)), np.asarray(model(ids)), rtol=1e-6)
