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
from elasticps.callbacks import LearningRateScheduler, ScheduleError


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
        ("feed", lambda dataset: dataset, r"feed takes 3 arguments, \(dataset, mode, metadata\), or 2"),
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


# ---- ElasticDL's zoo as it is: a 3-argument feed, a modelDef naming a function or a class --------
def test_elasticdls_three_argument_feed_is_its_dataset_fn(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Mode, Metadata]] = []

    def feed(dataset: Any, mode: Mode, _: Metadata) -> Any:  # ElasticDL's zoo since late 2020
        calls.append((mode, _))
        return dataset.map(lambda x, y: (tf.cast(x, tf.float32), y))

    module = load_model_module(install(monkeypatch, "edl_feed", feed=feed))
    assert module.dataset_fn is feed and module.feed is None
    metadata = Metadata(reader="idx")
    trainer = KerasTrainer(module, {}, minibatch_size=4, metadata=metadata)
    features, labels = np.ones((6, 2)), np.zeros(6, np.int64)
    trainer.build(features, labels)
    trainer.evaluate(features, labels)
    assert calls == [(Mode.TRAINING, metadata), (Mode.EVALUATION, metadata)]


def test_a_three_argument_feed_beside_a_dataset_fn_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    name = install(monkeypatch, "edl_both", feed=lambda d, m, md: d, dataset_fn=lambda d, m, md: d)
    with pytest.raises(ModelError, match=r"both feed\(dataset, mode, metadata\) and dataset_fn.*keep one"):
        load_model_module(name)


class TwoOutputs(keras.Model):  # a subclassed model, as ElasticDL's mnist_subclass.CustomModel
    def __init__(self, units: int = 2) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(units)

    def call(self, inputs: Any, training: bool = False) -> Any:
        return self.dense(inputs)


@pytest.mark.parametrize("attribute", ["TwoOutputs", "build_it"])
def test_a_model_def_may_name_the_class_or_function_that_makes_the_model(
    monkeypatch: pytest.MonkeyPatch, attribute: str
) -> None:
    name = install(monkeypatch, "edl_zoo_module", TwoOutputs=TwoOutputs, build_it=lambda units=2: TwoOutputs(units))
    module = load_model_module(f"{name}.{attribute}")
    assert module.name == name and module.custom_model is getattr(sys.modules[name], attribute)
    trainer = KerasTrainer(module, {"units": 3}, minibatch_size=4)
    features, labels = np.ones((4, 2), np.float32), np.zeros(4, np.int64)
    trainer.build(features, labels)
    assert isinstance(trainer.model, TwoOutputs) and trainer.model.dense.units == 3
    assert sorted(trainer.weights()) == sorted(v.path for v in trainer.model.trainable_variables)


