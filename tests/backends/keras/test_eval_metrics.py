"""ElasticDL's ``eval_metrics_fn`` forms (``elasticps/backends/keras/eval_metrics.py``): per-output
metrics of a dict-output model and Keras metric objects, evaluated by the Keras trainer."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from elasticps.backends.api import ModelError
from elasticps.backends.keras.eval_metrics import eval_metrics
from elasticps.backends.keras.model_loading import ModelModule
from elasticps.backends.keras.trainer import KerasTrainer


def two_outputs() -> keras.Model:
    """Logits and probabilities of one click model, as ElasticDL's DeepFM gives them."""
    inputs = keras.Input((3,))
    logits = keras.layers.Reshape(())(keras.layers.Dense(1, name="score")(inputs))
    probs = keras.layers.Activation("sigmoid")(logits)
    return keras.Model(inputs, {"logits": logits, "probs": probs})


def module(metrics: Any) -> ModelModule:
    return ModelModule(
        name="clicks",
        custom_model=two_outputs,
        loss=lambda labels, outputs: keras.losses.binary_crossentropy(
            tf.cast(tf.reshape(labels, [-1]), tf.float32), outputs["logits"], from_logits=True
        ),
        optimizer=lambda: keras.optimizers.SGD(0.1),
        feed=None,
        eval_metrics_fn=lambda: metrics,
    )


def accuracy(labels: Any, logits: Any) -> Any:
    return tf.equal(tf.cast(tf.reshape(logits, [-1]) > 0.0, tf.int32), tf.cast(tf.reshape(labels, [-1]), tf.int32))


def data(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, 3)).astype(np.float32)
    return x, (x[:, 0] + 0.3 * rng.normal(size=count) > 0).astype(np.int64)


def test_per_output_metrics_and_a_keras_auc_are_evaluated_on_their_outputs() -> None:
    trainer = KerasTrainer(module({"logits": {"accuracy": accuracy}, "probs": {"auc": keras.metrics.AUC()}}), {}, 16)
    x, y = data(200)
    trainer.build(x, y)
    sums = trainer.evaluate(x, y)
    outputs = trainer.predict(x, None)
    expected_accuracy = np.mean((outputs["logits"] > 0).astype(np.int64) == y)
    reference = keras.metrics.AUC()
    reference.update_state(y, outputs["probs"])
    assert sorted(sums) == ["accuracy", "auc", "loss"]
    assert sums["accuracy"] / 200 == pytest.approx(expected_accuracy)
    assert sums["auc"] / 200 == pytest.approx(float(reference.result()), abs=1e-6)  # the task's, x its records
    again = trainer.evaluate(x[:50], y[:50])  # a second task: the metric starts afresh
    reference.reset_state()
    reference.update_state(y[:50], outputs["probs"][:50])
    assert again["auc"] / 50 == pytest.approx(float(reference.result()), abs=1e-6)


def test_a_keras_mean_metric_averages_over_the_tasks_records_exactly() -> None:
    accuracy_object = keras.metrics.BinaryAccuracy(threshold=0.5)
    trainer = KerasTrainer(module({"probs": {"binary_accuracy": accuracy_object}, "logits": {"hits": accuracy}}), {}, 16)
    x, y = data(100, seed=1)
    trainer.build(x, y)
    sums = trainer.evaluate(x, y)
    assert sums["binary_accuracy"] == pytest.approx(sums["hits"], abs=1e-4)  # the same quantity, both ways


def test_one_name_on_two_outputs_is_named_by_output() -> None:
    found = eval_metrics("m", {"logits": {"accuracy": accuracy}, "probs": {"accuracy": accuracy}, "top": accuracy})
    assert [(m.name, m.output) for m in found] == [("logits/accuracy", "logits"), ("probs/accuracy", "probs"),
                                                  ("top", None)]  # fmt: skip


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ([accuracy], "returns a dict of metrics, got list"),
        ({"accuracy": 0.5}, "'accuracy' is float: a function of"),
        ({"probs": {"auc": "auc"}}, "'probs/auc' is str"),
        ({"loss": accuracy}, r"names \['loss'\] more than once \('loss' is the job's own\)"),
        ({"accuracy": accuracy, "acc": {"accuracy": accuracy}, "acc/accuracy": accuracy},
         r"names \['acc/accuracy'\] more than once"),
    ],
)
def test_metrics_that_are_not_metrics_are_refused_in_one_line(given: Any, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        eval_metrics("m", given)


def test_a_metric_of_an_output_the_model_does_not_have_says_which_outputs_it_has() -> None:
    trainer = KerasTrainer(module({"scores": {"accuracy": accuracy}}), {}, 16)
    x, y = data(20)
    with pytest.raises(ModelError, match=r"reads the model's output 'scores', but the outputs are \['logits', 'probs'\]"):
        trainer.build(x, y)  # said when the model is built, before any training
