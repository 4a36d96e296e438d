"""The TensorFlow side of a worker: a Keras model, its gradients, local updates and evaluation.

Used by the training loop (``training.py``) through the :class:`Trainer` protocol (``ports.py``),
which keeps the loop free of TensorFlow and testable. Records come as a reader gives them:
``(features, labels)`` arrays, or features alone (labels ``None``: serialized ``tf.train.Example``
strings, say) that the module's ``dataset_fn``/``feed`` turns into ``(features, labels)`` pairs;
features may be a dict of tensors (a functional model's named inputs). Variables are named by their Keras path
(``sequential/dense/kernel``), the names the PS shards by. The gradient step runs under
``tf.function``; the PS never sees TensorFlow, only numpy arrays.

Besides the trainable variables, the PS keeps the model's *state*: its non-trainable floating-point
variables (BatchNormalization's ``moving_mean`` and ``moving_variance``; a frozen layer's weights
too, which then travel with every push), also named by their Keras path. :meth:`KerasTrainer.state`
reads them for each push and :meth:`KerasTrainer.assign_state` takes the PS's after a pull, so every
worker evaluates with the statistics the PS holds (``ps/state_table.py`` has the PS's rule). Integer
state is not synchronised: Keras 3's ``SeedGenerator`` states (Dropout's random stream) stay each
worker's own, and so do the local optimizer's variables (they are not the model's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticps.api.optimizer import OptimizerConfig  # noqa: E402
from elasticps.api.output import KERAS_FILE, SAVED_MODEL_DIR  # noqa: E402
from elasticps.model_contract import Metadata, Mode  # noqa: E402
from elasticps.worker.model_loading import ModelError, ModelModule  # noqa: E402
from elasticps.worker.optimizer_spec import optimizer_config  # noqa: E402


def configure_threads(num_threads: int) -> None:
    """Caps TensorFlow's thread pools (0 leaves TensorFlow's defaults); call before any op runs."""
    if num_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(num_threads)
        tf.config.threading.set_inter_op_parallelism_threads(num_threads)


class KerasTrainer:
    """One worker's Keras model. ``learning_rate`` is the job's (``spec.training.learningRate``): when
    > 0 it replaces the model optimizer's own rate for SSP's local steps, as the PS replaces it for
    the pushed gradients, so both sides step with one rate. ``metadata`` is what the module's
    ``dataset_fn`` gets beside the records. Built by ``worker/main.py``."""

    def __init__(
        self,
        module: ModelModule,
        params: Mapping[str, Any],
        minibatch_size: int,
        seed: int = 0,
        learning_rate: float = 0.0,
        metadata: Metadata | None = None,
    ) -> None:
        self._module = module
        self._metadata = metadata or Metadata()
        self._minibatch_size = minibatch_size
        self._rng = np.random.default_rng(seed)
        try:
            self.model = module.custom_model(**params)
        except TypeError as err:
            raise ModelError(f"{module.name}.custom_model(**{dict(params)}): {err}") from None
        self._local_optimizer = module.optimizer()
        if learning_rate > 0:
            # Refuses (OptimizerError) what the PS cannot run, a schedule above all, before the
            # override would hide it; then the local copy steps at the job's rate.
            optimizer_config(self._local_optimizer, learning_rate)
            self._local_optimizer.learning_rate = learning_rate
        self._metric_fns = module.eval_metrics_fn() if module.eval_metrics_fn else {}
        self._built = False
        self._variables: dict[str, tf.Variable] = {}
        self._state: dict[str, tf.Variable] = {}
        self._predict: Any = None  # the inference step, traced on first use

    # ---- variables ---------------------------------------------------------------------------
    def _build(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        if self._built:
            return
        sample, _, _ = self._pairs(features[:1], None if labels is None else labels[:1], Mode.TRAINING)
        self.model(sample, training=False)
        variables: dict[str, tf.Variable] = {}
        for variable in self.model.trainable_variables:
            name = variable.path
            if name in variables:
                raise ModelError(f"{self._module.name}: two variables named {name!r}")
            variables[name] = variable
        self._variables = variables
        self._state = self._state_variables(variables)
        self._ordered = list(variables.values())
        self._names = list(variables)
        self._step = tf.function(self._gradient_step, reduce_retracing=True)
        self._eval = tf.function(self._eval_step, reduce_retracing=True)
        self._built = True

    def _state_variables(self, trainable: Mapping[str, tf.Variable]) -> dict[str, tf.Variable]:
        """The non-trainable floating-point variables, by path (integer ones, such as seed
        generator states, are each worker's own)."""
        state: dict[str, tf.Variable] = {}
        for variable in self.model.non_trainable_variables:
            if not tf.as_dtype(variable.dtype).is_floating:
                continue
            name = variable.path
            if name in state or name in trainable:
                raise ModelError(f"{self._module.name}: two variables named {name!r}")
            state[name] = variable
        return state

    def build(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        """Creates the variables from the first record (Keras builds lazily)."""
        self._build(features, labels)

    def weights(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(v.numpy()) for name, v in self._variables.items()}

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            variable = self._variables.get(name)
            if variable is None:
                raise ModelError(f"the PS holds variable {name!r}, which this model does not have")
            variable.assign(value)

    def state(self) -> dict[str, np.ndarray]:
        """The model's non-trainable floating-point variables now (copies), by path."""
        return {name: np.asarray(v.numpy()) for name, v in self._state.items()}

    def assign_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            variable = self._state.get(name)
            if variable is None:
                raise ModelError(f"the PS holds state {name!r}, which this model does not have")
            variable.assign(value)

    def optimizer_config(self, learning_rate: float) -> OptimizerConfig:
        return optimizer_config(self._local_optimizer, learning_rate if learning_rate > 0 else None)

    # ---- data --------------------------------------------------------------------------------
    def _dataset(self, features: np.ndarray, labels: np.ndarray | None, mode: Mode) -> tf.data.Dataset:
        records = features if labels is None else (features, labels)
        dataset = tf.data.Dataset.from_tensor_slices(records)
        return self._module.prepare(dataset, mode, self._metadata)

    def _pairs(self, features: np.ndarray, labels: np.ndarray | None, mode: Mode) -> tuple[Any, Any, int]:
        """Every record through the module's data function, as one batch: ``(x, y, records)``."""
        element = self._dataset(features, labels, mode).batch(max(1, len(features))).get_single_element()
        if not (isinstance(element, tuple) and len(element) == 2):
            what = "dataset_fn(dataset, mode, metadata)" if self._module.feed is None else "feed(dataset, mode)"
            if labels is None and self._module.feed is None and self._module.dataset_fn is None:
                raise ModelError(
                    f"{self._module.name}: the records have no labels (serialized tf.train.Example?) "
                    f"and the module has no {what} to make (features, labels) pairs of them"
                )
            raise ModelError(f"{self._module.name}: {what} must give (features, labels) pairs in {mode} mode")
        x, y = element
        return x, y, int(tf.shape(tf.nest.flatten(y)[0])[0])

    def batches(self, features: np.ndarray, labels: np.ndarray | None, mode: str) -> Iterator[tuple[Any, Any]]:
        """Minibatches of a task's records, shuffled for training.

        The module's data function runs once over the whole task (one batch of fixed-shape
        tensors); minibatches are then gathered from it, which costs far less per step than
        iterating a tf.data pipeline.
        """
        self._build(features, labels)
        x, y, count = self._pairs(features, labels, Mode(mode))
        order = self._rng.permutation(count) if mode == Mode.TRAINING else np.arange(count)
        for start in range(0, count, self._minibatch_size):
            index = tf.constant(order[start : start + self._minibatch_size])
            yield tf.nest.map_structure(lambda t: tf.gather(t, index), (x, y))

    # ---- steps -------------------------------------------------------------------------------
    def _gradient_step(self, x: Any, y: Any) -> tuple[Any, list[Any]]:
        with tf.GradientTape() as tape:
            predictions = self.model(x, training=True)
            loss = tf.reduce_mean(self._module.loss(y, predictions))
        gradients = tape.gradient(loss, self._ordered)
        return loss, [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, self._ordered)]

    def warm_up(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        """Runs the gradient step once on these records (one minibatch), so that TensorFlow
        traces and optimises it now, before the worker's first pull: the first call takes seconds
        (tracing, then graph optimisation on first execution), and a gradient computed on a model
        pulled before them would reach an async PS as stale as the other workers' pushes in
        those seconds. The gradients are thrown away; the weights are untouched (no update is
        applied) and the state (BatchNorm statistics) is put back as it was."""
        self._build(features, labels)
        x, y, _ = self._pairs(features, labels, Mode.TRAINING)
        state = self.state()
        self._step(x, y)
        self.assign_state(state)

    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]:
        loss, gradients = self._step(x, y)
        return float(loss), {name: g.numpy() for name, g in zip(self._names, gradients)}

    def apply_local(self, gradients: Mapping[str, np.ndarray]) -> None:
        """SSP: applies own gradients to the local copy between pulls (at the job's rate when set)."""
        self._local_optimizer.apply_gradients(
            [(tf.convert_to_tensor(gradients[name]), v) for name, v in self._variables.items()]
        )

    def _eval_step(self, x: Any, y: Any) -> dict[str, Any]:
        predictions = self.model(x, training=False)
        results = {"loss": tf.reduce_mean(self._module.loss(y, predictions))}
        for name, fn in self._metric_fns.items():
            results[name] = tf.reduce_mean(tf.cast(fn(y, predictions), tf.float32))
        return results

    def evaluate(self, features: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
        """Sums of each metric x minibatch size over the records (the coordinator divides)."""
        sums: dict[str, float] = {}
        for x, y in self.batches(features, labels, Mode.EVALUATION):
            count = int(tf.shape(tf.nest.flatten(y)[0])[0])
            for name, value in self._eval(x, y).items():
                sums[name] = sums.get(name, 0.0) + float(value) * count
        return sums

    # ---- prediction --------------------------------------------------------------------------
    def predict(self, features: np.ndarray, labels: np.ndarray | None) -> Any:
        """The model's outputs for every record, in order, in inference mode: a numpy array (or a
        dict or list of them, for a model with several outputs), one row per record.

        The records go through the data function in ``Mode.PREDICTION``; it may give features alone
        or ``(features, labels)`` pairs (a module written for training and evaluation): an element
        that is a pair is read as one, and its labels are dropped. Labels the reader gives are
        handed to the data function as for evaluation."""
        records = features if labels is None else (features, labels)
        dataset = self._module.prepare(tf.data.Dataset.from_tensor_slices(records), Mode.PREDICTION, self._metadata)
        element = dataset.batch(max(1, len(features))).get_single_element()
        x = element[0] if isinstance(element, tuple) and len(element) == 2 else element
        count = int(tf.shape(tf.nest.flatten(x)[0])[0])
        if count != len(features):
            raise ModelError(
                f"{self._module.name}: the data function gave {count} elements for {len(features)} records "
                "in prediction mode (it must keep one per record)"
            )
        if self._predict is None:
            self._predict = tf.function(lambda inputs: self.model(inputs, training=False), reduce_retracing=True)
        parts = []
        for start in range(0, count, self._minibatch_size):
            index = tf.range(start, min(count, start + self._minibatch_size))
            parts.append(self._predict(tf.nest.map_structure(lambda t: tf.gather(t, index), x)))
        joined = tf.nest.map_structure(lambda *ts: tf.concat(ts, axis=0), *parts)
        return tf.nest.map_structure(lambda t: np.asarray(t.numpy()), joined)

    def load_exported(self, folder: str) -> None:
        """Replaces the model by an exported one: ``<folder>/model.keras`` (a local folder or an
        object-store URI, read through ``elasticps.storage``), for a job that only predicts.
        Custom layers load when the model module registered them (it is imported already)."""
        import tempfile

        import keras

        from elasticps.storage import open_input

        source = f"{folder.rstrip('/')}/{KERAS_FILE}"
        try:
            with tempfile.TemporaryDirectory(prefix="elasticps-model-") as scratch:
                local = Path(scratch) / KERAS_FILE
                with open_input(source) as remote, open(local, "wb") as copy:
                    while chunk := remote.read(8 << 20):
                        copy.write(chunk)
                self.model = keras.models.load_model(local, compile=False)
        except OSError as err:
            raise ModelError(f"spec.prediction.model: cannot read {source}: {err}") from None
        except (ValueError, TypeError) as err:
            raise ModelError(f"spec.prediction.model: {source} is not a Keras model this module can load: {err}") from None
        self._predict = None

    # ---- export ------------------------------------------------------------------------------
    def export(self, directory: Path) -> None:
        """Writes the model as it is now: ``model.keras`` (Keras 3's file, ``keras.models.load_model``)
        and ``saved_model/`` (a TensorFlow SavedModel whose ``serve`` signature runs the model in
        inference mode: ``tf.saved_model.load``, TensorFlow Serving). Inputs are what ``feed``
        makes of a record; the files hold no optimizer (the PS kept it)."""
        self.model.save(directory / KERAS_FILE)
        self.model.export(str(directory / SAVED_MODEL_DIR), format="tf_saved_model", verbose=False)
