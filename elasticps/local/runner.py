"""``elasticps run JOB.yaml``: a TrainingJob on this machine, its replicas as local processes.

The PS processes start first on free 127.0.0.1 ports (each reports the port it bound through a
file; a restarted PS gets its port back so the workers' addresses stay valid), then the workers.
Every half second the runner polls the children and the coordinator: a replica that exited is
started again per its role's restart policy, each replacement counting against
``runPolicy.backoffLimit``; the job succeeds when the coordinator says the training is done and the
workers exited 0 (the PS processes never exit on their own: the runner stops them). Ctrl-C stops
every child.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from elasticps.api.replicas import Replica, Role, ps_replica, should_restart, worker_replica
from elasticps.api.spec import TrainingJob
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local import processes
from elasticps.local.processes import Process
from elasticps.local.progress import Progress, describe
from elasticps.proto import elasticps_pb2 as pb

POLL_S = 0.5
PS_START_TIMEOUT_S = 60.0


class JobFailed(Exception):
    """The job cannot finish; the message says why."""


@dataclass(frozen=True)
class Evaluation:
    elapsed_s: float  # since the runner started
    version: int  # the model version evaluated
    records_done: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class RunResult:
    status: pb.JobStatus
    elapsed_s: float
    restarts: int
    history: tuple[Evaluation, ...] = ()


class LocalRunner:
    def __init__(self, job: TrainingJob, run_dir: Path, progress: Progress) -> None:
        self.job = job
        self.run_dir = run_dir
        self._progress = progress
        self._processes: list[Process] = []
        self._restarts = 0
        self._started = time.monotonic()
        self._history: list[Evaluation] = []

    def run(self) -> RunResult:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            addresses = self._start_ps()
            for index in range(self.job.spec.worker.replicas):
                self._processes.append(processes.start(worker_replica(self.job, index, addresses), self.run_dir))
            return self._watch(CoordinatorClient(addresses[0], worker="runner"))
        finally:
            processes.stop_all(self._processes)
            self._progress.close()

    # ---- start -------------------------------------------------------------------------------
    def _start_ps(self) -> list[str]:
        checkpoints = str(self.run_dir / "checkpoints")
        started: list[tuple[Process, Path]] = []
        for index in range(self.job.spec.ps.replicas):
            port_file = self.run_dir / f"ps-{index}.port"
            port_file.unlink(missing_ok=True)
            replica = ps_replica(
                self.job, index, host="127.0.0.1", port=0, checkpoint_dir=checkpoints,
                extra=[f"--port_file={port_file}"],
            )
            process = processes.start(replica, self.run_dir)
            self._processes.append(process)
            started.append((process, port_file))
        addresses = []
        for process, port_file in started:
            port = self._wait_port(process, port_file)
            addresses.append(f"127.0.0.1:{port}")
            # A restart reuses the port, so workers keep their addresses.
            fixed = ps_replica(
                self.job, process.replica.index, host="127.0.0.1", port=port, checkpoint_dir=checkpoints
            )
            process.replica = fixed
        return addresses

    def _wait_port(self, process: Process, port_file: Path) -> int:
        deadline = time.monotonic() + PS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if port_file.exists():
                return int(port_file.read_text().strip())
            if process.exit_code is not None:
                raise JobFailed(
                    f"{process.replica.name} exited with code {process.exit_code} before serving:\n"
                    f"{processes.log_tail(process)}"
                )
            time.sleep(0.05)
        raise JobFailed(f"{process.replica.name} did not start serving within {PS_START_TIMEOUT_S:.0f} s")

    # ---- watch -------------------------------------------------------------------------------
    def _watch(self, coordinator: CoordinatorClient) -> RunResult:
        status = pb.JobStatus()
        deadline_s = self.job.spec.run_policy.active_deadline_seconds
        while True:
            try:
                status = coordinator.status(timeout_s=2.0)
                self._progress.update(status)
                self._record(status)
            except grpc.RpcError:
                pass  # PS 0 restarting: the next poll will tell
            self._handle_exits()
            workers = [p for p in self._processes if p.replica.role is Role.WORKER]
            if workers and all(p.exit_code == 0 for p in workers):
                # Workers exit 0 only when the coordinator told them the job is finished.
                if not status.finished:
                    try:
                        status = coordinator.status(timeout_s=5.0)
                    except grpc.RpcError as err:
                        raise JobFailed(f"workers finished but PS 0 does not answer: {err.code().name}") from None
                if not status.finished:
                    raise JobFailed("workers exited but the coordinator says the training is not done")
                self._progress.update(status)
                self._record(status)
                return RunResult(status, time.monotonic() - self._started, self._restarts, tuple(self._history))
            if deadline_s and time.monotonic() - self._started > deadline_s:
                raise JobFailed(f"DeadlineExceeded: the job ran longer than activeDeadlineSeconds={deadline_s}")
            time.sleep(POLL_S)

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

    def _handle_exits(self) -> None:
        for process in self._processes:
            code = process.exit_code
            if code is None or (code == 0 and process.replica.role is Role.WORKER):
                continue
            if not should_restart(process.replica.restart_policy, code):
                raise JobFailed(
                    f"{process.replica.name} failed with exit code {code} (restartPolicy "
                    f"{process.replica.restart_policy.value}):\n{processes.log_tail(process)}"
                )
            limit = self.job.spec.run_policy.backoff_limit
            if self._restarts >= limit:
                raise JobFailed(
                    f"BackoffLimitExceeded: {process.replica.name} exited with code {code} after "
                    f"{self._restarts} replacements (backoffLimit {limit}):\n{processes.log_tail(process)}"
                )
            self._restarts += 1
            self._progress.event(
                f"{process.replica.name} exited with code {code}: replacing it "
                f"(replacement {self._restarts} of at most {limit})"
            )
            self._replace(process)

    def _replace(self, process: Process) -> None:
        replica: Replica = process.replica
        fresh = processes.start(replica, self.run_dir, restarts=process.restarts + 1)
        self._processes[self._processes.index(process)] = fresh


def summary(job: TrainingJob, result: RunResult) -> str:
    status = result.status
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in sorted(status.metrics.items()))
    loss = "" if math.isnan(status.loss) else f", training loss {status.loss:.4f}"
    return (
        f"job {job.name} succeeded in {result.elapsed_s:.1f} s: {metrics or 'no evaluation'}"
        f" (model version {status.metrics_version}){loss}\n"
        f"  {status.records_done}/{status.records_total} records trained over {status.num_epochs} epochs"
        f" ({', '.join(str(n) for n in status.epoch_records)} per epoch), model version {status.model_version},"
        f" {status.tasks_requeued} tasks requeued, {status.gradients_rejected} gradients rejected,"
        f" {result.restarts} replicas replaced\n  {describe(status)}"
    )


def outcome(result: RunResult) -> dict[str, object]:
    """The result as plain data (``elasticps run --result_file``)."""
    status = result.status
    return {
        "succeeded": True,
        "elapsed_s": round(result.elapsed_s, 2),
        "restarts": result.restarts,
        "records_done": status.records_done,
        "records_total": status.records_total,
        "epoch_records": list(status.epoch_records),
        "model_version": status.model_version,
        "metrics": dict(status.metrics),
        "metrics_version": status.metrics_version,
        "tasks_requeued": status.tasks_requeued,
        "gradients_rejected": status.gradients_rejected,
        "history": [asdict(evaluation) for evaluation in result.history],
    }
