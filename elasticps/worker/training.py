"""The worker's training loop: ask for a task, train or evaluate it, report, until the job is done.

Called by ``worker/main.py``. The loop knows nothing of training modes: it asks ``steps.step_for``
once for the step of the job's :class:`TrainingMode` and hands it each minibatch; the model traffic
with the PS (pulls, pushes, repairs of shards that lost their model) lives in ``local_model.py``.
TensorFlow stays behind the ``Trainer`` protocol (``ports.py``), and the PS and coordinator clients
are taken structurally, so the loop runs in the unit tests against in-memory fakes.

A task that fails on this worker is reported as failed (so the coordinator hands it out again
now rather than after a timeout), then the error is raised: the process exits and is restarted per
the job's restart policy. A worker asked to stop (SIGTERM: a pod deleted, a job scaled down, the
local runner stopping) raises :class:`Stopped` in the middle of whatever it does; its task is
reported failed the same way, so no record waits for a timeout.

An export task (a job with ``spec.output``): the worker pulls until every shard holds one version
(the final export: exactly the task's version, else it fails), has the trainer write the model
and the exporter (``exporting.py``) put it, with ``job.json`` and ``metrics.json``, in the output.
A worker killed while exporting leaves the task to the coordinator's timeout, and another worker
writes it again from the start.

A prediction task (``spec.prediction``): after training, the worker pulls the task's version as for
the final export (once: the model no longer moves, later pulls bring nothing), has the trainer
run it over the task's records and the writer (``predicting.py``) put one JSON line per record in
the task's file. A job that predicts with an exported model (:attr:`Prediction.standalone`) never
talks to the PS: the trainer loaded that model (``worker/main.py``) and the loop only predicts.
writes it again from the start. An export the output refuses (writing the files raises: a missing
bucket, a path under a file, no credentials) is no reason to exit: the worker reports it failed
with ``export_failed`` and the error, and asks for its next task; the coordinator hands it out a
bounded number of times, then fails the job with that error (``coordinator/tasks/export.py``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from elasticps.api.modes import TrainingMode
from elasticps.api.spec import TrainingSpec
from elasticps.data.readers import Reader
from elasticps.model_contract import Mode
from elasticps.proto import elasticps_pb2 as pb
from elasticps.worker.cpu import cpu_seconds
from elasticps.worker.exporting import Exporter, ExportError, metrics_document
from elasticps.worker.metrics import WorkerMetrics
from elasticps.backends.api import Trainer
from elasticps.worker.ports import CoordinatorLike, PSClientLike
from elasticps.worker.local_model import Counters, LocalModel, NonFiniteLoss
from elasticps.worker.pacing import Pace
from elasticps.worker.peer_model import HopStep, PeerModel
from elasticps.worker.predicting import PredictionWriter
from elasticps.worker.steps import Step, TaskVoid, step_for


@dataclass(frozen=True)
class Prediction:
    """What a worker of a predicting job needs: the prediction data, where its files go, and
    whether the model came from an export (no training, no PS) rather than from the PS."""

    data: Reader
    writer: PredictionWriter
    standalone: bool = False
    processor: Callable[[Any], None] | None = None  # the model module's, given each task's outputs once written


class Stopped(Exception):
    """The worker was asked to stop (SIGTERM); raised from the signal handler ``worker/main.py``
    installs, wherever the loop is."""


class ExportNotWritten(Exception):
    """Writing an export's files failed: reported, not raised out of the loop (the process is fine)."""

log = logging.getLogger(__name__)


def records_in(batch: Any) -> int:
    """The records in a minibatch's labels (or features): the leading dimension of its first
    array, so a dict or tuple of arrays (a model's named inputs or outputs) counts its rows."""
    while isinstance(batch, Mapping | tuple | list):
        batch = next(iter(batch.values())) if isinstance(batch, Mapping) else batch[0]
    return int(len(batch))

WAIT_S = 0.2  # pause after a WAIT task (nothing to hand out yet) before asking again
EXPORT_WAIT_MS = 500  # an export's pulls wait this long for a shard behind the others
EXPORT_ATTEMPTS = 20  # ... this many times


