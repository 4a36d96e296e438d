"""Records that carry their own labels (serialized tf.train.Example, labels None) through the
ElasticDL-style zoo module ``elasticps.backends.keras.zoo.mnist_functional``: the trainer's batches, gradients and
evaluation, and the worker's loop counting records when features are a dict."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import worker_fakes
from elasticps.api.modes import TrainingMode
from elasticps.api.spec import TrainingSpec
from elasticps.backends.keras.trainer import KerasTrainer
from elasticps.worker.metrics import WorkerMetrics
from elasticps.backends.keras.model_loading import load_model_module
from elasticps.worker.training import Worker, records_in
from elasticps.backends.keras.zoo.mnist_functional import example
from prometheus_client import CollectorRegistry
from worker_fakes import FakeCoordinator, FakePS, evaluation_task, training_task


@pytest.fixture(autouse=True)
def seeded() -> None:
    """Weights, dropout and shuffling drawn the same way every run: the learning test's threshold
    must not depend on luck."""
    import keras

    keras.utils.set_random_seed(0)


def images(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two classes anyone can tell apart: the top half lit (0) or the bottom half (1), plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=count)
    pixels = rng.integers(0, 60, size=(count, 28, 28))
    for image, label in zip(pixels, labels):
        image[14 * label : 14 * label + 14] += 180
    return pixels.astype(np.uint8), labels


class ExampleReader:
    """What ``reader: tfrecord`` gives: serialized examples, shape (n,), and no labels."""

    def __init__(self, count: int, seed: int = 0) -> None:
        pixels, self.labels = images(count, seed)
        self.records = np.array([example(image, int(label)) for image, label in zip(pixels, self.labels)], object)

    @property
    def num_records(self) -> int:
        return len(self.records)

    def read(self, start: int, end: int) -> tuple[np.ndarray, None]:
        return self.records[start:end], None


@pytest.fixture(scope="module")
def data() -> ExampleReader:
    return ExampleReader(96)


def trainer(minibatch: int = 16) -> KerasTrainer:
    return KerasTrainer(load_model_module("elasticps.backends.keras.zoo.mnist_functional"), {}, minibatch_size=minibatch)


def test_batches_parse_the_records_into_named_features_and_labels(data: ExampleReader) -> None:
    t = trainer()
    t.build(*data.read(0, 1))
    seen: list[np.ndarray] = []
    for x, y in t.batches(*data.read(0, 40), "evaluation"):
        assert set(x) == {"image"} and x["image"].shape[1:] == (28, 28)
        assert float(np.max(x["image"])) <= 1.0  # scaled to [0, 1]
        seen.append(np.asarray(y).reshape(-1))
    assert [len(s) for s in seen] == [16, 16, 8]
    np.testing.assert_array_equal(np.concatenate(seen), data.labels[:40])  # evaluation keeps the order
    shuffled = np.concatenate([np.asarray(y).reshape(-1) for _, y in t.batches(*data.read(0, 40), "training")])
    assert sorted(shuffled) == sorted(data.labels[:40])


def test_gradients_cover_every_trainable_variable(data: ExampleReader) -> None:
    t = trainer()
    t.build(*data.read(0, 1))
    weights = t.weights()
    assert any("batch_normalization" in name for name in weights)
    x, y = next(t.batches(*data.read(0, 16), "training"))
    loss, gradients = t.gradients(x, y)
    assert np.isfinite(loss) and loss > 0
    assert set(gradients) == set(weights)
    for name, gradient in gradients.items():
        assert gradient.shape == weights[name].shape and np.all(np.isfinite(gradient)), name


def test_local_steps_learn_and_evaluation_sums_over_the_records(data: ExampleReader) -> None:
    t = trainer()
    t.build(*data.read(0, 1))
    validation = ExampleReader(48, seed=1)
    before = t.evaluate(*validation.read(0, 48))
    assert set(before) == {"loss", "accuracy"}
    for _ in range(3):
        for x, y in t.batches(*data.read(0, 96), "training"):
            t.apply_local(t.gradients(x, y)[1])
    after = t.evaluate(*validation.read(0, 48))
    assert 0 <= after["accuracy"] <= 48  # a sum of per-record accuracies over 48 records
    assert after["loss"] < before["loss"] and after["accuracy"] >= 0.9 * 48


def test_records_in_counts_rows_of_arrays_dicts_and_tuples() -> None:
    assert records_in(np.zeros((5, 1))) == 5
    assert records_in({"image": np.zeros((3, 28, 28)), "id": np.zeros(3)}) == 3
    assert records_in((np.zeros(4), {"a": np.zeros(4)})) == 4


def test_the_worker_loop_trains_and_evaluates_records_without_labels(
    data: ExampleReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = trainer()
    t.build(*data.read(0, 1))
    names = sorted(t.weights())
    monkeypatch.setattr(worker_fakes, "SHARD_OF", {name: i % 2 for i, name in enumerate(names)})
    monkeypatch.setattr(worker_fakes, "STATE_OF", {name: i % 2 for i, name in enumerate(sorted(t.state()))})
    ps = FakePS()
    coordinator = FakeCoordinator([training_task(1, 0, 40), evaluation_task(2, 40, 72)], ps)
    registry = CollectorRegistry()
    worker = Worker(
        TrainingSpec(learning_rate=0.1), TrainingMode(), t, ps, coordinator, data, data,
        heartbeat_s=0.05, metrics=WorkerMetrics(registry, worker_fakes.WORKER),
    )
    worker.run()
    train, evaluation = coordinator.reports
    assert train.success and evaluation.success, (train.error, evaluation.error)
    assert worker.counters.steps == 3  # 16 + 16 + 8 records
    assert registry.get_sample_value("elasticps_worker_records_total", {"worker": worker_fakes.WORKER}) == 40
    assert train.loss_sum > 0
    assert set(evaluation.metric_sums) == {"loss", "accuracy"} and evaluation.metric_sums["accuracy"] <= 32


def test_a_module_written_for_elasticdl_runs_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """ElasticDL's habits: ``tf.keras`` names, one named (non-dict) input fed a dict, a loss that
    reduces itself, ``optimizer(lr=...)``, a ``dataset_fn(dataset, mode, _)`` that shuffles in
    training and gives int32 labels of shape [1], a metric giving booleans."""
    import sys
    import types

    import tensorflow as tf

    from elasticps import Mode

    module = types.ModuleType("elasticdl_style")

    def custom_model() -> Any:
        inputs = tf.keras.Input(shape=(4,), name="x")
        return tf.keras.Model(inputs=inputs, outputs=tf.keras.layers.Dense(2)(inputs))

    def loss(labels: Any, predictions: Any) -> Any:
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(logits=predictions, labels=tf.reshape(labels, [-1]))
        )

    def dataset_fn(dataset: Any, mode: Any, _: Any) -> Any:
        def parse(record: Any) -> Any:
            spec = {"x": tf.io.FixedLenFeature([4], tf.float32)}
            if mode != Mode.PREDICTION:
                spec["y"] = tf.io.FixedLenFeature([1], tf.int64)
            parsed = tf.io.parse_single_example(record, spec)
            if mode == Mode.PREDICTION:
                return {"x": parsed["x"]}
            return {"x": parsed["x"]}, tf.cast(parsed["y"], tf.int32)

        dataset = dataset.map(parse)
        return dataset.shuffle(64) if mode == Mode.TRAINING else dataset

    module.custom_model = custom_model  # type: ignore[attr-defined]
    module.loss = loss  # type: ignore[attr-defined]
    module.optimizer = lambda lr=0.5: tf.optimizers.SGD(lr)  # type: ignore[attr-defined]
    module.dataset_fn = dataset_fn  # type: ignore[attr-defined]
    module.eval_metrics_fn = lambda: {  # type: ignore[attr-defined]
        "accuracy": lambda labels, predictions: tf.equal(
            tf.argmax(predictions, 1, output_type=tf.int32), tf.reshape(labels, [-1])
        )
    }
    monkeypatch.setitem(sys.modules, "elasticdl_style", module)

    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    records = np.array(
        [
            tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }
                )
            ).SerializeToString()
            for row, label in zip(x, y)
        ],
        dtype=object,
    )
    t = KerasTrainer(load_model_module("elasticdl_style"), {}, minibatch_size=16)
    t.build(records[:1], None)
    before = t.evaluate(records, None)
    for _ in range(10):
        for xs, ys in t.batches(records, None, "training"):
            t.apply_local(t.gradients(xs, ys)[1])
    after = t.evaluate(records, None)
    assert after["loss"] < before["loss"] and after["accuracy"] >= 0.85 * 64
