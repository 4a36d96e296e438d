"""Each record trained exactly once per epoch under the faults of issue 35's Found 7, counted from
the shards' own round logs (``ELASTICPS_ROUND_LOG``, read by ``elasticps.tools.round_log``): the
minibatches in each shard's model at the end, per epoch, against the data's.

Before, a task that went back to the queue was trained again whole, its committed minibatches
included (a worker kill: 961 minibatches applied of MNIST's 938 an epoch; PS 0 killed twice: 2,104
for 2 epochs), while the status said every record once. Now a round tells the ledger which of a
task's records it applied, and a task goes back only from its first record not applied; its old
holder hears VOID at its next join and leaves it.

Each test runs a real ``elasticps run`` (2 PS, Keras workers) and injects the fault while the
workers are inside their tasks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from local_jobs import elasticps, job_document, stop_run, wait_for, write_data, write_job
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token
from elasticps.proto import elasticps_pb2 as pb
from elasticps.tools import round_log

pytestmark = pytest.mark.slow

RECORDS = 6000
MINIBATCH = 32
PER_TASK = 960  # 30 minibatches a task: a fault lands inside a task, after some of its rounds
EPOCHS = 2
EXPECTED = round_log.expected_per_epoch(RECORDS, PER_TASK, MINIBATCH)  # 188 (6 tasks of 30, one of 8)


class Run:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int = 2,
                 model: dict[str, object] | None = None, **training: object) -> None:  # fmt: skip
        self.rounds = tmp_path / "rounds"
        monkeypatch.setenv("ELASTICPS_ROUND_LOG", str(self.rounds))
        train, validation = write_data(tmp_path, records=RECORDS)
        document = job_document("once", train, validation, minibatchSize=MINIBATCH, recordsPerTask=PER_TASK,
                                numEpochs=EPOCHS, **training)  # fmt: skip
        spec = document["spec"]
        assert isinstance(spec, dict)
        spec["worker"] = {"replicas": workers}
        if model is not None:
            spec["model"] = model
        job = write_job(tmp_path / "job.yaml", document)
        self.run_dir, self.result_file = tmp_path / "run", tmp_path / "result.json"
        self.process = elasticps("run", str(job), "--run_dir", str(self.run_dir), "--result_file",
                                 str(self.result_file), cwd=tmp_path)  # fmt: skip

    def status(self) -> pb.JobStatus | None:
        port_file = self.run_dir / "ps-0.port"
        if not port_file.exists():
            return None
        client = CoordinatorClient(f"127.0.0.1:{int(port_file.read_text())}", worker="test",
                                   token=observer_token(self.run_dir))  # fmt: skip
        try:
            return client.status(timeout_s=2.0)
        except grpc.RpcError:
            return None
        finally:
            client.close()

    def wait_version(self, at_least: int, timeout: float = 180) -> int:
        def reached() -> bool:
            status = self.status()
            assert self.process.poll() is None, "the job ended before the fault"
            return status is not None and status.model_version >= at_least and not status.finished

        wait_for(reached, timeout, f"model version {at_least}")
        status = self.status()
        assert status is not None
        return int(status.model_version)

    def kill(self, replica: str) -> None:
        os.kill(int((self.run_dir / f"once-{replica}.pid").read_text()), signal.SIGKILL)

    def kill_inside_a_task(self, timeout: float = 120) -> tuple[str, int]:
        """Kills a worker while it holds a task it has applied part of: one that has minibatches of
        epoch 0 in PS 0's model (the first to start may train alone a while: the other's TensorFlow
        can take seconds longer to load), stopped (SIGSTOP), its minibatches counted; a count on a
        task's boundary lets it go on a while and tries again. Returns the worker and its count."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "the job ended before the fault"
            for worker in sorted(self.epoch0_minibatches()):
                pid = int((self.run_dir / f"once-{worker}.pid").read_text())
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue  # done already: the other one trains
                try:
                    time.sleep(0.5)  # a push already sent commits, or waits for the stopped worker
                    applied = self.epoch0_minibatches().get(worker, 0)
                    if applied % (PER_TASK // MINIBATCH) != 0:
                        os.kill(pid, signal.SIGKILL)
                        return worker, applied
                finally:
                    with contextlib.suppress(ProcessLookupError):  # killed and reaped already
                        os.kill(pid, signal.SIGCONT)  # never left stopped, the test failing or not
            time.sleep(0.2)
        raise AssertionError("no worker was found inside a task")

    def epoch0_minibatches(self) -> dict[str, int]:
        """Each worker's minibatches of epoch 0 in PS 0's model so far."""
        entries = round_log.read(self.rounds / "ps-0.jsonl")
        return dict(Counter(m.split("/")[0] for m in round_log.minibatches(entries) if m.endswith("/e0")))

    def result(self) -> tuple[dict[str, object], str]:
        try:
            _, stderr = self.process.communicate(timeout=300)
        finally:
            stop_run(self.process)
        assert self.process.returncode == 0, stderr
        return json.loads(self.result_file.read_text()), stderr

    def applied(self, shard: int) -> tuple[dict[int, int], list[str], int]:
        """Shard ``shard``'s minibatches in its model per epoch, those in it twice, and its restores."""
        entries = round_log.read(self.rounds / f"ps-{shard}.jsonl")
        restores = sum(1 for e in entries if "restored" in e)
        return round_log.per_epoch(entries), round_log.twice(entries), restores


def assert_exactly_once(run: Run, result: dict[str, object]) -> None:
    for shard in (0, 1):
        per_epoch, twice, _ = run.applied(shard)
        print(f"PS {shard}: minibatches applied per epoch {per_epoch} (the data's: {EXPECTED}), twice: {len(twice)}")
        assert per_epoch == {e: EXPECTED for e in range(EPOCHS)}
        assert twice == []
    assert result["epoch_records"] == [RECORDS] * EPOCHS


def test_a_worker_killed_inside_its_task_leaves_only_its_unapplied_minibatches_to_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(tmp_path, monkeypatch)
    run.wait_version(10)
    worker, applied = run.kill_inside_a_task()
    print(f"{worker} killed with {applied} of its epoch-0 minibatches applied")
    result, stderr = run.result()
    assert f"once-{worker} exited with code -9: replacing it" in stderr
    assert int(result["tasks_requeued"]) >= 1  # type: ignore[call-overload]
    assert_exactly_once(run, result)


def test_scaled_from_4_workers_to_2_while_training_each_minibatch_is_applied_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(tmp_path, monkeypatch, workers=4)
    run.wait_version(25)
    done = subprocess.run([sys.executable, "-m", "elasticps", "scale", str(run.run_dir), "--workers", "2"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result, stderr = run.result()
    assert "workers: 4 -> 2" in stderr
    assert_exactly_once(run, result)


def test_ps0_killed_twice_rolls_back_with_its_ledger_and_applies_each_minibatch_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(tmp_path, monkeypatch, checkpointSteps=15)
    first = run.wait_version(40)
    run.kill("ps-0")
    wait_for(lambda: (run.status() or pb.JobStatus()).model_version > first + 10, 180, "training after the first kill")
    time.sleep(0.5)
    run.wait_version(first + 10)
    run.kill("ps-0")
    result, stderr = run.result()
    assert stderr.count("once-ps-0 exited with code -9: replacing it") == 2
    _, _, restores = run.applied(1)
    assert restores >= 2  # both times every shard went back to a checkpoint, PS 1 too
    assert_exactly_once(run, result)


def test_ps0_killed_without_checkpoints_rebuilds_its_ledger_from_the_other_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(tmp_path, monkeypatch, checkpointSteps=0)
    run.wait_version(40)
    run.kill("ps-0")
    result, stderr = run.result()
    assert "once-ps-0 exited with code -9: replacing it" in stderr
    assert "task ledger: rebuilt from PS 1's copy at model version" in (run.run_dir / "once-ps-0.log").read_text()
    assert_exactly_once(run, result)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_torch_job_scaled_2_4_1_with_ps1_killed_applies_each_minibatch_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch workers (issue 36) under the same changes: scaled up and down, a PS killed with -9."""
    run = Run(tmp_path, monkeypatch, model={"framework": "torch", "modelDef": "elasticps.backends.pytorch.zoo.mlp"},
              checkpointSteps=15)  # fmt: skip

    def scale(workers: int) -> None:
        done = subprocess.run([sys.executable, "-m", "elasticps", "scale", str(run.run_dir), "--workers", str(workers)],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr

    at = run.wait_version(20)
    scale(4)
    at = run.wait_version(at + 20)
    run.kill("ps-1")
    at = run.wait_version(at + 20)
    scale(1)
    result, stderr = run.result()
    assert "workers: 2 -> 4" in stderr and "workers: 4 -> 1" in stderr
    assert "once-ps-1 exited with code -9: replacing it" in stderr
    assert_exactly_once(run, result)