class Worker:
    def __init__(
        self,
        settings: TrainingSpec,
        mode: TrainingMode,
        trainer: Trainer,
        ps: PSClientLike | None,
        coordinator: CoordinatorLike,
        training_data: Reader | None,
        validation_data: Reader | None,
        heartbeat_s: float = 5.0,
        metrics: WorkerMetrics | None = None,
        exporter: Exporter | None = None,
        prediction: Prediction | None = None,
        pace: Pace | None = None,
        peer: tuple[PeerModel, HopStep] | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        """``peer``: a decentralized job's model and step (``peer_model.py``), which stand in for
        the PS's (``ps`` is then not used). ``stopping``: set by the SIGTERM handler
        (``worker/main.py``); checked between minibatches and tasks (:meth:`_stop_if_asked`)."""
        if training_data is None and (prediction is None or not prediction.standalone):
            raise ValueError("a worker without training data only predicts, with an exported model")
        self._trainer = trainer
        self._coordinator = coordinator
        self._training_data = training_data
        self._validation_data = validation_data
        self._heartbeat_s = heartbeat_s
        self._exporter = exporter
        self._prediction = prediction
        self._stop = threading.Event()
        self._stopping = stopping or threading.Event()
        self.counters = Counters()
        self.first_task_cpu_s: float | None = None  # this process's CPU when its first training task began
        self._metrics = metrics or WorkerMetrics(CollectorRegistry(), ps.worker if ps is not None else "worker")
        self._minibatch_size = settings.minibatch_size
        self._model: LocalModel | PeerModel
        self._step: Step
        self._hop: HopStep | None = None
        if peer is None:
            if ps is None:
                raise ValueError("a worker of the PS strategy needs its PS client")
            self._model = LocalModel(trainer, ps, settings.learning_rate, self.counters, self._metrics, pace)
            self._step = step_for(mode, self._model, coordinator)
        else:
            self._model, self._hop = peer
            self.counters = self._model.counters  # its steps count their sleeps there
            self._step = self._hop
        # Sync (and LocalSGD) shards meet at every round, so the final model is one version on every shard; async
        # shards count their own pushes and may stay apart (the coordinator names such a model by
        # the oldest shard's version, which a non-strict settled pull returns too). A decentralized
        # job's models are the workers' own: none is the job's version.
        self._sync = mode.rounds and peer is None

    # ---- the job -----------------------------------------------------------------------------
    def run(self) -> None:
        beat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        beat.start()
        try:
            if self._training_data is not None:
                self._trainer.build(*self._training_data.read(0, 1))
                # The step's first run (TensorFlow tracing it, for every minibatch size at once)
                # takes seconds: done before the first pull, so that no gradient is staler for it
                # than any other (docs/architecture.md).
                size = min(self._minibatch_size, self._training_data.num_records)
                self._trainer.warm_up(*self._training_data.read(0, size))
                self._model.initialise()
            while True:
                self._stop_if_asked()
                task = self._coordinator.get_task()
                if task.type == pb.TASK_TYPE_FINISHED:
                    log.info("job finished: %s", self.counters)
                    return
                if task.type == pb.TASK_TYPE_WAIT:
                    if self._hop is not None:
                        self._hop.idle()  # the neighbours may be waiting for this worker's models
                    else:
                        time.sleep(WAIT_S)
                    continue
                self._run_task(task)
        finally:
            self._stop.set()
            if self._hop is not None:
                self._hop.leave()  # its neighbours stop waiting for its models and tokens
            try:  # best effort: sync rounds stop waiting for this worker now, not after its timeout
                self._coordinator.leave()
            except Exception as err:
                log.debug("could not say goodbye to the coordinator: %s", err)

    def _stop_if_asked(self) -> None:
        """Raises :class:`Stopped` once a stop was asked for. The signal handler raises it too,
        wherever the main thread is, but Python prints and drops an exception raised inside a
        finaliser (a ``__del__``, a weakref callback: TensorFlow runs many), and the handler runs
        once: training would go on until the stop watchdog ends the process, the task not handed
        back. Checked here, between minibatches and tasks, the stop is not lost."""
        if self._stopping.is_set():
            raise Stopped("stopped by signal SIGTERM")

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
            elif task.type == pb.TASK_TYPE_EXPORT:
                self._export(task, result)
            elif task.type == pb.TASK_TYPE_PREDICTION:
                self._predict(task, result)
            else:
                self._train(task, result)
            result.success = True
        except TaskVoid as void:
            log.info("%s: left, not reported", void)  # the queue hands out what it did not apply
            return
        except ExportNotWritten as failed:
            cause = failed.__cause__ or failed
            log.error("could not write export task %d: %s", task.id, cause)
            result.success = False
            result.export_failed = True
            result.error = f"{type(cause).__name__}: {cause}"
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
        if self._training_data is None:
            raise RuntimeError("a training task, but this worker has no training data")
        if self.first_task_cpu_s is None:
            self.first_task_cpu_s = cpu_seconds()
        features, labels = self._training_data.read(task.start, task.end)
        loss_sum = 0.0
        nonfinite = 0
        rejected_before = self.counters.rejected
        self._step.start_task(task.id, task.epoch)
        for x, y in self._trainer.batches(features, labels, Mode.TRAINING):
            self._stop_if_asked()
            count = records_in(y)
            try:
                loss = self._step.train(x, y, count)
                loss_sum += loss * count
                if not result.HasField("first_loss"):  # the model it was computed at: the pull's
                    result.first_loss, result.first_loss_version = loss, max(0, min(self._model.versions))
            except NonFiniteLoss as err:
                nonfinite += 1  # nothing of it went to the PS; the coordinator hears of it (Diverged)
                if nonfinite == 1:
                    log.warning("task %d: a minibatch's loss is %s: not pushed", task.id, err.loss)
            self.counters.steps += 1
            self.counters.examples += count
            self._metrics.steps.inc()
            self._metrics.records.inc(count)
        self._step.end_task()
        if self._hop is not None:
            result.model_version = self._model.versions[0]  # decentralized: its iteration now
        result.loss_sum = loss_sum
        result.nonfinite_steps = nonfinite
        result.rejected = self.counters.rejected - rejected_before

    # ---- evaluation --------------------------------------------------------------------------
    def _evaluate(self, task: pb.Task, result: pb.TaskResult) -> None:
        if self._validation_data is None:
            raise RuntimeError("an evaluation task, but this worker has no validation data")
        self._model.refresh()  # evaluate the model including this worker's last push
        features, labels = self._validation_data.read(task.start, task.end)
        for name, value in self._trainer.evaluate(features, labels).items():
            if math.isfinite(value):
                result.metric_sums[name] = value
            else:  # a diverged model's loss: left out of the job's metrics (its health says Diverged)
                log.warning("task %d: metric %s is %s: not reported", task.id, name, value)

    # ---- export ------------------------------------------------------------------------------
    def _export(self, task: pb.Task, result: pb.TaskResult) -> None:
        if self._exporter is None:
            raise ExportError("an export task, but this worker has no --output")
        version = self._model.pull_settled(EXPORT_WAIT_MS, EXPORT_ATTEMPTS, strict=task.final and self._sync)
        if task.final and self._hop is None and version != task.model_version:
            raise ExportError(f"asked to export version {task.model_version}, but the PS shards hold {version}")
        try:
            status: pb.JobStatus | None = self._coordinator.status()
        except Exception as err:  # the metrics are a courtesy: the model is what matters
            log.warning("exporting without the job's metrics (the coordinator did not answer): %s", err)
            status = None
        metrics = metrics_document(status, version, task.final, shard_versions=self._model.versions)
        try:
            written = self._exporter.write(self._trainer.export, version, task.final, metrics)
        except Stopped:
            raise
        except Exception as err:
            raise ExportNotWritten(str(err)) from err
        log.info("exported model version %d to %s", version, written)
        result.model_version = version

    # ---- prediction --------------------------------------------------------------------------
    def _predict(self, task: pb.Task, result: pb.TaskResult) -> None:
        prediction = self._prediction
        if prediction is None:
            raise RuntimeError("a prediction task, but this worker has no --prediction_data")
        if not prediction.standalone:
            version = self._model.pull_settled(EXPORT_WAIT_MS, EXPORT_ATTEMPTS, strict=self._sync)
            if self._hop is None and version != task.model_version:
                raise RuntimeError(f"asked to predict with version {task.model_version}, but the PS shards hold {version}")
        features, labels = prediction.data.read(task.start, task.end)
        outputs = self._trainer.predict(features, labels)
        written = prediction.writer.write(task.start, task.end, outputs, labels)
        log.info("predicted records %d-%d into %s", task.start, task.end, written)
        if prediction.processor is not None:
            prediction.processor(outputs)
        result.records = task.end - task.start
