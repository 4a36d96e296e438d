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

With ``serve_tables``, the model's ``elasticps.backends.keras.layers.Embedding`` tables live on the PS: before
every model call on a minibatch (a gradient step, an evaluation, a prediction) the rows of its ids
are pulled into the layers (``served_tables.py``), and each gradient step leaves the rows'
gradients for the next push (:meth:`KerasTrainer.row_gradients`). SSP's local steps
(:meth:`KerasTrainer.apply_local`) update the dense variables only: rows are pulled fresh for
every minibatch.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticps.api.embedding import TableSpec  # noqa: E402
from elasticps.api.optimizer import OptimizerConfig  # noqa: E402
from elasticps.api.embedding import RowGrads  # noqa: E402
from elasticps.api.output import KERAS_FILE, LOADING_FILE, SAVED_MODEL_DIR  # noqa: E402
from elasticps.model_contract import Metadata, Mode  # noqa: E402
from elasticps.backends.api import HeldRows, ModelError, RowSource, tables_served  # noqa: E402
from elasticps.backends.keras.eval_metrics import eval_metrics  # noqa: E402
from elasticps.backends.keras.export_proof import ExportProofError, Proof, prove  # noqa: E402
from elasticps.backends.keras.functional_twin import functional_twin, is_subclassed  # noqa: E402
from elasticps.backends.keras.model_loading import ModelModule  # noqa: E402
from elasticps.backends.keras.optimizer_spec import optimizer_config  # noqa: E402
from elasticps.backends.keras.served_tables import ServedTables  # noqa: E402
from elasticps.callbacks import LearningRateScheduler, ScheduleError  # noqa: E402


log = logging.getLogger(__name__)


def configure_threads(num_threads: int) -> None:
    """Sizes TensorFlow's two thread pools (within an op, between ops) to ``num_threads`` each;
    call before any op runs."""
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    tf.config.threading.set_intra_op_parallelism_threads(num_threads)
    tf.config.threading.set_inter_op_parallelism_threads(num_threads)


def seed_everything(seed: int) -> None:
    """Seeds Python's, numpy's and TensorFlow's random state (Keras's initializers draw from them):
    a model built after it starts from the same weights in every run."""
    tf.keras.utils.set_random_seed(seed)


# Fused assigns traced for this many sets of pulled names at most (a set is the variables of the
# shards a pull found newer: all of them, mostly); other sets are assigned one variable at a time.
MAX_ASSIGNERS = 16


def minibatch_sizes(count: int, minibatch_size: int) -> list[int]:
    """The sizes of the minibatches ``count`` records make: full ones, then the rest (if any)."""
    full, rest = divmod(count, minibatch_size)
    return [minibatch_size] * full + ([rest] if rest else [])


def split_flat(flat: np.ndarray, shapes: list[tuple[int, ...]], sizes: list[int]) -> list[np.ndarray]:
    """Views of one flat buffer as consecutive arrays of ``shapes`` (``sizes``: their element counts)."""
    views, offset = [], 0
    for shape, size in zip(shapes, sizes):
        views.append(flat[offset : offset + size].reshape(shape))
        offset += size
    return views


def any_batch(spec: Any) -> Any:
    """A tensor's spec with its leading (minibatch) dimension left open."""
    shape = spec.shape
    return tf.TensorSpec([None, *shape[1:]], spec.dtype) if shape.rank else spec


def compiled(function: Any, example: tuple[Any, ...]) -> Any:
    """``function`` under ``tf.function`` for arguments shaped as ``example`` with any minibatch
    size: traced once, the last (smaller) minibatch of a task included."""
    signature = tf.nest.map_structure(lambda t: any_batch(tf.TensorSpec.from_tensor(tf.convert_to_tensor(t))), example)
    return tf.function(function, input_signature=list(signature))


