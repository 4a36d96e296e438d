"""The model contract (``elasticps/backends/keras/model_loading.py``): ElasticDL's ``dataset_fn`` beside ``feed``."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import elasticps
from elasticps import Metadata, Mode
from elasticps.backends.keras import model_loading
from elasticps.backends.keras.trainer import KerasTrainer
from elasticps.backends.keras.model_loading import ModelError, load_model_module


def install(monkeypatch: pytest.MonkeyPatch, name: str, **functions: Callable[..., Any]) -> str:
    """A model module ``name`` with a tiny linear model and the given functions."""
    module = types.ModuleType(name)
    module.custom_model = lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])  # type: ignore[attr-defined]
    module.loss = lambda labels, predictions: keras.losses.sparse_categorical_crossentropy(  # type: ignore[attr-defined]
        labels, predictions, from_logits=True
    )
    module.optimizer = lambda: keras.optimizers.SGD(0.1)  # type: ignore[attr-defined]
    for attribute, function in functions.items():
        setattr(module, attribute, function)
    monkeypatch.setitem(sys.modules, name, module)
    return name


def test_mode_is_elasticdls_strings_and_importable_from_the_package() -> None:
    assert [m.value for m in Mode] == ["training", "evaluation", "prediction"]
    assert Mode.TRAINING == "training" and Mode.EVALUATION == "evaluation" and Mode.PREDICTION == "prediction"
    assert str(Mode.TRAINING) == "training" and f"{Mode.EVALUATION}" == "evaluation"
    assert elasticps.Mode is model_loading.Mode is Mode
    assert Metadata().column_names is None


def test_a_dataset_fn_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    def dataset_fn(dataset: Any, mode: Mode, _: Any) -> Any:
        return dataset

    module = load_model_module(install(monkeypatch, "with_dataset_fn", dataset_fn=dataset_fn))
    assert module.dataset_fn is dataset_fn and module.feed is None


def test_feed_and_dataset_fn_together_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    name = install(monkeypatch, "with_both", feed=lambda d, m: d, dataset_fn=lambda d, m, md: d)
    with pytest.raises(ModelError, match="both feed.*dataset_fn.*keep one"):
        load_model_module(name)


@pytest.mark.parametrize(
    ("attribute", "function", "message"),
    [
        ("dataset_fn", lambda dataset, mode: dataset, r"dataset_fn\(dataset, mode, metadata\) takes 3"),
        ("feed", lambda dataset: dataset, r"feed\(dataset, mode\) takes 2"),
        ("dataset_fn", 3, "dataset_fn must be a function"),
    ],
)
def test_a_data_function_of_the_wrong_shape_is_refused(
    monkeypatch: pytest.MonkeyPatch, attribute: str, function: Any, message: str
) -> None:
    with pytest.raises(ModelError, match=message):
        load_model_module(install(monkeypatch, "wrong_shape", **{attribute: function}))


def test_dataset_fn_gets_the_mode_and_the_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Mode, Metadata]] = []

    def dataset_fn(dataset: Any, mode: Mode, metadata: Metadata) -> Any:
        calls.append((mode, metadata))
        return dataset.map(lambda x, y: (tf.cast(x, tf.float32), y))

    metadata = Metadata(column_names=("a", "b"), reader="csv")
    module = load_model_module(install(monkeypatch, "sees_metadata", dataset_fn=dataset_fn))
    trainer = KerasTrainer(module, {}, minibatch_size=4, metadata=metadata)
    features, labels = np.ones((6, 2)), np.zeros(6, np.int64)
    trainer.build(features, labels)
    assert sum(len(y) for _, y in trainer.batches(features, labels, "training")) == 6
    assert sum(len(y) for _, y in trainer.batches(features[:5], labels[:5], "training")) == 5
    trainer.evaluate(features, labels)
    # Traced once per mode (build's pipeline is training's), not called again for every task.
    assert calls == [(Mode.TRAINING, metadata), (Mode.EVALUATION, metadata)]
    assert all(type(mode) is Mode for mode, _ in calls)


def test_a_feed_module_comparing_strings_still_sees_its_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def feed(dataset: Any, mode: str) -> Any:
        seen.append(mode == "training")
        return dataset.map(lambda x, y: (tf.cast(x, tf.float32), y))

    trainer = KerasTrainer(load_model_module(install(monkeypatch, "feeds", feed=feed)), {}, minibatch_size=4)
    features, labels = np.ones((4, 2)), np.zeros(4, np.int64)
    list(trainer.batches(features, labels, "training"))
    trainer.evaluate(features, labels)
    assert seen == [True, False]  # traced once per mode: build and the training task share one


def test_records_without_labels_need_a_data_function(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = KerasTrainer(load_model_module(install(monkeypatch, "bare")), {}, minibatch_size=4)
    with pytest.raises(ModelError, match="no labels.*no dataset_fn"):
        trainer.build(np.array([b"record"], dtype=object), None)


def test_a_dataset_fn_giving_features_only_in_training_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def dataset_fn(dataset: Any, mode: Mode, metadata: Metadata) -> Any:
        return dataset.map(lambda record: {"x": tf.zeros((2,))})

    trainer = KerasTrainer(load_model_module(install(monkeypatch, "no_pairs", dataset_fn=dataset_fn)), {}, 4)
    with pytest.raises(ModelError, match=r"must give \(features, labels\) pairs in training mode"):
        trainer.build(np.array([b"record"], dtype=object), None)