def test_a_module_named_alone_needs_custom_model_and_one_naming_a_missing_class_says_which(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = install(monkeypatch, "edl_no_class")
    with pytest.raises(ModelError, match=r"model module 'edl_no_class.Missing' cannot be imported: No module named "
                                         r"'edl_no_class.Missing'.*and module 'edl_no_class' has no function or class Missing$"):
        load_model_module(f"{name}.Missing")
    delattr(sys.modules[name], "custom_model")
    with pytest.raises(ModelError, match=r"has no function custom_model\(\)"):
        load_model_module(name)
    with pytest.raises(ModelError, match=r"'nowhere_at_all.CustomModel' cannot be imported: No module named 'nowhere_at_all'$"):
        load_model_module("nowhere_at_all.CustomModel")
    with pytest.raises(ModelError, match=r"cannot be imported: No module named 'nowhere_at_all'"):
        load_model_module("nowhere_at_all")


# ---- callbacks(): the learning-rate schedule ---------------------------------------------------------
def test_callbacks_learning_rate_scheduler_is_the_modules_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    def schedule(model_version: int) -> float:  # ElasticDL's cifar10 schedule, shortened
        return 0.1 if model_version < 50 else 0.01 if model_version < 150 else 0.001

    name = install(monkeypatch, "edl_callbacks", callbacks=lambda: [LearningRateScheduler(schedule)])
    module = load_model_module(name)
    assert module.schedule is not None
    assert [module.schedule.learning_rate(v) for v in (0, 49, 50, 149, 150)] == [0.1, 0.1, 0.01, 0.01, 0.001]
    older = load_model_module(install(monkeypatch, "edl_older", learning_rate_scheduler=schedule))
    assert older.schedule is not None and older.schedule.learning_rate(60) == 0.01
    assert load_model_module(install(monkeypatch, "no_callbacks", callbacks=lambda: [])).schedule is None


@pytest.mark.parametrize(
    ("callbacks", "message"),
    [
        (lambda: [keras.callbacks.EarlyStopping()], r"callbacks\(\) gives keras.src.callbacks.early_stopping.EarlyStopping, "
                                                  r"which has no meaning on a parameter server"),
        (lambda: [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr)], r"schedules by epoch; use "
                                                                                r"elasticps.callbacks.LearningRateScheduler"),
        (lambda: LearningRateScheduler(lambda v: 0.1), r"callbacks\(\) returns a list, got LearningRateScheduler"),
        (lambda: [LearningRateScheduler(lambda v: 0.1)] * 2, "gives 2 learning-rate schedules"),
    ],
)
def test_callbacks_without_a_meaning_on_a_ps_are_refused_naming_them(
    monkeypatch: pytest.MonkeyPatch, callbacks: Callable[[], Any], message: str
) -> None:
    with pytest.raises(ModelError, match=message):
        load_model_module(install(monkeypatch, "edl_bad_callbacks", callbacks=callbacks))


def test_a_learning_rate_scheduler_needs_a_function() -> None:
    with pytest.raises(ScheduleError, match="must be a function of the model version"):
        LearningRateScheduler(0.1)  # type: ignore[arg-type]


# ---- elasticps.elasticdl: ElasticDL's names for its zoo's import lines ------------------------------
def test_elasticdls_names_are_importable_from_one_module() -> None:
    from elasticps import elasticdl
    from elasticps.backends.keras.layers import Embedding

    assert elasticdl.Mode is Mode and elasticdl.LearningRateScheduler is LearningRateScheduler
    assert elasticdl.Embedding is Embedding  # imported from the Keras backend when asked
    assert elasticdl.is_odps_configured() is False
    assert elasticdl.MaxComputeConfig.PROJECT_NAME == "MAXCOMPUTE_PROJECT"
    with pytest.raises(NotImplementedError, match="no MaxCompute"):
        elasticdl.ODPSWriter("project", "table")
    with pytest.raises(AttributeError, match="has no attribute 'ODPSReader'"):
        getattr(elasticdl, "ODPSReader")
    with pytest.raises(TypeError):
        elasticdl.BasePredictionOutputsProcessor()  # type: ignore[abstract]


def test_a_prediction_processor_gets_each_tasks_outputs_as_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    from elasticps.elasticdl import BasePredictionOutputsProcessor

    got: list[tuple[Any, int]] = []

    class PredictionOutputsProcessor(BasePredictionOutputsProcessor):
        def process(self, predictions: Any, worker_id: int) -> None:
            got.append((predictions, worker_id))

    module = load_model_module(install(monkeypatch, "with_processor", PredictionOutputsProcessor=PredictionOutputsProcessor))
    trainer = KerasTrainer(module, {}, minibatch_size=4)
    features = np.ones((6, 2), np.float32)
    trainer.build(features, np.zeros(6, np.int64))
    outputs = trainer.predict(features, None)
    trainer.process_predictions(outputs, 3)
    trainer.process_predictions(outputs, 3)
    assert [(type(p).__name__, w) for p, w in got] == [("EagerTensor", 3)] * 2
    np.testing.assert_allclose(got[0][0].numpy(), outputs)
    no_process = load_model_module(install(monkeypatch, "bad_processor", PredictionOutputsProcessor=lambda: object()))
    with pytest.raises(ModelError, match=r"PredictionOutputsProcessor has no process\(predictions, worker_id\)"):
        KerasTrainer(no_process, {}, minibatch_size=4).process_predictions(outputs, 0)
