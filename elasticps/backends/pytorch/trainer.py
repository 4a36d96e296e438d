"""The PyTorch side of a worker: an ``nn.Module``, its gradients, local steps and evaluation.

Used by the training loop through the :class:`~elasticps.backends.api.Trainer` protocol, as the
Keras trainer is. Parameters are named by ``named_parameters()``; floating-point buffers (BatchNorm
running statistics) are the model's state, kept by the PS beside the parameters. On the CPU,
gradients leave torch as numpy views of the gradient tensors (no copy: each step allocates new
ones) and pulled values are written into the parameters' own memory; on a GPU they cross through
host copies. A whole task's records go through the module's ``feed`` once; the minibatches are
slices of its tensors.

With ``serve_tables``, the model's ``elasticps.backends.pytorch.layers.Embedding`` tables live on
the PS: each call of such a module pulls its ids' rows, and each gradient step leaves the rows'
gradients for the push (``served_tables.py``); an export holds the PS's rows.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elasticps.api.embedding import RowGrads, TableSpec
from elasticps.api.optimizer import OptimizerConfig
from elasticps.api.output import TORCH_PROGRAM_FILE, TORCH_STATE_FILE
from elasticps.backends.api import HeldRows, ModelError, RowSource, tables_served
from elasticps.backends.pytorch.model_loading import TorchModule
from elasticps.backends.pytorch.optimizer_spec import optimizer_config
from elasticps.backends.pytorch.served_tables import ServedTables
from elasticps.model_contract import Mode


def configure_threads(num_threads: int) -> None:
    """Sizes torch's intra-op pool to ``num_threads`` (and its inter-op pool, when it has not
    started yet)."""
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(num_threads)
    except RuntimeError:  # set once per process, before any inter-op work
        pass


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def device() -> torch.device:
    """CUDA when the process sees a GPU, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's numpy view (a host copy of a GPU one)."""
    return tensor.detach().cpu().numpy()


def _minibatch_sizes(count: int, minibatch_size: int) -> list[int]:
    full, rest = divmod(count, minibatch_size)
    return [minibatch_size] * full + ([rest] if rest else [])