def fused_assign(variables: list[tf.Variable]) -> Callable[[Iterable[np.ndarray]], None]:
    """One traced call assigning a value to each of ``variables`` (in that order).

    Variables of one dtype take their values as one flat vector: the values are copied into a
    buffer kept for the next call, and the traced graph splits it. TensorFlow's cost per argument
    of a call (binding it to the signature, making a tensor of it) then comes once, not once per
    variable: 0.36 ms against 0.84 ms a call for the MNIST CNN's 8 variables."""
    if len({v.dtype for v in variables}) != 1:
        signature = [tf.TensorSpec(v.shape, v.dtype) for v in variables]

        def assign_all(*values: Any) -> None:
            for variable, value in zip(variables, values):
                variable.assign(value)

        traced = tf.function(assign_all, input_signature=signature).get_concrete_function()
        return lambda values: traced(*values)

    shapes = [tuple(v.shape) for v in variables]
    sizes = [math.prod(shape) for shape in shapes]
    dtype = tf.as_dtype(variables[0].dtype)

    def assign_flat(flat: Any) -> None:
        for variable, part, shape in zip(variables, tf.split(flat, sizes), shapes):
            variable.assign(tf.reshape(part, shape))

    traced_flat = tf.function(assign_flat, input_signature=[tf.TensorSpec([sum(sizes)], dtype)]).get_concrete_function()
    buffer = np.empty(sum(sizes), dtype.as_numpy_dtype)

    def assign(values: Iterable[np.ndarray]) -> None:
        offset = 0
        for value, size in zip(values, sizes):
            buffer[offset : offset + size] = np.ravel(value)
            offset += size
        traced_flat(tf.convert_to_tensor(buffer))

    return assign


def one_input(model: Any, x: Any) -> Any:
    """``x`` as ``model`` takes it. Keras 2 gave a model of one input the one tensor of a one-entry
    dict, whatever its key (ElasticDL's DeepFM feeds ``{"feature": ids}`` to an unnamed ``Input``);
    Keras 3 asks a dict's keys to be the inputs' names. A dict that names the input, several
    inputs, or a subclassed model (no inputs of its own): ``x`` as it is."""
    import keras

    inputs = getattr(model, "inputs", None)
    if not (isinstance(x, Mapping) and len(x) == 1 and isinstance(inputs, list) and len(inputs) == 1):
        return x
    names = {getattr(inputs[0], "name", None)} | {layer.name for layer in getattr(model, "layers", [])
                                                  if isinstance(layer, keras.layers.InputLayer)}  # fmt: skip
    return x if next(iter(x)) in names else next(iter(x.values()))


class TaskPipeline:
    """A task's records through a module's data function into one batch, traced once.

    ``prepare`` maps a dataset of records to one of ``(features, labels)`` elements; built anew
    for every task, its ``map`` functions would be traced anew every time. Here the whole pipeline
    (slices of the records, ``prepare``, one batch of everything) is one ``tf.function`` taking
    the records with any count, traced on the first task only. A data function that cannot run
    inside a graph runs eagerly, as before, on every task.
    """

    def __init__(self, prepare: Any) -> None:
        self._prepare = prepare
        self._traced: Any = None
        self._eager = False

    def _element(self, *records: Any) -> Any:
        dataset = tf.data.Dataset.from_tensor_slices(records[0] if len(records) == 1 else records)
        return self._prepare(dataset).batch(tf.shape(records[0], out_type=tf.int64)[0]).get_single_element()

    def __call__(self, records: tuple[np.ndarray, ...]) -> Any:
        count = len(records[0])
        if count == 0 or self._eager:
            return self._eager_element(records)
        if self._traced is None:
            signature = [any_batch(tf.TensorSpec.from_tensor(tf.convert_to_tensor(r))) for r in records]
            try:
                self._traced = tf.function(self._element, input_signature=signature)
                return self._traced(*records)
            except (TypeError, ValueError, NotImplementedError, tf.errors.OpError):
                self._traced, self._eager = None, True
                return self._eager_element(records)
        return self._traced(*records)

    def _eager_element(self, records: tuple[np.ndarray, ...]) -> Any:
        dataset = tf.data.Dataset.from_tensor_slices(records[0] if len(records) == 1 else records)
        return self._prepare(dataset).batch(max(1, len(records[0]))).get_single_element()


