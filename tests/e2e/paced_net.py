"""``elasticps.backends.keras.zoo.mlp`` with a floor under each training task's time: the model module of the tests
that must act on a job while it is still training (``test_local_changes.py``'s scaling), whatever
the machine's speed.

Each training task's records pass through the data function once, as one block; the block waits
``PAUSE_S`` there (no CPU). Loaded as ``--model_def paced_net`` (the test puts this folder on PYTHONPATH).
"""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

from elasticps.model_contract import Mode
from elasticps.backends.keras.zoo.mlp import custom_model, eval_metrics_fn, loss, optimizer
from elasticps.backends.keras.zoo.mlp import feed as mlp_feed

__all__ = ["custom_model", "eval_metrics_fn", "feed", "loss", "optimizer"]

PAUSE_S = 0.4  # per training task of up to 4096 records


def _pause() -> int:
    time.sleep(PAUSE_S)
    return 0


def feed(dataset: tf.data.Dataset, mode: str) -> tf.data.Dataset:
    if mode != Mode.TRAINING:
        return mlp_feed(dataset, mode)

    def paced(x: Any, y: Any) -> tuple[Any, Any]:
        waited = tf.py_function(_pause, [], tf.int32)
        with tf.control_dependencies([waited]):
            return tf.identity(x), tf.identity(y)

    return mlp_feed(dataset.batch(4096).map(paced).unbatch(), mode)
