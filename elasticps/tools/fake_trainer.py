"""A worker's model in numpy: the ``Trainer`` the scale tests and the soak plug into the real worker.

The real training loop (``worker/training.py``), its steps and its PS and coordinator clients run
unchanged; only TensorFlow is replaced, so a process holds dozens of workers as threads and the PS
sees the calls a real job makes. The model is small (a few KB) and its gradients are deterministic
(a function of the minibatch's records), so a run is about protocol and concurrency, not arithmetic.

Each shard holds (placed by size, ``psclient/sharding.py``: one tensor of each role per shard, as the
placement of this model, which :func:`layout` reads, puts them; nothing is big enough to be split):

* a matrix and a vector, whose gradients are small and finite;
* a **counter**, a scalar whose gradient is always ``-1``: with SGD at learning rate 1 the PS adds 1
  for each gradient it applies (async) or each round it commits (sync, the members' mean is -1), so
  the counter says, exactly, how many updates the shard took;
* a state tensor (as BatchNorm's statistics), sent with every push and left as it is.

:func:`counters` names the counter of each shard; :func:`layout` names every tensor of a shard by role.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elasticps.api.optimizer import OptimizerConfig
from elasticps.api.embedding import RowGrads
from elasticps.psclient.sharding import TensorInfo, place

FEATURES = 4  # columns of the records :func:`records` writes
MATRIX_SHAPE = (16, 8)
VECTOR_SHAPE = (8,)
STATE_SHAPE = (8,)
GRADIENT_SCALE = 1e-4  # the matrix and vector gradients stay this small: the model never drifts far


@dataclass(frozen=True)
class ShardLayout:
    """The names of one shard's tensors, by role."""

    matrix: str
    vector: str
    counter: str
    state: str


def _names(num_shards: int) -> dict[str, list[str]]:
    """Each role's tensors, ``num_shards`` of each (named by their index, not by their shard)."""
    return {role: [f"fake/{prefix}_{k}" for k in range(num_shards)] for role, prefix in _ROLES.items()}


_ROLES = {"matrix": "kernel", "vector": "bias", "counter": "count", "state": "norm"}
_SHAPES = {"matrix": MATRIX_SHAPE, "vector": VECTOR_SHAPE, "counter": (), "state": STATE_SHAPE}


@functools.cache
def _layouts(num_shards: int) -> tuple[ShardLayout, ...]:
    """Every shard's tensors by role, as the placement puts the model (the rule every client uses)."""
    f32 = np.dtype(np.float32)
    infos = [
        TensorInfo(name, _SHAPES[role], f32, state=role == "state")
        for role, names in _names(num_shards).items()
        for name in names
    ]
    placement = place(infos, num_shards)
    found: list[dict[str, str]] = [{} for _ in range(num_shards)]
    for role, names in _names(num_shards).items():
        for name in names:
            (shard,) = placement.shards_of(name)
            if role in found[shard]:
                raise AssertionError(f"the placement puts two {role} tensors on shard {shard}")
            found[shard][role] = name
    return tuple(ShardLayout(**roles) for roles in found)


def layout(shard: int, num_shards: int) -> ShardLayout:
    return _layouts(num_shards)[shard]


def counters(num_shards: int) -> list[str]:
    """Each shard's counter, in shard order."""
    return [layout(shard, num_shards).counter for shard in range(num_shards)]


def initial_model(num_shards: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The variables and the state tensors every worker starts from (the same in every process)."""
    weights: dict[str, np.ndarray] = {}
    state: dict[str, np.ndarray] = {}
    for shard in range(num_shards):
        names = layout(shard, num_shards)
        weights[names.matrix] = np.linspace(-0.5, 0.5, int(np.prod(MATRIX_SHAPE)), dtype=np.float32).reshape(MATRIX_SHAPE)
        weights[names.vector] = np.full(VECTOR_SHAPE, 0.1, np.float32)
        weights[names.counter] = np.zeros((), np.float32)
        state[names.state] = np.ones(STATE_SHAPE, np.float32)
    return weights, state


def records(count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` records for an npz file (``x``: features in [0, 1), ``y``: labels), a fixed function of the index."""
    index = np.arange(count, dtype=np.float64)
    x = (np.outer(index, np.arange(1, FEATURES + 1)) * 0.618034 % 1.0).astype(np.float32)
    return x, (index % 2).astype(np.int64)


class NumpyTrainer:
    """``backends.api.Trainer`` without TensorFlow (see the module's docstring)."""

    def __init__(self, num_shards: int, minibatch_size: int) -> None:
        self._minibatch_size = minibatch_size
        self._weights, self._state = initial_model(num_shards)
        self._counters = set(counters(num_shards))

    def build(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        pass  # the model's shapes do not depend on the data

    def weights(self) -> dict[str, np.ndarray]:
        return {name: value.copy() for name, value in self._weights.items()}

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            self._weights[name] = np.array(value, dtype=np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {name: value.copy() for name, value in self._state.items()}

    def assign_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            self._state[name] = np.array(value, dtype=np.float32)

    def optimizer_config(self, learning_rate: float) -> OptimizerConfig:
        return OptimizerConfig("sgd", {"learning_rate": learning_rate})

    def batches(self, features: np.ndarray, labels: np.ndarray | None, mode: str) -> Iterator[tuple[Any, Any]]:
        for start in range(0, len(features), self._minibatch_size):
            end = start + self._minibatch_size
            yield features[start:end], None if labels is None else labels[start:end]

    def warm_up(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        pass  # nothing to compile

    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]:
        signal = float(np.mean(x)) if len(x) else 0.0  # in [0, 1): the minibatch's records decide it
        gradients: dict[str, np.ndarray] = {}
        for name, value in self._weights.items():
            if name in self._counters:
                gradients[name] = np.full(value.shape, -1.0, np.float32)
            else:
                gradients[name] = np.full(value.shape, GRADIENT_SCALE * (signal - 0.5), np.float32)
        return signal, gradients

    def row_gradients(self) -> dict[str, RowGrads]:
        return {}  # no embedding tables

    def learning_rate_at(self, version: int) -> float:
        return 0.0  # no schedule

    def apply_local(self, gradients: Mapping[str, np.ndarray], learning_rate: float = 0.0) -> None:
        for name, value in gradients.items():
            self._weights[name] = self._weights[name] - value

    def sgd_step(self, gradients: Mapping[str, np.ndarray], scale: float = 1.0) -> None:
        for name, value in gradients.items():  # the counters count minibatches, whatever the scale
            self._weights[name] = self._weights[name] - (value if name in self._counters else scale * value)

    def evaluate(self, features: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
        return {"mean_feature": float(np.mean(features)) * len(features)}

    def predict(self, features: np.ndarray, labels: np.ndarray | None) -> Any:
        return np.zeros((len(features), 1), np.float32)

    def export(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "weights.json").write_text(json.dumps({n: v.tolist() for n, v in self._weights.items()}))
