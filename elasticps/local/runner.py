"""``elasticps run JOB.yaml``: a TrainingJob on this machine, its replicas as local processes,
driven by the same planner as the operator.

Callers: ``elasticps run`` (``cli``), and tests that change a running job's spec through
:meth:`LocalRunner.update_spec`. ``elasticps scale RUN_DIR --workers N`` changes it from another
process: it writes a request into the run directory (``control``), the pass reads it and hands the
planner the spec with ``worker.replicas = N``, as a cluster's ``kubectl patch`` would. Every half
second a pass:

0. ``control``: a new ``elasticps scale`` request becomes the job's spec (``workers: 2 -> 4``);
1. ``fleet.tick``: reap stopped processes, note exits, start replicas that were waiting;
2. observe: the processes as ``ObservedPod``s (``fleet``), PS 0's coordinator answer as
   ``JobProgress`` (asked only while PS 0 runs), the job's ``.status`` as the runner keeps it in
   memory; no Services or NetworkPolicies (there are none to observe here);
3. ``plan`` and ``executing.execute``: creates and deletes become process starts and stops, the
   ``SetStatus`` patch is applied to the in-memory status, and what a person should hear goes
   above the progress bar (a replica replaced, the job suspended, resumed or scaled);
4. the job ends when the status says Succeeded (the run's result) or Failed (``JobFailed`` with the
   condition's reason and message, and the log tail of the replica that failed last).

So restart policies, ``backoffLimit``, ``activeDeadlineSeconds``, ``suspend`` and scaling work here
exactly as in a cluster. ``ttlSecondsAfterFinished`` and ``cleanPodPolicy`` have no local meaning
and are skipped by design (see ``executing``): the run ends with the job, and every process is
stopped then, as on Ctrl-C or SIGTERM (``cli`` turns SIGTERM into an exception that unwinds
through :meth:`LocalRunner.run`'s ``finally``, like Ctrl-C's ``KeyboardInterrupt``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from elasticps.api.spec import SCALE_DECENTRALIZED, JobPhase, TrainingJob
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local import control, processes
from elasticps.local.executing import execute
from elasticps.local.fleet import Fleet, Slot
from elasticps.local.progress import Progress
from elasticps.local.results import Evaluation, JobFailed, RunResult
from elasticps.planning.observed import Observed
from elasticps.planning.plan import plan
from elasticps.planning.progress import job_progress
from elasticps.planning.settings import PlannerSettings
from elasticps.proto import elasticps_pb2 as pb

POLL_S = 0.5
COORDINATOR_TIMEOUT_S = 2.0
# Processes are never unschedulable nor stuck pulling an image: nothing to time out on.
SETTINGS = PlannerSettings(pending_timeout_s=None)


class LocalRunner:
    def __init__(
        self,
        job: TrainingJob,
        run_dir: Path,
        progress: Progress,
        *,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.run_dir = run_dir
        self._job = job
        self._lock = threading.Lock()
        self._progress = progress
        self._poll_s = poll_s
        self._clock = clock
        self._fleet = Fleet(run_dir)
        self._coordinator: CoordinatorClient | None = None
        self._started = time.monotonic()
        self._history: list[Evaluation] = []
        self._control = control.Watcher(run_dir)
        self.status: dict[str, Any] = {}  # the job's .status, as the planner wrote it (replaced, never edited)

    @property
    def job(self) -> TrainingJob:
        with self._lock:
            return self._job

    def update_spec(self, job: TrainingJob) -> None:
        """A new spec for the running job (same name), e.g. ``runPolicy.suspend`` or
        ``worker.replicas`` changed; the next pass plans with it. Safe from any thread."""
        if (job.name, job.namespace) != (self._job.name, self._job.namespace):
            raise ValueError(f"update_spec: {job.namespace}/{job.name} is not this run's job")
        with self._lock:
            self._job = job

    def run(self) -> RunResult:
        control.claim(self.run_dir, self.job.name)
        try:
            while True:
                result = self._pass()
                if result is not None:
                    return result
                time.sleep(self._poll_s)
        finally:
            control.release(self.run_dir)
            self._fleet.stop_all()
            self._progress.close()
            if self._coordinator is not None:
                self._coordinator.close()

    def _pass(self) -> RunResult | None:
        self._read_control()
        job = self.job
        self._fleet.tick(job)
        reply = self._ask_coordinator()
        observed = Observed(
            pods=self._fleet.observe(),
            services=None,
            now=self._clock(),
            coordinator=None if reply is None else job_progress(reply),
            status=self.status,
        )
        actions = plan(job, observed, SETTINGS)
        failed = self._fleet.last_failure()  # before the actions: cleanPodPolicy All deletes its slot
        self.status, lines = execute(actions, job, self._fleet, self.status)
        phase = self.status.get("phase")
        if phase == JobPhase.SUCCEEDED.value:  # only ever on PS 0's answer that the training is done
            restarts = int(self.status.get("restarts", 0))
            final = reply if reply is not None else pb.JobStatus()
            return RunResult(final, time.monotonic() - self._started, restarts, tuple(self._history))
        if phase == JobPhase.FAILED.value:
            raise JobFailed(self._failure(failed))
        for line in lines:
            self._progress.event(line)
        return None

    def _read_control(self) -> None:
        """Applies a new ``elasticps scale`` request: the spec with the workers it asked for."""
        try:
            asked = self._control.poll()
        except control.ControlError as err:
            self._progress.event(f"ignored a scale request: {err}")
            return
        if asked is None:
            return
        job = self.job
        before = job.spec.worker.replicas
        if not job.uses_ps and asked.worker_replicas != before:
            self._progress.event(f"ignored a scale request: {SCALE_DECENTRALIZED}")
            return
        if asked.worker_replicas == before:
            self._progress.event(f"workers: {before} already")
            return
        worker = replace(job.spec.worker, replicas=asked.worker_replicas)
        self.update_spec(replace(job, spec=replace(job.spec, worker=worker)))
        self._progress.event(f"workers: {before} -> {asked.worker_replicas}")

    def _ask_coordinator(self) -> pb.JobStatus | None:
        address = self._fleet.coordinator_address(self.job)
        if address is None:
            return None
        if self._coordinator is None:
            self._coordinator = CoordinatorClient(address, worker="runner", token=self._fleet.observer())  # it keeps its port
        try:
            reply = self._coordinator.status(timeout_s=COORDINATOR_TIMEOUT_S)
        except grpc.RpcError:
            return None  # PS 0 starting or restarting: the next pass will tell
        self._progress.update(reply)
        self._record(reply)
        return reply

    def _record(self, status: pb.JobStatus) -> None:
        """Keeps each new evaluation with its time: the run's learning curve."""
        if status.metrics and (not self._history or self._history[-1].version != status.metrics_version):
            self._history.append(
                Evaluation(
                    elapsed_s=round(time.monotonic() - self._started, 2),
                    version=status.metrics_version,
                    records_done=status.records_done,
                    metrics=dict(status.metrics),
                )
            )

    def _failure(self, slot: Slot | None) -> str:
        """The Failed condition's reason and message, with the log tail of the replica that failed
        (not for a user's mistake: the replica's own line says it, once)."""
        conditions: list[dict[str, Any]] = self.status.get("conditions", [])
        condition = next((c for c in conditions if c.get("type") == JobPhase.FAILED.value), {})
        message = f"{condition.get('reason', 'Failed')}: {condition.get('message', '')}"
        if slot is not None and slot.process is not None and condition.get("reason") != "UserError":
            message += f"\n{slot.name} exited with code {slot.process.exit_code}; its log ends with:\n"
            message += processes.log_tail(slot.process)
        return message


