"""A running local job whose spec changes (``LocalRunner.update_spec``): suspend and resume, scale
the workers up and down. Real processes; the runner in a thread of the test, as ``elasticps run``
would run it, so the test can hand it the changed spec. And the command for it: ``elasticps scale``
against an ``elasticps run`` in a process of its own."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from job_builders import merge
from local_jobs import elasticps, job_document, wait_for, write_data, write_job

from elasticps.api.parsing import parse_job
from elasticps.ps import checkpoint
from elasticps.api.spec import TrainingJob
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token
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
        return alive(self.run_dir, name)

    def records_done(self) -> int:
        return records_done(self.run_dir)

    def result(self, timeout: float = 240) -> RunResult:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the job did not end"
        assert "error" not in self.outcome, f"{self.outcome.get('error')}\n{self.output.getvalue()}"
        result = self.outcome["result"]
        assert isinstance(result, RunResult)
        return result


def alive(run_dir: Path, name: str) -> bool:
    """Whether the newest process of replica ``name`` still runs."""
    pid_file = run_dir / f"{name}.pid"
    if not pid_file.exists():
        return False
    status = Path(f"/proc/{int(pid_file.read_text())}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:
        return False


def records_done(run_dir: Path) -> int:
    port_file = run_dir / "ps-0.port"
    if not port_file.exists():
        return 0
    client = CoordinatorClient(f"127.0.0.1:{int(port_file.read_text())}", worker="test", token=observer_token(run_dir))
    try:
        return int(client.status(timeout_s=2.0).records_done)
    except grpc.RpcError:
        return 0
    finally:
        client.close()


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
    # Records count as rounds apply them, so training shows before the first checkpoint: wait for one.
    wait_for(lambda: any((run.run_dir / "checkpoints" / "ps-0").glob("ckpt-*.eps")) or not run.thread.is_alive(),
             120, "the first checkpoint")  # fmt: skip
    run.runner.update_spec(with_run_policy(job, suspend=True))
    wait_for(lambda: run.phase == "Suspended" and not run.alive("changes-ps-0") and not run.alive("changes-worker-0"),
             60, "every process to stop")
    pids = sorted(p.read_text() for p in run.run_dir.glob("*.pid"))
    # The worker stopped first, then the PS, which checkpointed the version it stopped at.
    log = (run.run_dir / "changes-ps-0.log").read_text()
    stopped_at = int(re.findall(r"PS 0 stops at version (\d+)", log)[-1])
    newest = max(v for v in map(checkpoint.version_of, checkpoint.list_checkpoints(run.run_dir / "checkpoints" / "ps-0"))
                 if v is not None)
    assert newest == stopped_at, (newest, stopped_at)
    time.sleep(1.5)  # suspended stays suspended: nothing started again
    assert run.phase == "Suspended" and sorted(p.read_text() for p in run.run_dir.glob("*.pid")) == pids
    assert "TrainingJob is suspended" in run.output.getvalue()

    run.runner.update_spec(job)
    result = run.result()
    assert run.phase == "Succeeded"
    assert list(result.status.epoch_records) == [RECORDS, RECORDS]  # every record trained once per epoch
    assert result.restarts == 0  # suspending spends no restart
    assert "TrainingJob is resumed" in run.output.getvalue()
    # From that checkpoint, not the last periodic one: nothing trained again.
    assert f"resumes at version {stopped_at}" in (run.run_dir / "changes-ps-0.log").read_text(), stopped_at


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


# The training settings of each mode; sync joins the matrix once its rounds are wired in.
MODES: dict[str, dict[str, object]] = {"async": {"useAsync": True, "taskTimeoutSeconds": 5}, "sync": {}}
# With paced_net's pause per task (30 tasks an epoch), long enough that the job is still training
# after both scalings (4 workers, then 1) however fast the workers compute: at least 3 s an epoch
# with 4 workers, 6 s with 2.
SCALE_EPOCHS = 8
HERE = Path(__file__).parent


def scale(run_dir: Path, workers: int) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "elasticps", "scale", str(run_dir), "--workers", str(workers)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_elasticps_scale_changes_the_workers_of_a_running_elasticps_run(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    train, validation = write_data(tmp_path, records=RECORDS)
    document = job_document("scaled", train, validation, minibatchSize=16, numEpochs=SCALE_EPOCHS, **MODES[mode])
    spec = document["spec"]
    assert isinstance(spec, dict)
    spec["model"] = {"modelDef": "paced_net"}
    job_file = write_job(tmp_path / "job.yaml", document)  # 2 PS + 2 workers
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job_file), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    workers = [f"scaled-worker-{i}" for i in range(4)]
    try:
        wait_for(lambda: records_done(run_dir) > 0 or process.poll() is not None, 180, "training to start")
        assert "asked job scaled (elasticps run, pid" in scale(run_dir, 4)
        wait_for(lambda: all(alive(run_dir, w) for w in workers) or process.poll() is not None, 60, "4 workers")
        assert process.poll() is None, "the job ended before it had 4 workers"
        wait_for(lambda: all(f"--worker_id={i}" in (run_dir / f"{w}.log").read_text() for i, w in enumerate(workers)),
                 10, "every worker's log")
        assert "for 1 workers" in scale(run_dir, 1)
        wait_for(lambda: not any(alive(run_dir, w) for w in workers[1:]), 60, "workers 1-3 to stop")
        assert process.poll() is None and alive(run_dir, workers[0]), "the job ended before it ran on one worker"
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.terminate()
            process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "workers: 2 -> 4" in stderr and "workers: 4 -> 1" in stderr
    assert "Workers scaled down to 1" in stderr
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [RECORDS] * SCALE_EPOCHS  # every record trained once per epoch
    assert result["restarts"] == 0  # scaling spends no restart
    assert not (run_dir / "runner.json").exists()  # the run is over: `scale` now says so
