"""TensorFlow ops on Keras's symbolic tensors (``elasticps/backends/keras/tf_ops.py``): a functional
model built as ElasticDL's DeepFM builds it (``tf.keras.backend.sum``, ``tf.reshape``,
``tf.sigmoid``, ``tf.cast`` applied to the ``keras.Input`` tensors) builds under Keras 3, computes
what the ops compute, passes gradients, and saves and loads, in a fresh process too, with
elasticps's layers imported."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow.keras.backend as K  # noqa: N812  # the modules' own spelling

import elasticps.backends.keras.layers  # noqa: F401  # registers the dispatcher, as the worker does
from elasticps.backends.keras.export_proof import prove
from elasticps.backends.keras.tf_ops import TensorFlowOp, _encode, _Slot

IDS = np.array([[1, 2, 3, 0], [4, 5, 6, 7], [9, 9, 0, 0]], np.int64)


def deepfm_like() -> tuple[keras.Model, keras.layers.Embedding]:
    ids = keras.Input((4,), dtype="int64", name="feature")
    table = keras.layers.Embedding(10, 3)
    embeddings = table(ids)
    second = K.sum(K.square(K.sum(embeddings, axis=1)) - K.sum(K.square(embeddings), axis=1), axis=1)
    logits = tf.reshape(second, shape=(-1,))
    probs = tf.reshape(tf.sigmoid(logits), shape=(-1, 1))
    clipped = tf.clip_by_value(tf.cast(probs, tf.float64), 0.0, tf.constant(0.75, tf.float64))
    return keras.Model(ids, {"logits": logits, "probs": probs, "clipped": clipped}), table


def by_hand(weights: np.ndarray) -> dict[str, np.ndarray]:
    e = weights[IDS]
    logits = (e.sum(axis=1) ** 2 - (e**2).sum(axis=1)).sum(axis=1)
    probs = 1 / (1 + np.exp(-logits))
    return {"logits": logits, "probs": probs.reshape(-1, 1), "clipped": np.minimum(probs, 0.75).reshape(-1, 1)}


def test_tensorflow_ops_on_symbolic_tensors_build_a_model_that_computes_what_they_compute() -> None:
    model, table = deepfm_like()
    got = model(IDS)
    want = by_hand(table.embeddings.numpy())
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=1e-5, atol=1e-6)
    ops = [layer.symbol for layer in model.layers if isinstance(layer, TensorFlowOp)]
    assert ops.count("math.reduce_sum") == 3 and "reshape" in ops and "math.sigmoid" in ops and "cast" in ops
    assert np.asarray(got["clipped"]).dtype == np.float64


def test_gradients_flow_through_the_ops_to_the_weights() -> None:
    model, table = deepfm_like()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(IDS)["logits"])
    (gradient,) = tape.gradient(loss, [table.embeddings])
    rows = np.abs(np.asarray(tf.convert_to_tensor(gradient))).sum(axis=1)
    assert set(np.flatnonzero(rows)) == {0, 1, 2, 3, 4, 5, 6, 7, 9}  # every id looked up (8 is not)


def test_the_model_saves_and_loads_here_and_in_a_fresh_process_with_elasticps_layers(tmp_path: Path) -> None:
    model, _ = deepfm_like()
    path = tmp_path / "model.keras"
    model.save(path)
    again = keras.models.load_model(path)
    expected = [np.asarray(o) for o in keras.tree.flatten(model(IDS))]
    for a, b in zip(keras.tree.flatten(again(IDS)), expected):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6)
    proof = prove(path, IDS, expected, "not_needed")
    assert proof.loaded and proof.needs == ("elasticps.backends.keras.layers",)


def test_an_argument_without_a_config_form_is_said_with_its_op() -> None:
    assert _encode([_Slot(0), tf.float32, np.int64(3), (1, -1), tf.TensorShape([2, None])], "reshape") == [
        {"__tensor__": 0}, {"__dtype__": "float32"}, 3, [1, -1], [2, None]]  # fmt: skip
    layer = TensorFlowOp("reshape", [_Slot(0), object()])
    with pytest.raises(ValueError, match=r"tf.reshape on a symbolic tensor cannot be saved: its argument <object"):
        layer.get_config()


def test_calls_without_symbolic_tensors_are_left_to_tensorflow() -> None:
    real = tf.reshape(tf.constant([[1.0, 2.0]]), shape=(-1,))  # eager: the dispatcher does not answer
    assert isinstance(real, tf.Tensor) and not isinstance(real, keras.KerasTensor)
    assert real.numpy().tolist() == [1.0, 2.0]
