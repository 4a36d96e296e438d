"""What a framework backend gives the worker, prediction and ``elasticps export``. Pure.

A backend (``backends/<framework>/``) turns a model module of its framework into a
:class:`BackendTrainer`: numpy arrays named by variable in and out, so the training loop, the PS
client and the PS never see the framework. The worker's loop asks only for :class:`Trainer`
(``worker/training.py`` and the steps); ``worker/main.py`` also wires the embedding tables a
model serves from the PS and loads an exported model, the wider :class:`BackendTrainer`.
``elasticps export`` asks for an :class:`ExportModel`: the job's model built once, its variables
named and shaped, so the PS's checkpointed tensors can be put back into it and written out.

Registered by framework in ``backends/registry.py``; nothing here imports a framework.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from elasticps.api.embedding import IdArray, RowGrads, TableSpec
from elasticps.api.optimizer import OptimizerConfig
from elasticps.model_contract import Metadata

class RowSource(Protocol):
    """The rows of distinct ids, per table, in the order asked (the PS client's pull); ``training``
    false (evaluation, prediction): no row is made for them."""

    def __call__(self, ids: Mapping[str, IdArray], training: bool = True) -> Mapping[str, np.ndarray]: ...

# Every row held of the named tables: per table its ids (sorted) and their rows (for an export).
HeldRows = Callable[[list[str]], Mapping[str, tuple[IdArray, np.ndarray]]]


_TABLES_SERVED = contextvars.ContextVar("elasticps_tables_served", default=False)


@contextlib.contextmanager
def tables_served() -> Iterator[None]:
    """Embedding layers (of either framework) made inside take their rows from the worker (the
    parameter servers), not a local table: the worker makes its model so."""
    token = _TABLES_SERVED.set(True)
    try:
        yield
    finally:
        _TABLES_SERVED.reset(token)


def tables_are_served() -> bool:
    """Inside :func:`tables_served`."""
    return _TABLES_SERVED.get()


class ModelError(ValueError):
    """A model module that cannot be loaded, or breaks its framework's contract: one line, a user's
    mistake that restarting cannot mend."""


class Trainer(Protocol):
    """The model on this worker, as the training loop sees it: the framework stays behind this.

    Tensors are numpy arrays named by variable; ``x``/``y`` are whatever ``batches`` yields.
    ``state``/``assign_state``: the model's non-trainable floating-point variables (BatchNorm
    statistics), which the PS keeps beside the trainable ones (``weights``/``assign``).
    Labels are ``None`` for records that carry their own (serialized examples): the model
    module's data function takes them out.
    """

    def build(self, features: np.ndarray, labels: np.ndarray | None) -> None: ...
    def weights(self) -> dict[str, np.ndarray]: ...
    def assign(self, tensors: Mapping[str, np.ndarray]) -> None: ...
    def state(self) -> dict[str, np.ndarray]: ...
    def assign_state(self, tensors: Mapping[str, np.ndarray]) -> None: ...
    def optimizer_config(self, learning_rate: float) -> OptimizerConfig: ...
    def learning_rate_at(self, version: int) -> float:
        """The model module's learning-rate schedule at model ``version``; 0 when it has none."""
    def batches(self, features: np.ndarray, labels: np.ndarray | None, mode: str) -> Iterator[tuple[Any, Any]]: ...
    def warm_up(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        """Prepares the gradient step (TensorFlow: traces it) on one minibatch of these records,
        changing neither the weights nor the state."""
    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]: ...
    def apply_local(self, gradients: Mapping[str, np.ndarray], learning_rate: float = 0.0) -> None:
        """LocalSGD's local step: the model's own optimizer (its momentum kept across periods), at
        ``learning_rate`` when > 0 (the schedule's)."""
    def sgd_step(self, gradients: Mapping[str, np.ndarray], scale: float = 1.0) -> None:
        """SSP's local step: each weight less its gradient times the learning rate (the job's,
        else the model optimizer's) times ``scale``, plain SGD: the PS applies the optimizer itself."""
    def row_gradients(self) -> Mapping[str, RowGrads]:
        """Each served embedding table's row gradients from the last :meth:`gradients` (none: ``{}``)."""
    def evaluate(self, features: np.ndarray, labels: np.ndarray | None) -> dict[str, float]: ...
    def predict(self, features: np.ndarray, labels: np.ndarray | None) -> Any:
        """The model's outputs for the records in inference mode, one row per record (numpy)."""
    def export(self, directory: Path) -> None:
        """Writes the model as it is now into ``directory`` in its framework's formats."""


