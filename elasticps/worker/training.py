"""The worker's training loop: ask for a task, train or evaluate it, report, until the job is done.

Called by ``worker/main.py``. TensorFlow stays behind the :class:`Trainer` protocol. The modes
(seed 000):

* sync (default): before each minibatch pull the model if the PS has a newer one; push the
  gradients; a rejected push (the PS moved on) means pull and retrain the same minibatch;
* async (``use_async``): push every gradient, never retrain; a pull waits for this worker's own
  push, so a gradient's staleness counts only other workers' updates;
* SSP (``get_model_frequency`` k > 1): pull every k steps; in between apply own gradients to the local
  copy while also pushing them, each push travelling while the next minibatch is computed.

A PS shard that lost its model (restarted without a checkpoint) gets this worker's model pushed
again. A task that fails on this worker is reported as failed, so the coordinator hands it out again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from prometheus_client import CollectorRegistry

from elasticps.api.spec import TrainingSpec
from elasticps.coordinator.client import CoordinatorClient
from elasticps.data.readers import Reader
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.client import PSClient, Pushed, ShardsUninitialized
from elasticps.api.optimizer import OptimizerConfig
from elasticps.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

# Sync: after a gradient was accepted but the update waits for other workers' gradients, the next
# pull waits up to this long for the update instead of training a minibatch on a model the PS is
# about to replace (that gradient would be rejected and the minibatch trained again). Bounded, so
# a dead or slow peer costs at most this per step: the survivor then fills the update itself.
SYNC_WAIT_MS = 250


class Trainer(Protocol):
    def build(self, features: np.ndarray) -> None: ...
    def weights(self) -> dict[str, np.ndarray]: ...
    def assign(self, tensors: Mapping[str, np.ndarray]) -> None: ...
    def optimizer_config(self, learning_rate: float) -> OptimizerConfig: ...
    def batches(self, features: np.ndarray, labels: np.ndarray, mode: str) -> Iterator[tuple[Any, Any]]: ...
    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]: ...
    def apply_local(self, gradients: Mapping[str, np.ndarray]) -> None: ...
    def evaluate(self, features: np.ndarray, labels: np.ndarray) -> dict[str, float]: ...


@dataclass
class Counters:
    steps: int = 0
    pulls: int = 0
    rejected: int = 0
    reinitialised: int = 0


class Worker:
    def __init__(
        self,
        settings: TrainingSpec,
        trainer: Trainer,
        ps: PSClient,
        coordinator: CoordinatorClient,
        training_data: Reader,
        validation_data: Reader | None,
        heartbeat_s: float = 5.0,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._trainer = trainer
        self._ps = ps
        self._coordinator = coordinator
        self._training_data = training_data
        self._validation_data = validation_data
        self._heartbeat_s = heartbeat_s
        self._versions = [-1] * ps.num_shards
        self._in_flight: Future[Pushed] | None = None
        self._update_pending = False
        self._stop = threading.Event()
        self.counters = Counters()
        self._metrics = metrics or WorkerMetrics(CollectorRegistry(), ps.worker)

    # ---- the job -----------------------------------------------------------------------------
    def run(self) -> None:
        beat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        beat.start()
        try:
            self._trainer.build(self._training_data.read(0, 1)[0])
            self._pull(initialise=True)
            while True:
                task = self._coordinator.get_task()
                if task.type == pb.TASK_TYPE_FINISHED:
                    log.info("job finished: %s", self.counters)
                    return
                if task.type == pb.TASK_TYPE_WAIT:
                    time.sleep(0.2)
                    continue
                self._run_task(task)
        finally:
            self._stop.set()

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            try:
                self._coordinator.heartbeat()
            except Exception as err:  # a missed beat is not fatal: the next call retries
                log.debug("heartbeat failed: %s", err)

    def _run_task(self, task: pb.Task) -> None:
        result = pb.TaskResult(task_id=task.id, records=task.end - task.start)
        try:
            if task.type == pb.TASK_TYPE_EVALUATION:
                self._evaluate(task, result)
            else:
                self._train(task, result)
            result.success = True
        except Exception as err:
            result.success = False
            result.error = f"{type(err).__name__}: {err}"
            try:  # best effort: the task goes back to the queue now rather than after a timeout
                self._coordinator.report(result)
            except Exception as report_error:
                log.warning("could not report task %d as failed: %s", task.id, report_error)
            raise
        self._coordinator.report(result)

    # ---- training ----------------------------------------------------------------------------
    def _train(self, task: pb.Task, result: pb.TaskResult) -> None:
        features, labels = self._training_data.read(task.start, task.end)
        loss_sum = 0.0
        rejected_before = self.counters.rejected
        since_pull = 0
        for x, y in self._trainer.batches(features, labels, "training"):
            count = int(len(y))
            if self._settings.use_async:
                loss = self._async_step(x, y, since_pull)
                since_pull = 0 if since_pull + 1 >= self._settings.get_model_frequency else since_pull + 1
            else:
                loss = self._sync_step(x, y)
            loss_sum += loss * count
            self.counters.steps += 1
            self._metrics.steps.inc()
            self._metrics.records.inc(count)
        self._settle()
        result.loss_sum = loss_sum
        result.rejected = self.counters.rejected - rejected_before

    def _sync_step(self, x: Any, y: Any) -> float:
        while True:
            self._pull(wait_ms=SYNC_WAIT_MS if self._update_pending else 0)
            loss, gradients = self._gradients(x, y)
            pushed = self._push(gradients)
            if pushed.all_accepted:
                self._update_pending = pushed.versions == self._versions
                return loss
            self._update_pending = False
            self.counters.rejected += 1  # the PS moved on: pull and retrain this minibatch
            self._metrics.rejected.inc()

    def _async_step(self, x: Any, y: Any, since_pull: int) -> float:
        if since_pull == 0:
            # The pull must see this worker's own last gradient: pulling while it is in flight
            # would add a step of staleness to every gradient (measured: with momentum 0.9 that
            # made async MNIST diverge). Between pulls (SSP) the push overlaps the next minibatch.
            self._settle()
            self._pull()
        loss, gradients = self._gradients(x, y)
        versions = list(self._versions)
        self._settle()
        self._in_flight = self._ps.push_gradients_async(gradients, versions, self._settings.learning_rate)
        if since_pull + 1 < self._settings.get_model_frequency:
            self._trainer.apply_local(gradients)
        return loss

    def _gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]:
        with self._metrics.step_seconds.time():
            return self._trainer.gradients(x, y)

    def _push(self, gradients: dict[str, np.ndarray]) -> Pushed:
        try:
            with self._metrics.push_seconds.time():
                return self._ps.push_gradients(gradients, self._versions, self._settings.learning_rate)
        except ShardsUninitialized as err:
            self._reinitialise(err.shards)
            return Pushed([False] * self._ps.num_shards, list(self._versions))

    def _settle(self) -> None:
        """Waits for the push in flight (async); a lost model on a shard is pushed again."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        try:
            in_flight.result()
        except ShardsUninitialized as err:
            self._reinitialise(err.shards)

    # ---- the model ---------------------------------------------------------------------------
    def _pull(self, initialise: bool = False, wait_ms: int = 0) -> None:
        with self._metrics.pull_seconds.time():
            pulled = self._ps.pull(self._versions, wait_ms=wait_ms)
        self.counters.pulls += 1
        if pulled.uninitialized:
            if not initialise:
                self._reinitialise(pulled.uninitialized)
                return
            # The first worker to get here initialises the PS; the others adopt its model.
            self._ps.push_model(self._trainer.weights(), self._trainer.optimizer_config(self._settings.learning_rate))
            pulled = self._ps.pull([-1] * self._ps.num_shards)
        if pulled.tensors:
            self._trainer.assign(pulled.tensors)
        self._versions = pulled.versions
        self._metrics.model_version.set(pulled.versions[0])

    def _reinitialise(self, shards: list[int]) -> None:
        log.warning("PS shards %s lost their model: pushing ours again", shards)
        self.counters.reinitialised += 1
        self._ps.push_model(self._trainer.weights(), self._trainer.optimizer_config(self._settings.learning_rate))
        self._versions = [-1] * self._ps.num_shards
        self._pull()

    # ---- evaluation --------------------------------------------------------------------------
    def _evaluate(self, task: pb.Task, result: pb.TaskResult) -> None:
        if self._validation_data is None:
            raise RuntimeError("an evaluation task, but this worker has no validation data")
        self._settle()
        self._pull()
        features, labels = self._validation_data.read(task.start, task.end)
        for name, value in self._trainer.evaluate(features, labels).items():
            result.metric_sums[name] = value
