"""Faults injected for real during `elasticps run`: kill -9 a worker or a PS shard, Ctrl-C, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from local_jobs import elasticps, job_document, wait_for, write_data, write_job
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token
from elasticps.proto import elasticps_pb2 as pb

pytestmark = pytest.mark.slow

RECORDS = 12000



def start_job(tmp_path: Path, **training: object) -> tuple[object, Path, Path]:
    train, validation = write_data(tmp_path, records=RECORDS)
    document = job_document("faults", train, validation, **training)
    job = write_job(tmp_path / "job.yaml", document)
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    return process, run_dir, result_file


def first_answer(client: CoordinatorClient) -> pb.JobStatus:
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.status()
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def coordinator(run_dir: Path) -> CoordinatorClient:
    wait_for(lambda: (run_dir / "ps-0.port").exists(), 180, "PS 0 to serve")  # a loaded machine: a minute was too short once
    port = int((run_dir / "ps-0.port").read_text())
    return CoordinatorClient(f"127.0.0.1:{port}", worker="test", token=observer_token(run_dir))


def test_kill_worker_mid_job_every_record_still_trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tasks of 6,000 records (one per worker per epoch): once a sync round averaged both workers'
    # gradients (shard 0's round log says so) and no task is done yet, each worker is inside its
    # first task, so the kill always leaves a task behind. (The version alone is no sign: a round
    # counts the live workers, and it moves with one worker while the other is still starting.)
    rounds_log = tmp_path / "rounds"
    monkeypatch.setenv("ELASTICPS_ROUND_LOG", str(rounds_log))
    process, run_dir, result_file = start_job(tmp_path, recordsPerTask=6000)
    client = coordinator(run_dir)

    def both_in_a_round() -> bool:
        log = rounds_log / "ps-0.jsonl"
        lines = log.read_text().splitlines()[:-1] if log.exists() else []  # the last may be half written
        return any(len(json.loads(line)["minibatches"]) == 2 for line in lines)

    def inside_first_tasks() -> bool:  # records count as rounds apply them: under 6,000, no task is done
        return both_in_a_round() and client.status().records_done < 6000

    wait_for(inside_first_tasks, 120, "both workers inside their first task")
    victim = int((run_dir / "faults-worker-0.pid").read_text())
    os.kill(victim, signal.SIGKILL)
    _, stderr = process.communicate(timeout=240)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert "faults-worker-0 exited with code -9: replacing it" in stderr
    result = json.loads(result_file.read_text())
    assert result["restarts"] == 1
    assert result["epoch_records"] == [RECORDS, RECORDS]  # every record trained once per epoch
    assert result["tasks_requeued"] >= 1  # the killed worker's task went back to the queue


def test_kill_ps_shard_restores_from_checkpoint(tmp_path: Path) -> None:
    process, run_dir, result_file = start_job(tmp_path, checkpointSteps=20)
    client = coordinator(run_dir)
    wait_for(lambda: client.status().model_version >= 60, 120, "a few checkpoints")
    victim = int((run_dir / "faults-ps-1.pid").read_text())
    os.kill(victim, signal.SIGKILL)
    _, stderr = process.communicate(timeout=240)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert "faults-ps-1 exited with code -9: replacing it" in stderr
    log = (run_dir / "faults-ps-1.log").read_text()
    assert "resumes at version" in log
    assert list((run_dir / "checkpoints" / "ps-1").glob("ckpt-*.eps"))
    # The coordinator rolled every shard and its ledger back to one checkpointed version.
    assert "every shard and the task ledger rolled back to version" in (run_dir / "faults-ps-0.log").read_text()
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [RECORDS, RECORDS]
    assert len(set(result["shard_versions"])) == 1, result["shard_versions"]
    assert result["metrics"]["accuracy"] > 0.85


def test_kill_ps0_coordinator_resumes_its_ledger(tmp_path: Path) -> None:
    process, run_dir, result_file = start_job(tmp_path, checkpointSteps=20)
    client = coordinator(run_dir)
    wait_for(lambda: RECORDS // 4 <= client.status().records_done < RECORDS, 120, "a quarter of epoch 1")
    victim = int((run_dir / "faults-ps-0.pid").read_text())
    os.kill(victim, signal.SIGKILL)
    after = first_answer(client)
    # The ledger survived (no start from zero): it went back to the last checkpointed version,
    # with the shards, and the records reported after it are trained again.
    assert after.records_done > 0
    _, stderr = process.communicate(timeout=240)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert "faults-ps-0 exited with code -9: replacing it" in stderr
    assert "every shard and the task ledger rolled back to version" in (run_dir / "faults-ps-0.log").read_text()
    result = json.loads(result_file.read_text())
    # The restarted coordinator kept its ledger: each record still trained exactly once per epoch.
    assert result["epoch_records"] == [RECORDS, RECORDS]


@pytest.mark.parametrize("victim", ["faults-ps-0", "faults-ps-1"])
def test_a_ps_killed_after_the_last_training_task_still_ends_the_job(tmp_path: Path, victim: str) -> None:
    """The end of a job is durable: a PS killed once every record of every epoch is trained, while
    the final evaluation runs, restarts from an older checkpoint; every shard and the ledger roll
    back, the records trained since go back to the queue and are trained again (by the workers still
    there, or by workers the planner starts again once they all left: ``planning/retraining.py``).
    The job Succeeds, each record counted once per epoch, and does not hang."""
    train, _ = write_data(tmp_path, records=RECORDS)
    rng = np.random.default_rng(1)
    validation = tmp_path / "big-validation.npz"  # a long final evaluation: the window the kill aims at
    np.savez(validation, x=rng.normal(size=(VALIDATION, 8)).astype(np.float32), y=rng.integers(0, 2, VALIDATION))
    # 2 epochs of 12,000 records in sync rounds of up to 2 x 16: at least 750 versions, so the last
    # checkpoint (every 100) is at least 50 versions before the end.
    document = job_document("faults", train, validation, minibatchSize=16, checkpointSteps=100, evaluationSteps=0)
    job = write_job(tmp_path / "job.yaml", document)
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    client = coordinator(run_dir)

    def every_task_trained() -> bool:
        try:
            status = client.status(timeout_s=2.0)
        except grpc.RpcError:
            return False  # PS 0 is still starting
        assert not status.finished, "the job ended before the test could kill in its last window"
        return status.records_done == 2 * RECORDS

    wait_for(every_task_trained, 180, "the last training task")
    os.kill(int((run_dir / f"{victim}.pid").read_text()), signal.SIGKILL)
    _, stderr = process.communicate(timeout=240)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert f"{victim} exited with code -9: replacing it" in stderr
    assert "every shard and the task ledger rolled back to version" in (run_dir / "faults-ps-0.log").read_text()
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [RECORDS, RECORDS]
    assert len(set(result["shard_versions"])) == 1, result


VALIDATION = 20000


# ---- stopping `elasticps run` by a signal ---------------------------------------------------------
# The job cannot finish while a test interrupts it (far more epochs than the test lasts), and the
# signal goes only once the workers are seen training: the test never races the job.
ENDLESS_EPOCHS = 100_000


def training_under_way(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """`elasticps run` on a job that cannot finish during the test, once its workers train.

    Returns the process and the pids of every replica (from the run's ``*.pid`` files).
    """
    process, run_dir, _ = start_job(tmp_path, numEpochs=ENDLESS_EPOCHS)
    assert isinstance(process, subprocess.Popen)
    client = coordinator(run_dir)

    def trained_some() -> bool:
        assert process.poll() is None, process.communicate()[1]
        try:
            return client.status(timeout_s=2.0).records_done > 0
        except grpc.RpcError:
            return False  # PS 0 is still starting

    try:
        wait_for(trained_some, 180, "training to start")
    finally:
        client.close()
    pids = [int(p.read_text()) for p in run_dir.glob("*.pid")]
    assert len(pids) == 4  # 2 PS + 2 workers
    return process, pids


def gone(pid: int) -> bool:
    proc = Path(f"/proc/{pid}")
    try:
        return not proc.exists() or "zombie" in (proc / "status").read_text()
    except OSError:
        return True


def assert_every_replica_stops(process: subprocess.Popen[str], pids: list[int], signum: int, code: int) -> str:
    """Sends ``signum`` to the runner; it must exit ``code`` and leave no replica running."""
    try:
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == code, stderr
        assert "Traceback" not in stderr, stderr
        wait_for(lambda: all(gone(pid) for pid in pids), 5, "every replica to stop")
        return stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in pids:  # what a broken runner left behind, so one failure does not leak processes
            if not gone(pid):
                os.killpg(pid, signal.SIGKILL)


def test_ctrl_c_stops_every_replica(tmp_path: Path) -> None:
    process, pids = training_under_way(tmp_path)
    stderr = assert_every_replica_stops(process, pids, signal.SIGINT, 130)
    assert "interrupted, every replica stopped" in stderr


def test_sigterm_stops_every_replica_and_exits_143(tmp_path: Path) -> None:
    # timeout, docker stop, CI runners and systemd stop a run with SIGTERM, not Ctrl-C.
    process, pids = training_under_way(tmp_path)
    stderr = assert_every_replica_stops(process, pids, signal.SIGTERM, 143)
    assert "terminated, every replica stopped" in stderr