class BackendTrainer(Trainer, Protocol):
    """A backend's trainer as ``worker/main.py`` wires it: the loop's :class:`Trainer`, plus the
    embedding tables it serves from the PS and an exported model to predict with."""

    def tables(self) -> list[TableSpec]:
        """The embedding tables the PS serves to this model (none unless asked to serve them)."""
    def serve_rows(self, source: RowSource, held: HeldRows) -> None: ...
    def load_exported(self, folder: str) -> None:
        """Replaces the model by the one exported into ``folder`` (a job that only predicts)."""
    def process_predictions(self, outputs: Any, worker_id: int) -> None:
        """Hands one prediction task's outputs to the model module's processor, if it has one
        (ElasticDL's ``PredictionOutputsProcessor``), after the task's file is written."""


@dataclass(frozen=True)
class TrainerOptions:
    """How a worker builds its trainer. ``learning_rate`` (> 0): the job's rate replaces the model
    optimizer's own for local steps, as the PS replaces it for pushed gradients. ``seed``: this
    worker's random stream (shuffles). ``model_seed`` (> 0): the framework's random state is seeded
    with it before the model is built, so every run starts from the same weights. ``metadata``: what an ElasticDL ``dataset_fn`` gets beside
    the records. ``serve_tables``: the model's embedding tables live on the PS."""

    minibatch_size: int
    seed: int = 0
    model_seed: int = 0
    learning_rate: float = 0.0
    metadata: Metadata = field(default_factory=Metadata)
    serve_tables: bool = False


@dataclass(frozen=True)
class Variable:
    """A model variable as an export matches checkpointed tensors to it."""

    shape: tuple[int, ...]
    trainable: bool


class ExportModel(Protocol):
    """The job's model built for ``elasticps export``: its variables by name, values put back
    into them, and the same files a finished job writes."""

    def variables(self) -> dict[str, Variable]: ...
    def assign(self, name: str, value: np.ndarray) -> None: ...
    def export(self, directory: Path) -> None: ...


def blame_model_code(err: BaseException, model_file: str | None) -> ModelError | None:
    """``err`` as a user's mistake, naming the line of the model module it came from, when that
    file is on its traceback (the innermost such frame); None when the error is not the module's
    (a bug of ours, a lost connection): that one keeps its traceback and the replica's policy."""
    if not model_file:
        return None
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == model_file]
    if isinstance(err, SyntaxError) and err.filename == model_file:
        return ModelError(f"{model_file}:{err.lineno}: SyntaxError: {err.msg}")
    if frames:
        frame = frames[-1]
        return ModelError(f"{model_file}:{frame.lineno} (in {frame.name}): {type(err).__name__}: {err}")
    # Code a framework traced and rewrote (TensorFlow's autograph) runs from generated files; the
    # framework names the user's frames in the message instead ('in user code: File "...", line N,
    # in loss'). Only that form: a runtime error's message may name where an op was defined in the
    # module (an out-of-memory one too) without the module's code having raised anything.
    text = str(err)
    said = re.findall(r'File "' + re.escape(model_file) + r'", line (\d+), in (\S+)', text)
    if not said or "in user code:" not in text:
        return None
    lineno, function = said[-1]
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return ModelError(f"{model_file}:{lineno} (in {function}): {lines[-1]}")


class Backend(Protocol):
    """One framework: its model modules, trainers and exports. ``load_model`` checks the
    module keeps the framework's contract and raises :class:`ModelError` naming what is wrong;
    the model it returns is opaque to the caller, handed back to ``trainer`` and ``export_model``."""

    def configure_threads(self, num_threads: int) -> None: ...
    def load_model(self, model_def: str) -> Any: ...
    def model_file(self, model: Any) -> str | None:
        """The model module's source file (:func:`blame_model_code` looks for it), None if unknown."""
    def trainer(self, model: Any, params: Mapping[str, Any], options: TrainerOptions) -> BackendTrainer: ...
    def export_model(
        self, model: Any, params: Mapping[str, Any], minibatch_size: int, features: np.ndarray, labels: np.ndarray | None
    ) -> ExportModel: ...