def _rows_gradient(gradient: Any, buffer: tf.Variable) -> Any:
    """A row buffer's gradient as one dense row per buffer row (the gather's gradient comes as
    slices, one per occurrence of an id: summed per row here)."""
    if gradient is None:
        return tf.zeros_like(buffer)
    if isinstance(gradient, tf.IndexedSlices):
        return tf.math.unsorted_segment_sum(gradient.values, gradient.indices, tf.shape(buffer)[0])
    return gradient


def _schedule_of(module: ModelModule, optimizer: Any) -> tuple[LearningRateScheduler | None, bool]:
    """The module's learning-rate schedule by model version, and whether it is its optimizer's
    (a ``keras.optimizers.schedules.LearningRateSchedule`` as the optimizer's learning rate, called
    with the model version for the step); at most one of the two."""
    rate = getattr(optimizer, "_learning_rate", None)
    if not isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        return module.schedule, False
    if module.schedule is not None:
        raise ModelError(f"{module.name}: the optimizer's learning rate is a schedule and callbacks() schedules "
                         "it too: keep one")
    return LearningRateScheduler(lambda version: float(rate(version))), True


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
        serve_tables: bool = False,
    ) -> None:
        self._module = module
        self._metadata = metadata or Metadata()
        self._minibatch_size = minibatch_size
        self._rng = np.random.default_rng(seed)
        try:
            if serve_tables:
                with tables_served():
                    self.model = module.custom_model(**params)
            else:
                self.model = module.custom_model(**params)
        except TypeError as err:
            raise ModelError(f"{module.name}.custom_model(**{dict(params)}): {err}") from None
        self._tables = ServedTables(self.model, module.name)
        self._local_optimizer = module.optimizer()
        self._schedule, self._optimizer_scheduled = _schedule_of(module, self._local_optimizer)
        if self._schedule is not None and learning_rate > 0:
            raise ModelError(f"{module.name}: spec.training.learningRate {learning_rate} and the module's "
                             "learning-rate schedule both set the rate: keep one")
        if learning_rate > 0:
            # Refuses (OptimizerError) what the PS cannot run, a schedule above all, before the
            # override would hide it; then the local copy steps at the job's rate.
            optimizer_config(self._local_optimizer, learning_rate)
            self._local_optimizer.learning_rate = learning_rate
        self._metrics = eval_metrics(module.name, module.eval_metrics_fn() if module.eval_metrics_fn else {})
        self._set_metric_fns = module.eval_set_metrics_fn() if module.eval_set_metrics_fn else {}
        self._built = False
        self._variables: dict[str, tf.Variable] = {}
        self._state: dict[str, tf.Variable] = {}
        self._predict: Any = None  # the inference step, traced on first use
        self._processor: Any = None  # the module's PredictionOutputsProcessor, made on first use
        self._sample: Any = None  # model inputs of a few records (the latest evaluation's first minibatch)
        self._pipelines: dict[tuple[Any, ...], TaskPipeline] = {}  # by mode and the records' dtypes and shapes

    # ---- variables ---------------------------------------------------------------------------
    def _build(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        if self._built:
            return
        sample, _, _ = self._pairs(features[:1], None if labels is None else labels[:1], Mode.TRAINING)
        if self._tables:
            self._tables.load(sample, initial=True)
        outputs = self.model(sample, training=False)
        self._sample = tf.nest.map_structure(np.asarray, sample)  # what an export is proven on, until an evaluation
        for metric in self._metrics:  # one reading an output the model lacks: said now, not inside a trace
            metric.predictions(outputs, self._module.name)
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
        self._shapes = [tuple(v.shape) for v in self._ordered]
        self._sizes = [int(np.prod(shape)) for shape in self._shapes]
        # One buffer of gradients out of TensorFlow when the variables share one dtype (they may not).
        self._flat = len({v.dtype for v in self._ordered}) == 1
        self._step: Any = None  # traced on the first minibatch, for any minibatch size (see compiled)
        self._eval: Any = None
        self._assigners: dict[tuple[str, ...], Any] = {}  # one fused assign per set of names pulled
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

    # ---- embedding tables served by the PS ---------------------------------------------------
    def tables(self) -> list[TableSpec]:
        """The embedding tables the PS serves to this model (none without ``serve_tables``)."""
        return list(self._tables.specs.values())

    def serve_rows(self, source: RowSource, held: HeldRows) -> None:
        """Where the rows of a minibatch's ids come from (the PS client's ``pull_embeddings``), and
        every row the PS holds (``held_rows``, for an export)."""
        self._tables.serve(source, held)

    def row_gradients(self) -> dict[str, RowGrads]:
        """Each table's row gradients from the last gradient step, for the push that carries it."""
        return self._tables.gradients()

    def weights(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(v.numpy()) for name, v in self._variables.items()}

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Takes the pulled values: one traced call assigns them all (a pull brings the same
        names again and again: every variable, or the variables of the shards that moved)."""
        names = tuple(tensors)
        assigner = self._assigners.get(names)
        if assigner is None:
            for name in names:
                if name not in self._variables:
                    raise ModelError(f"the PS holds variable {name!r}, which this model does not have")
            if len(self._assigners) >= MAX_ASSIGNERS:  # many shards moving in many combinations
                for name, value in tensors.items():
                    self._variables[name].assign(value)
                return
            assigner = self._assigners[names] = fused_assign([self._variables[name] for name in names])
        assigner(tensors.values())

    def state(self) -> dict[str, np.ndarray]:
        """The model's non-trainable floating-point variables now (copies), by path (none: ``{}``)."""
        if not self._state:
            return {}
        return {name: np.asarray(v.numpy()) for name, v in self._state.items()}

    def assign_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            variable = self._state.get(name)
            if variable is None:
                raise ModelError(f"the PS holds state {name!r}, which this model does not have")
            variable.assign(value)

    def optimizer_config(self, learning_rate: float) -> OptimizerConfig:
        if self._optimizer_scheduled and self._schedule is not None:  # its base: the schedule's first rate
            return optimizer_config(self._local_optimizer, learning_rate or self.learning_rate_at(0), scheduled=True)
        return optimizer_config(self._local_optimizer, learning_rate if learning_rate > 0 else None)

    def learning_rate_at(self, version: int) -> float:
        """The module's learning-rate schedule at model ``version`` (0: it has none)."""
        if self._schedule is None:
            return 0.0
        try:
            return self._schedule.learning_rate(version)
        except ScheduleError as err:
            raise ModelError(f"{self._module.name}: {err}") from None

    # ---- data --------------------------------------------------------------------------------
    def _pairs(self, features: np.ndarray, labels: np.ndarray | None, mode: Mode) -> tuple[Any, Any, int]:
        """Every record through the module's data function, as one batch: ``(x, y, records)``."""
        element = self._prepared(features, labels, mode)
        if not (isinstance(element, tuple) and len(element) == 2):
            what = "dataset_fn(dataset, mode, metadata)" if self._module.feed is None else "feed(dataset, mode)"
            if labels is None and self._module.feed is None and self._module.dataset_fn is None:
                raise ModelError(
                    f"{self._module.name}: the records have no labels (serialized tf.train.Example?) "
                    f"and the module has no {what} to make (features, labels) pairs of them"
                )
            raise ModelError(f"{self._module.name}: {what} must give (features, labels) pairs in {mode} mode")
        x, y = element
        return one_input(self.model, x), y, int(tf.shape(tf.nest.flatten(y)[0])[0])

    def _prepared(self, features: np.ndarray, labels: np.ndarray | None, mode: Mode) -> Any:
        """The records through the data function as one element (:class:`TaskPipeline`)."""
        records = (features,) if labels is None else (features, labels)
        key = (mode, *((np.asarray(r).dtype, np.shape(r)[1:]) for r in records))
        pipeline = self._pipelines.get(key)
        if pipeline is None:
            pipeline = self._pipelines[key] = TaskPipeline(lambda dataset: self._module.prepare(dataset, mode, self._metadata))
        return pipeline(records)

    def batches(self, features: np.ndarray, labels: np.ndarray | None, mode: str) -> Iterator[tuple[Any, Any]]:
        """Minibatches of a task's records, shuffled for training.

        The module's data function runs once over the whole task (one batch of fixed-shape
        tensors); the records are then shuffled and cut into minibatches by two ops per tensor
        for the whole task, which costs far less per step than iterating a tf.data pipeline.
        """
        self._build(features, labels)
        x, y, count = self._pairs(features, labels, Mode(mode))
        sizes = minibatch_sizes(count, self._minibatch_size)
        if not sizes:
            return
        pair = (x, y)
        if mode == Mode.TRAINING:
            order = tf.constant(self._rng.permutation(count))
            pair = tf.nest.map_structure(lambda t: tf.gather(t, order), pair)
        parts = [tf.split(t, sizes) for t in tf.nest.flatten(pair)]
        for index in range(len(sizes)):
            yield tf.nest.pack_sequence_as(pair, [split[index] for split in parts])

    # ---- steps -------------------------------------------------------------------------------
    def _gradient_step(self, x: Any, y: Any) -> tuple[Any, list[Any], list[Any]]:
        """The loss, the dense variables' gradients and the served tables' row buffers' (dense:
        one row per distinct id, summed over its occurrences)."""
        buffers = self._tables.buffers
        with tf.GradientTape() as tape:
            predictions = self.model(x, training=True)
            loss = tf.reduce_mean(self._module.loss(y, predictions))
        gradients = tape.gradient(loss, self._ordered + buffers)
        dense = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, self._ordered)]
        rows = [_rows_gradient(g, b) for g, b in zip(gradients[len(self._ordered):], buffers)]
        return loss, dense, rows

    def _flat_gradient_step(self, x: Any, y: Any) -> tuple[Any, Any, list[Any]]:
        loss, gradients, rows = self._gradient_step(x, y)
        return loss, tf.concat([tf.reshape(g, [-1]) for g in gradients], axis=0), rows

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
        self._gradients(x, y, initial=True)  # compiles the step for any minibatch size (``compiled``)
        self.assign_state(state)

    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]:
        """The mean loss and every variable's gradient: the graph concatenates them into one
        vector, so one buffer comes out of TensorFlow, and each gradient is a view into it.
        Served tables: the rows are pulled first, their gradients kept (:meth:`row_gradients`)."""
        return self._gradients(x, y)

    def _gradients(self, x: Any, y: Any, initial: bool = False) -> tuple[float, dict[str, np.ndarray]]:
        if self._tables:
            self._tables.load(x, initial=initial)
        if self._step is None:
            self._step = compiled(self._flat_gradient_step if self._flat else self._gradient_step, (x, y))
        loss, gradients, rows = self._step(x, y)
        if self._tables:
            self._tables.take([r.numpy() for r in rows])
        if self._flat:
            return float(loss), dict(zip(self._names, split_flat(gradients.numpy(), self._shapes, self._sizes)))
        return float(loss), {name: g.numpy() for name, g in zip(self._names, gradients)}

    def apply_local(self, gradients: Mapping[str, np.ndarray], learning_rate: float = 0.0) -> None:
        """LocalSGD: applies own gradients to the local copy with the model's optimizer (at the job's
        rate when set; at ``learning_rate`` when > 0, the schedule's, unless the optimizer has a
        Keras schedule of its own, which then runs by its own steps)."""
        if learning_rate > 0 and not self._optimizer_scheduled:
            self._local_optimizer.learning_rate = learning_rate
        self._local_optimizer.apply_gradients(
            [(tf.convert_to_tensor(gradients[name]), v) for name, v in self._variables.items()]
        )

    def sgd_step(self, gradients: Mapping[str, np.ndarray], scale: float = 1.0) -> None:
        """SSP: a plain SGD step on the local copy between pulls, at the job's rate when set, times
        ``scale`` (the model optimizer's momentum would count again what the PS's momentum counts)."""
        rate = self.optimizer_config(0.0).params["learning_rate"] * scale
        for name, variable in self._variables.items():
            gradient = gradients[name]
            variable.assign_sub(tf.convert_to_tensor(gradient * np.asarray(rate, gradient.dtype)))

    def _eval_step(self, x: Any, y: Any) -> tuple[dict[str, Any], Any]:
        predictions = self.model(x, training=False)
        results = {"loss": tf.reduce_mean(self._module.loss(y, predictions))}
        for metric in self._metrics:
            if metric.function is not None:
                values = metric.function(y, metric.predictions(predictions, self._module.name))
                results[metric.name] = tf.reduce_mean(tf.cast(values, tf.float32))
        return results, predictions

    def evaluate(self, features: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
        """Sums of each metric x minibatch size over the records (the coordinator divides); each
        set metric (``eval_set_metrics_fn``) and Keras metric object (``eval_metrics.py``) once over
        all the records, x their count."""
        sums: dict[str, float] = {}
        seen: list[tuple[Any, Any]] = []
        total = 0
        objects = [m for m in self._metrics if m.metric is not None]
        for metric in objects:
            metric.metric.reset_state()
        for x, y in self.batches(features, labels, Mode.EVALUATION):
            count = int(tf.shape(tf.nest.flatten(y)[0])[0])
            if total == 0:
                self._sample = tf.nest.map_structure(np.asarray, x)
            if self._tables:
                self._tables.load(x, training=False)
            if self._eval is None:
                self._eval = compiled(self._eval_step, (x, y))
            results, predictions = self._eval(x, y)
            for name, value in results.items():
                sums[name] = sums.get(name, 0.0) + float(value) * count
            for metric in objects:
                metric.metric.update_state(y, metric.predictions(predictions, self._module.name))
            if self._set_metric_fns:
                seen.append((tf.nest.map_structure(np.asarray, y), tf.nest.map_structure(np.asarray, predictions)))
            total += count
        if seen:
            y_all = tf.nest.map_structure(lambda *parts: np.concatenate(parts), *[y for y, _ in seen])
            out_all = tf.nest.map_structure(lambda *parts: np.concatenate(parts), *[p for _, p in seen])
            for name, fn in self._set_metric_fns.items():
                value = float(fn(y_all, out_all))
                if not np.isfinite(value):
                    raise ModelError(f"{self._module.name}: eval_set_metrics_fn's {name!r} gave {value}")
                sums[name] = value * total
        for metric in objects:
            value = float(metric.metric.result())
            if not np.isfinite(value):
                raise ModelError(f"{self._module.name}: eval_metrics_fn's {metric.name!r} gave {value}")
            sums[metric.name] = value * total
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
        x = one_input(self.model, element[0] if isinstance(element, tuple) and len(element) == 2 else element)
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
            inputs = tf.nest.map_structure(lambda t: tf.gather(t, index), x)
            if self._tables:
                self._tables.load(inputs, training=False)
            parts.append(self._predict(inputs))
        joined = tf.nest.map_structure(lambda *ts: tf.concat(ts, axis=0), *parts)
        return tf.nest.map_structure(lambda t: np.asarray(t.numpy()), joined)

    def process_predictions(self, outputs: Any, worker_id: int) -> None:
        """ElasticDL's ``PredictionOutputsProcessor().process(predictions, worker_id)``, the outputs
        as tensors as ElasticDL's worker hands them; made on the first prediction task."""
        if self._module.prediction_processor is None:
            return
        if self._processor is None:
            self._processor = self._module.prediction_processor()
            if not callable(getattr(self._processor, "process", None)):
                raise ModelError(f"{self._module.name}: PredictionOutputsProcessor has no process(predictions, worker_id)")
        self._processor.process(tf.nest.map_structure(tf.convert_to_tensor, outputs), worker_id)

    def load_exported(self, folder: str) -> None:
        """Replaces the model by an exported one: ``<folder>/model.keras`` (a local folder or an
        object-store URI, read through ``elasticps.storage``), for a job that only predicts.
        Custom layers load when the model module registered them (it is imported already)."""
        import tempfile

        import keras

        from elasticps.storage import copy_to_file

        source = f"{folder.rstrip('/')}/{KERAS_FILE}"
        try:
            with tempfile.TemporaryDirectory(prefix="elasticps-model-") as scratch:
                local = Path(scratch) / KERAS_FILE
                copy_to_file(source, local)
                self.model = keras.models.load_model(local, compile=False)
        except OSError as err:
            raise ModelError(f"spec.prediction.model: cannot read {source}: {err}") from None
        except (ValueError, TypeError) as err:
            raise ModelError(f"spec.prediction.model: {source} is not a Keras model this module can load: {err}") from None
        self._predict = None
        self._tables = ServedTables(self.model, self._module.name)  # an exported model holds its tables

    # ---- export ------------------------------------------------------------------------------
    def export(self, directory: Path) -> None:
        """Writes the model as it is now: ``model.keras`` (Keras 3's file, ``keras.models.load_model``)
        and ``saved_model/`` (a TensorFlow SavedModel whose ``serve`` signature runs the model in
        inference mode: ``tf.saved_model.load``, TensorFlow Serving). Inputs are what ``feed``
        makes of a record; the files hold no optimizer (the PS kept it)."""
        model = self._tables.exported() if self._tables else self.model  # served tables: the PS's rows in it
        model.export(str(directory / SAVED_MODEL_DIR), format="tf_saved_model", verbose=False)
        path = directory / KERAS_FILE
        if self._sample is None:
            model.save(path)
            return
        # Proven (export_proof.py): model.keras loads in a fresh process and computes what this one does.
        # A subclassed model's functional twin first: it loads with Keras alone, the class cannot.
        expected = [np.asarray(o) for o in tf.nest.flatten(model(self._sample, training=False))]
        proof, why = self._export_twin(model, path, expected) if is_subclassed(model) else (None, "")
        if proof is None:
            model.save(path)
            proof = prove(path, self._sample, expected, self._module.name)
        if not proof.loaded:
            proof = replace(proof, reason=f"{proof.reason} {why}".strip())
            path.unlink()
            log.warning("%s: the export leaves model.keras out, it does not load in a fresh process (%s); "
                        "saved_model/ holds the model", self._module.name, proof.reason)
        elif proof.unproven:
            log.warning("%s: model.keras exported unproven: %s", self._module.name, proof.unproven)
        (directory / LOADING_FILE).write_text(json.dumps(proof.document(), indent=1) + "\n")

    def _export_twin(self, model: Any, path: Path, expected: list[np.ndarray]) -> tuple[Proof | None, str]:
        """Writes ``model``'s functional twin to ``path`` and proves it: its proof, or ``None`` and
        why where there is no twin or it does not load as the model computes."""
        twin, why = functional_twin(model, self._sample)
        if twin is None:
            return None, f"It has no functional twin: {why}."
        twin.save(path)
        try:
            proof = prove(path, self._sample, expected, self._module.name)
        except ExportProofError as err:
            return None, f"Its functional twin computes other outputs: {err}"
        if not proof.loaded:
            return None, f"Its functional twin does not load either: {proof.reason}"
        log.info("%s: model.keras holds the functional twin of %s (Keras cannot rebuild the class itself)",
                 self._module.name, type(model).__name__)
        return replace(proof, twin_of=type(model).__name__), ""
