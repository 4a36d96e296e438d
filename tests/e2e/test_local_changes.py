"""A running local job whose spec changes (``LocalRunner.update_spec``): suspend and resume, scale
the workers up and down. Real processes; the runner in a thread of the test, as ``elasticps run``
would run it, so the test can hand it the changed spec (the command for that comes later)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from job_builders import merge
from local_jobs import job_document, wait_for, write_data

from elasticps.api.parsing import parse_job
from elasticps.api.spec import TrainingJob
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.progress import Progress
from elasticps.local.results import RunResult
from elasticps.local.runner import LocalRunner

pytestmark = pytest.mark.slow

RECORDS = 12000



@dataclass
class Run:
    runner: LocalRunner
    thread: threading.Thread
    output: io.StringIO
    outcome: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        return self.runner.run_dir

    @property
    def phase(self) -> str | None:
        phase = self.runner.status.get("phase")
        return None if phase is None else str(phase)

    def alive(self, name: str) -> bool:
        """Whether the newest process of replica ``name`` still runs."""
        pid_file = self.run_dir / f"{name}.pid"
        if not pid_file.exists():
            return False
        status = Path(f"/proc/{int(pid_file.read_text())}/status")
        try:
            return "zombie" not in status.read_text()
        except OSError:
            return False

    def records_done(self) -> int:
        port_file = self.run_dir / "ps-0.port"
        if not port_file.exists():
            return 0
        client = CoordinatorClient(f"127.0.0.1:{int(port_file.read_text())}", worker="test")
        try:
            return int(client.status(timeout_s=2.0).records_done)
        except grpc.RpcError:
            return 0
        finally:
            client.close()

    def result(self, timeout: float = 240) -> RunResult:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the job did not end"
        assert "error" not in self.outcome, f"{self.outcome.get('error')}\n{self.output.getvalue()}"
        result = self.outcome["result"]
        assert isinstance(result, RunResult)
        return result


def start(tmp_path: Path, spec: dict[str, Any], **training: object) -> tuple[Run, TrainingJob]:
    train, validation = write_data(tmp_path, records=RECORDS)
    document = job_document("changes", train, validation, minibatchSize=16, **training)
    document["spec"] = merge(document["spec"], spec)  # type: ignore[arg-type]
    job = parse_job(document)
    output = io.StringIO()
    runner = LocalRunner(job, tmp_path / "run", Progress(job.name, stream=output), poll_s=0.2)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = runner.run()
        except BaseException as err:  # noqa: BLE001 - reported by Run.result
            outcome["error"] = err

    thread = threading.Thread(target=target, name="local runner", daemon=True)
    thread.start()
    return Run(runner, thread, output, outcome), job


def with_run_policy(job: TrainingJob, **changes: Any) -> TrainingJob:
    return replace(job, spec=replace(job.spec, run_policy=replace(job.spec.run_policy, **changes)))


def with_workers(job: TrainingJob, replicas: int) -> TrainingJob:
    return replace(job, spec=replace(job.spec, worker=replace(job.spec.worker, replicas=replicas)))


def training_started(run: Run) -> None:
    wait_for(lambda: 0 < run.records_done() or not run.thread.is_alive(), 180, "training to start")
    done = run.records_done()
    assert run.thread.is_alive() and done < RECORDS, f"the job ran ahead of the test ({done} records done)"


def test_suspend_stops_every_process_and_resume_finishes_the_job(tmp_path: Path) -> None:
    run, job = start(tmp_path, {"ps": {"replicas": 1}, "worker": {"replicas": 1}}, checkpointSteps=10)
    training_started(run)
    run.runner.update_spec(with_run_policy(job, suspend=True))
    wait_for(lambda: run.phase == "Suspended" and not run.alive("changes-ps-0") and not run.alive("changes-worker-0"),
             60, "every process to stop")
    pids = sorted(p.read_text() for p in run.run_dir.glob("*.pid"))
    time.sleep(1.5)  # suspended stays suspended: nothing started again
    assert run.phase == "Suspended" and sorted(p.read_text() for p in run.run_dir.glob("*.pid")) == pids
    assert "TrainingJob is suspended" in run.output.getvalue()

    run.runner.update_spec(job)
    result = run.result()
    assert run.phase == "Succeeded"
    assert list(result.status.epoch_records) == [RECORDS, RECORDS]  # every record trained once per epoch
    assert result.restarts == 0  # suspending spends no restart
    assert "TrainingJob is resumed" in run.output.getvalue()
    assert "resumes at version" in (run.run_dir / "changes-ps-0.log").read_text()  # from its checkpoint


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1)], ids=["scale-up", "scale-down"])
def test_scaling_workers_starts_or_stops_processes_and_every_record_is_trained(
    tmp_path: Path, before: int, after: int
) -> None:
    # Async: the sync quorum still comes from the PS's --num_workers, fixed at its start.
    run, job = start(tmp_path, {"ps": {"replicas": 1}, "worker": {"replicas": before}}, useAsync=True,
                     taskTimeoutSeconds=5)
    training_started(run)
    run.runner.update_spec(with_workers(job, after))
    if after > before:
        wait_for(lambda: run.alive("changes-worker-1") or not run.thread.is_alive(), 60, "worker 1 to start")
        assert (run.run_dir / "changes-worker-1.log").exists()
    else:
        wait_for(lambda: not run.alive("changes-worker-1"), 60, "worker 1 to stop")
        assert "Workers scaled down to 1: deleting changes-worker-1" in run.output.getvalue()
    result = run.result()
    assert run.phase == "Succeeded" and run.runner.status["workers"].endswith(f"/{after}")
    assert list(result.status.epoch_records) == [RECORDS, RECORDS]
    assert result.restarts == 0  # scaling spends no restart