class TorchTrainer:
    """One worker's PyTorch model. ``learning_rate`` > 0 replaces the model optimizer's own rate for
    local steps, as the PS replaces it for pushed gradients."""

    def __init__(self, module: TorchModule, params: Mapping[str, Any], minibatch_size: int, seed: int = 0,
                 learning_rate: float = 0.0, serve_tables: bool = False) -> None:  # fmt: skip
        self._module = module
        self._minibatch_size = minibatch_size
        self._rng = np.random.default_rng(seed)
        self._device = device()
        try:
            with tables_served() if serve_tables else contextlib.nullcontext():
                model = module.model(**params)
        except TypeError as err:
            raise ModelError(f"{module.name}.model(**{dict(params)}): {err}") from None
        if not isinstance(model, torch.nn.Module):
            raise ModelError(f"{module.name}.model() returned {type(model).__name__}, not a torch.nn.Module")
        self.model: torch.nn.Module = model.to(self._device)
        self._tables = ServedTables(self.model, module.name)
        self._local_optimizer = module.optimizer(self.model.parameters())
        if not isinstance(self._local_optimizer, torch.optim.Optimizer):
            raise ModelError(f"{module.name}.optimizer() returned {type(self._local_optimizer).__name__}, not a torch.optim.Optimizer")
        optimizer_config(self._local_optimizer)  # refuses (OptimizerError) what the PS cannot run, now
        if learning_rate > 0:
            for group in self._local_optimizer.param_groups:
                group["lr"] = learning_rate
        self._metric_fns = module.eval_metrics_fn() if module.eval_metrics_fn else {}
        self._set_metric_fns = module.eval_set_metrics_fn() if module.eval_set_metrics_fn else {}
        self._parameters = dict(self.model.named_parameters())
        self._state = {n: b for n, b in self.model.named_buffers() if b.is_floating_point()}
        both = set(self._parameters) & set(self._state)
        if both:
            raise ModelError(f"{module.name}: {sorted(both)[0]!r} names a parameter and a buffer")
        self._sample: Any = None  # one minibatch's inputs, for the export's trace
        self._program = False  # the model is an exported program (a job that only predicts)

    # ---- variables ---------------------------------------------------------------------------
    def build(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        """Runs the model once on the first record, so lazy modules make their parameters."""
        if self._sample is not None:
            return
        x, _ = self._pairs(features[:1], None if labels is None else labels[:1], Mode.TRAINING)
        self.model.eval()
        with torch.no_grad(), self._tables.initial():
            self.model(x)
        self._sample = x
        self._parameters = dict(self.model.named_parameters())
        self._state = {n: b for n, b in self.model.named_buffers() if b.is_floating_point()}

    def weights(self) -> dict[str, np.ndarray]:
        return {name: _numpy(p).copy() for name, p in self._parameters.items()}

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            parameter = self._parameters.get(name)
            if parameter is None:
                raise ModelError(f"the PS holds variable {name!r}, which this model does not have")
            _write(parameter, value)

    def state(self) -> dict[str, np.ndarray]:
        return {name: _numpy(b).copy() for name, b in self._state.items()}

    def assign_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            buffer = self._state.get(name)
            if buffer is None:
                raise ModelError(f"the PS holds state {name!r}, which this model does not have")
            _write(buffer, value)

    def optimizer_config(self, learning_rate: float) -> OptimizerConfig:
        return optimizer_config(self._local_optimizer, learning_rate if learning_rate > 0 else None)

    def learning_rate_at(self, version: int) -> float:
        return 0.0  # a torch module's rate is its optimizer's (or the job's): no schedule yet

    # ---- embedding tables served by the PS ---------------------------------------------------
    def tables(self) -> list[TableSpec]:
        """The embedding tables the PS serves to this model (none without ``serve_tables``)."""
        return list(self._tables.specs.values())

    def serve_rows(self, source: RowSource, held: HeldRows) -> None:
        """Where the rows of a call's ids come from (the PS client's ``pull_embeddings``), and
        every row the PS holds (``held_rows``, for an export)."""
        self._tables.serve(source, held)

    def row_gradients(self) -> dict[str, RowGrads]:
        """Each table's row gradients from the last gradient step, for the push that carries it."""
        return self._tables.gradients()

    # ---- data --------------------------------------------------------------------------------
    def _pairs(self, features: np.ndarray, labels: np.ndarray | None, mode: str) -> tuple[Any, Any]:
        if self._module.feed is not None:
            element = self._module.feed(features, labels, str(mode))
            if not (isinstance(element, tuple) and len(element) == 2):
                raise ModelError(f"{self._module.name}: feed(features, labels, mode) must give (inputs, labels) in {mode} mode")
            x, y = element
        else:
            if labels is None:
                raise ModelError(f"{self._module.name}: the records have no labels and the module has no feed() to make them")
            x = torch.as_tensor(np.asarray(features, dtype=np.float32))
            y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        return _to(x, self._device), _to(y, self._device)

    def batches(self, features: np.ndarray, labels: np.ndarray | None, mode: str) -> Iterator[tuple[Any, Any]]:
        """Minibatches of a task's records (shuffled for training): slices of one fed batch."""
        self.build(features, labels)
        x, y = self._pairs(features, labels, mode)
        count = _count(y)
        if mode == Mode.TRAINING:
            order = torch.as_tensor(self._rng.permutation(count), device=self._device)
            x, y = _index(x, order), _index(y, order)
        start = 0
        for size in _minibatch_sizes(count, self._minibatch_size):
            part = slice(start, start + size)
            yield _index(x, part), _index(y, part)
            start += size

    # ---- steps -------------------------------------------------------------------------------
    def warm_up(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        """Builds the model (torch runs eagerly: there is nothing to trace)."""
        self.build(features, labels)

    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]:
        self.model.train()
        for parameter in self._parameters.values():
            parameter.grad = None  # a new gradient tensor each step: the views handed out stay valid
        self._tables.clear()
        loss = torch.mean(self._module.loss(self.model(x), y))
        loss.backward()  # type: ignore[no-untyped-call]
        if self._tables:
            self._tables.take()
        gradients = {
            name: _numpy(p.grad) if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            for name, p in self._parameters.items()
        }
        return float(loss.detach()), gradients

    def apply_local(self, gradients: Mapping[str, np.ndarray], learning_rate: float = 0.0) -> None:
        """LocalSGD's local step: the module's own optimizer (its momentum kept across periods)."""
        if learning_rate > 0:
            for group in self._local_optimizer.param_groups:
                group["lr"] = learning_rate
        for name, parameter in self._parameters.items():
            parameter.grad = torch.as_tensor(np.array(gradients[name]), device=self._device)
        self._local_optimizer.step()

    def sgd_step(self, gradients: Mapping[str, np.ndarray], scale: float = 1.0) -> None:
        """SSP's local step: plain SGD at the job's rate times ``scale`` (the PS applies the
        optimizer itself)."""
        rate = self.optimizer_config(0.0).params["learning_rate"] * scale
        with torch.no_grad():
            for name, parameter in self._parameters.items():
                parameter.sub_(torch.as_tensor(np.array(gradients[name]), device=self._device), alpha=rate)

    def evaluate(self, features: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
        """Sums of each metric x minibatch size over the records (the coordinator divides); each
        set metric (``eval_set_metrics_fn``) once over all the records, x their count."""
        sums: dict[str, float] = {}
        seen: list[tuple[np.ndarray, np.ndarray]] = []
        total = 0
        self.model.eval()
        with torch.no_grad():
            for x, y in self.batches(features, labels, Mode.EVALUATION):
                count = _count(y)
                outputs = self.model(x)
                results = {"loss": torch.mean(self._module.loss(outputs, y))}
                for name, fn in self._metric_fns.items():
                    results[name] = torch.mean(torch.as_tensor(fn(outputs, y), dtype=torch.float32))
                for name, value in results.items():
                    sums[name] = sums.get(name, 0.0) + float(value) * count
                if self._set_metric_fns:
                    seen.append((_numpy(outputs), _numpy(y)))
                total += count
        if seen:
            outputs_all, labels_all = np.concatenate([o for o, _ in seen]), np.concatenate([y for _, y in seen])
            for name, set_fn in self._set_metric_fns.items():
                measured = float(set_fn(outputs_all, labels_all))
                if not np.isfinite(measured):
                    raise ModelError(f"{self._module.name}: eval_set_metrics_fn's {name!r} gave {measured}")
                sums[name] = measured * total
        return sums

    def predict(self, features: np.ndarray, labels: np.ndarray | None) -> Any:
        """The model's outputs for every record, in order, in inference mode (numpy)."""
        if self._module.feed is not None:
            element = self._module.feed(features, labels, str(Mode.PREDICTION))
            x = element[0] if isinstance(element, tuple) and len(element) == 2 else element
        else:
            x = torch.as_tensor(np.asarray(features, dtype=np.float32))
        x = _to(x, self._device)
        if _count(x) != len(features):
            raise ModelError(f"{self._module.name}: feed gave {_count(x)} inputs for {len(features)} records in prediction mode")
        if not self._program:  # an exported program runs as exported (inference), and refuses eval()
            self.model.eval()
        parts = []
        with torch.no_grad():
            for start in range(0, len(features), self._minibatch_size):
                parts.append(_numpy(self.model(_index(x, slice(start, start + self._minibatch_size)))))
        return np.concatenate(parts) if parts else np.zeros((0,), np.float32)

    def process_predictions(self, outputs: Any, worker_id: int) -> None:
        """A torch module has no prediction processor: its outputs are the task's file only."""

    def load_exported(self, folder: str) -> None:
        """Replaces the model by an exported program (``<folder>/model.pt2``), for a job that only predicts."""
        import tempfile

        from elasticps.storage import copy_to_file

        source = f"{folder.rstrip('/')}/{TORCH_PROGRAM_FILE}"
        try:
            with tempfile.TemporaryDirectory(prefix="elasticps-model-") as scratch:
                local = Path(scratch) / TORCH_PROGRAM_FILE
                copy_to_file(source, local)
                self.model = torch.export.load(str(local)).module().to(self._device)
                self._program = True
        except OSError as err:
            raise ModelError(f"spec.prediction.model: cannot read {source}: {err}") from None
        except (RuntimeError, ValueError) as err:
            raise ModelError(f"spec.prediction.model: {source} is not a torch program: {err}") from None

    # ---- export ------------------------------------------------------------------------------
    def export(self, directory: Path) -> None:
        """Writes ``model.safetensors`` (the state_dict: parameters and buffers) and ``model.pt2``
        (a ``torch.export`` program with a free minibatch dimension: ``torch.export.load(...).module()``
        runs it without the model module's source). Served tables: the rows the PS holds, in both."""
        with self._tables.holding(self._device) if self._tables else contextlib.nullcontext():
            self._export(directory)

    def _export(self, directory: Path) -> None:
        from safetensors.torch import save_file

        state = {name: t.detach().cpu().contiguous() for name, t in self.model.state_dict().items()}
        save_file(state, str(directory / TORCH_STATE_FILE))
        if self._sample is None:
            raise ModelError(f"{self._module.name}: the model was never run, so it cannot be exported")
        self.model.eval()
        # Two records: torch takes a dimension of size 1 for a constant, which would fix the batch.
        sample = _index(self._sample, torch.zeros(2, dtype=torch.long, device=self._device))
        try:
            batch = torch.export.Dim("batch")
            program = torch.export.export(self.model, (sample,), dynamic_shapes=(_dynamic(sample, batch),))
        except Exception:  # noqa: BLE001 - a model whose shapes torch cannot leave free: one record's shape
            program = torch.export.export(self.model, (sample,))
        torch.export.save(program, str(directory / TORCH_PROGRAM_FILE))


def _dynamic(sample: Any, batch: Any) -> Any:
    if isinstance(sample, torch.Tensor):
        return {0: batch}
    if isinstance(sample, dict):
        return {k: _dynamic(v, batch) for k, v in sample.items()}
    if isinstance(sample, (list, tuple)):
        return type(sample)(_dynamic(v, batch) for v in sample)
    return None


def _write(target: torch.Tensor, value: np.ndarray) -> None:
    """``value`` into ``target``'s memory (numpy's copy on the CPU, no torch tensor made)."""
    if tuple(np.shape(value)) != tuple(target.shape):
        raise ModelError(f"a value of shape {np.shape(value)} for a tensor of shape {tuple(target.shape)}")
    with torch.no_grad():
        if target.device.type == "cpu":
            target.numpy()[...] = value
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a read-only pulled array: copied right away
                target.copy_(torch.as_tensor(value), non_blocking=True)


def _to(value: Any, where: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(where)
    if isinstance(value, np.ndarray):
        return torch.as_tensor(value).to(where)
    if isinstance(value, dict):
        return {k: _to(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, where) for v in value)
    return value


def _index(value: Any, index: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value[index]
    if isinstance(value, dict):
        return {k: _index(v, index) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_index(v, index) for v in value)
    return value


def _count(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.shape[0])
    if isinstance(value, dict):
        return _count(next(iter(value.values())))
    if isinstance(value, (list, tuple)):
        return _count(value[0])
    raise ModelError(f"cannot count the records of a {type(value).__name__}")
