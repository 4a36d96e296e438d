"""What the worker needs from its collaborators, as structural protocols.

The training loop (``training.py``), the local model (``local_model.py``) and the steps
(``steps.py``) are written against these, never against the concrete classes: ``worker/main.py``
plugs in :class:`elasticps.psclient.client.PSClient`, :class:`elasticps.coordinator.client.CoordinatorClient`
and a framework backend's trainer (:class:`elasticps.backends.api.Trainer`, the protocol the loop
drives, lives with the backends); the unit tests plug in in-memory fakes.
Each protocol lists exactly the members the worker calls, no more, so a client may change its
insides (sharding, retries, transport) freely as long as these stay.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import Pulled, PushHandle, PushRequest


class PSClientLike(Protocol):
    """Every PS shard at once, whole models in and out (``PSClient``).

    A call on a shard that holds no model raises ``ShardsUninitialized`` (a pull reports such
    shards in ``Pulled.uninitialized`` instead).
    """

    @property
    def worker(self) -> str: ...

    @property
    def num_shards(self) -> int: ...

    def place(self, variables: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray] | None = None) -> object:
        """Places the model (its names, shapes, dtypes) on the shards, before any pull or push."""

    def pull(
        self,
        versions: Sequence[int],
        wait_ms: int = 0,
        only: Sequence[int] | None = None,
        incarnations: Sequence[int] | None = None,
    ) -> Pulled: ...

    def push(self, request: PushRequest) -> PushHandle:
        """Sends a push where the request says (the caller's thread, or in the background)."""

    def push_model(
        self,
        tensors: Mapping[str, np.ndarray],
        optimizer: OptimizerConfig,
        versions: Sequence[int] | None = None,
        incarnation: int = 0,
        state: Mapping[str, np.ndarray] | None = None,
    ) -> list[int]: ...


class CoordinatorLike(Protocol):
    """The coordinator as a worker sees it (``CoordinatorClient``): tasks, reports, heartbeats."""

    def get_task(self) -> pb.Task: ...

    def report(self, result: pb.TaskResult) -> None: ...

    def heartbeat(self) -> None: ...

    def leave(self) -> None: ...

    def join_round(
        self, version: int, wait_ms: int, local_steps: int = 0, loss: float = 0.0, learning_rate: float = 0.0,
        task_id: int = 0, task_records: int = 0,
    ) -> pb.JoinReply: ...

    def status(self, timeout_s: float = 5.0) -> pb.JobStatus: ...


class RoundsLike(Protocol):
    """The coordinator as a sync or LocalSGD step sees it: joining rounds (``CoordinatorClient.join_round``)."""

    def join_round(
        self, version: int, wait_ms: int, local_steps: int = 0, loss: float = 0.0, learning_rate: float = 0.0,
        task_id: int = 0, task_records: int = 0,
    ) -> pb.JoinReply: ...
