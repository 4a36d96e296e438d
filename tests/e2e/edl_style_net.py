"""A model module written as ElasticDL's zoo writes its modules today, with only its imports
elasticps's (``elasticps.elasticdl``): a subclassed model named by ``modelDef``
(``edl_style_net.CustomModel``), the 3-argument ``feed(dataset, mode, _)``, an ``optimizer(lr=...)``
with a default, ``callbacks()`` scheduling the learning rate by model version, and a
``PredictionOutputsProcessor`` in the style of ElasticDL's cifar10 (MaxCompute when configured,
else the outputs logged; here also appended to the file ``$EDL_STYLE_PREDICTIONS`` names, for the
test to count). The end-to-end test of that contract (``test_elasticdl_contract.py``) loads it
from this folder (it puts the folder on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
from typing import Any

import tensorflow as tf

from elasticps.elasticdl import BasePredictionOutputsProcessor, LearningRateScheduler, MaxComputeConfig, Mode
from elasticps.elasticdl import ODPSWriter, default_logger as logger, is_odps_configured

BOUNDARY = 60  # the model version the learning rate drops at


class CustomModel(tf.keras.Model):  # type: ignore[misc]  # Keras is untyped
    def __init__(self, hidden: int = 16) -> None:
        super().__init__(name="edl_style")
        self._hidden = tf.keras.layers.Dense(hidden, activation="relu")
        self._out = tf.keras.layers.Dense(2)

    def call(self, inputs: Any, training: bool = False) -> Any:
        return self._out(self._hidden(inputs["x"]))


def loss(labels: Any, predictions: Any) -> Any:
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(logits=predictions, labels=labels))


def optimizer(lr: float = 0.1) -> Any:
    return tf.optimizers.SGD(lr)


def callbacks() -> list[Any]:
    def _schedule(model_version: int) -> float:
        return 0.1 if model_version < BOUNDARY else 0.01

    return [LearningRateScheduler(_schedule)]


def feed(dataset: Any, mode: Any, _: Any) -> Any:
    def _parse(x: Any, y: Any) -> Any:
        features = {"x": tf.cast(x, tf.float32)}
        return features if mode == Mode.PREDICTION else (features, tf.cast(y, tf.int32))

    dataset = dataset.map(_parse)
    if mode == Mode.TRAINING:
        dataset = dataset.shuffle(buffer_size=256)
    return dataset


def eval_metrics_fn() -> dict[str, Any]:
    return {
        "accuracy": lambda labels, predictions: tf.equal(
            tf.argmax(predictions, 1, output_type=tf.int32), tf.cast(tf.reshape(labels, [-1]), tf.int32)
        )
    }


class PredictionOutputsProcessor(BasePredictionOutputsProcessor):
    def __init__(self) -> None:
        if is_odps_configured():
            self.odps_writer = ODPSWriter(os.environ[MaxComputeConfig.PROJECT_NAME], "edl_style_predictions")
        else:
            self.odps_writer = None

    def process(self, predictions: Any, worker_id: int) -> None:
        if self.odps_writer:
            self.odps_writer.from_iterator(iter(predictions.numpy().tolist()), worker_id)
        else:
            logger.info(predictions.numpy())
            with open(os.environ["EDL_STYLE_PREDICTIONS"], "a") as out:
                out.write(json.dumps({"worker": worker_id, "rows": predictions.numpy().tolist()}) + "\n")
