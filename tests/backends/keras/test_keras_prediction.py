"""KerasTrainer.predict and load_exported: the data function in prediction mode (pairs or
features alone), minibatches joined in record order, and an exported model loaded from a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from elasticps.model_contract import Metadata, Mode
from elasticps.backends.keras.trainer import KerasTrainer
from elasticps.backends.keras.model_loading import ModelError, ModelModule

MODES: list[str] = []


def module(feed: Any = None, dataset_fn: Any = None) -> ModelModule:
    return ModelModule(
        name="tiny",
        custom_model=lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)]),
        loss=lambda labels, predictions: keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True),
        optimizer=lambda: keras.optimizers.SGD(0.1),
        feed=feed,
        eval_metrics_fn=None,
        dataset_fn=dataset_fn,
    )


def pairs(dataset: tf.data.Dataset, mode: str) -> tf.data.Dataset:
    MODES.append(mode)
    return dataset.map(lambda x, y: (tf.cast(x, tf.float32) * 2.0, y))


def features_only(dataset: tf.data.Dataset, mode: Mode, metadata: Metadata) -> tf.data.Dataset:
    assert mode is Mode.PREDICTION
    return dataset.map(lambda x: tf.cast(x, tf.float32) * 2.0)


def records(n: int = 10) -> np.ndarray:
    return np.arange(n * 3, dtype=np.float32).reshape(n, 3) / 10


def test_a_pair_giving_feed_predicts_every_record_in_order_over_minibatches() -> None:
    trainer = KerasTrainer(module(feed=pairs), {}, minibatch_size=4)
    x = records()
    outputs = trainer.predict(x, np.zeros(10, np.int64))
    assert MODES[-1] == Mode.PREDICTION
    assert isinstance(outputs, np.ndarray) and outputs.shape == (10, 4)
    np.testing.assert_allclose(outputs, trainer.model(x * 2.0, training=False).numpy(), rtol=1e-6)


def test_records_without_labels_through_a_features_only_dataset_fn() -> None:
    trainer = KerasTrainer(module(dataset_fn=features_only), {}, minibatch_size=3)
    x = records(7)
    np.testing.assert_allclose(trainer.predict(x, None), trainer.model(x * 2.0).numpy(), rtol=1e-6)


def test_a_data_function_that_drops_records_is_refused() -> None:
    trainer = KerasTrainer(module(feed=lambda dataset, mode: dataset.take(2)), {}, minibatch_size=4)
    with pytest.raises(ModelError, match="gave 2 elements for 10 records in prediction mode"):
        trainer.predict(records(), np.zeros(10, np.int64))


def test_an_exported_model_replaces_the_modules_own(tmp_path: Path) -> None:
    exported = KerasTrainer(module(feed=pairs), {}, minibatch_size=4)
    exported.model.save(tmp_path / "model.keras")
    trainer = KerasTrainer(module(feed=pairs), {}, minibatch_size=4)
    x = records()
    before = trainer.predict(x, np.zeros(10, np.int64))
    trainer.load_exported(str(tmp_path))
    after = trainer.predict(x, np.zeros(10, np.int64))
    np.testing.assert_allclose(after, exported.predict(x, np.zeros(10, np.int64)), rtol=1e-6)
    assert not np.allclose(before, after)


def test_a_missing_exported_model_is_a_model_error(tmp_path: Path) -> None:
    trainer = KerasTrainer(module(feed=pairs), {}, minibatch_size=4)
    with pytest.raises(ModelError, match=r"spec.prediction.model: cannot read .*/model.keras"):
        trainer.load_exported(str(tmp_path))
