"""A worker told to stop (SIGTERM, as the kubelet sends when a pod is deleted) exits at once with
143 and hands its task back: a real PS process and a real worker process on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_jobs import write_data

from elasticps.coordinator.client import CoordinatorClient
from elasticps.worker.main import STOP_GRACE_S

pytestmark = pytest.mark.slow

CHILD_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "elasticps", *args], stdout=out, stderr=subprocess.STDOUT, env=CHILD_ENV
        )


class Training:
    """A real PS process and a real worker process training one long task against it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        train, _ = write_data(tmp_path, records=20000)
        data = ["--data_reader=npz", f"--training_data={train}", "--records_per_task=20000", "--num_epochs=50"]
        port_file = tmp_path / "ps.port"
        self.ps = start(
            ["ps", "--host=127.0.0.1", "--port=0", f"--port_file={port_file}", "--task_timeout_seconds=600", *data],
            tmp_path / "ps.log",
        )
        self.worker: subprocess.Popen[bytes] | None = None
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert self.ps.poll() is None and time.monotonic() < deadline, (tmp_path / "ps.log").read_text()
            time.sleep(0.05)
        self.address = f"127.0.0.1:{port_file.read_text().strip()}"
        self.worker = start(
            ["worker", f"--ps_addrs={self.address}", "--model_def=elasticps.backends.keras.zoo.mlp", "--minibatch_size=32", *data],
            tmp_path / "worker.log",
        )
        self.status = CoordinatorClient(self.address, worker="test")
        deadline = time.monotonic() + 120
        while self.status.status().model_version < 5:  # training is under way, inside its one long task
            assert self.worker.poll() is None and time.monotonic() < deadline, self.worker_log()
            time.sleep(0.1)

    def worker_log(self) -> str:
        return (self.tmp_path / "worker.log").read_text()

    def sigterm_worker(self) -> tuple[int, float]:
        """SIGTERM to the worker: its exit code and the seconds it took to exit."""
        assert self.worker is not None
        signalled = time.monotonic()
        self.worker.send_signal(signal.SIGTERM)
        code = self.worker.wait(timeout=60)
        took = time.monotonic() - signalled
        print(f"worker exited with {code} {took:.2f} s after SIGTERM")
        return code, took

    def close(self) -> None:
        self.status.close()
        for process in (self.worker, self.ps):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_sigterm_stops_a_training_worker_and_requeues_its_task(tmp_path: Path) -> None:
    job = Training(tmp_path)
    try:
        assert job.status.status().tasks_requeued == 0
        code, took = job.sigterm_worker()
        assert code == 143, job.worker_log()
        assert took < 10
        # Handed back at once, not after the 600 s task timeout.
        assert job.status.status().tasks_requeued == 1, job.worker_log()
    finally:
        job.close()


def test_sigterm_stops_the_worker_in_time_when_the_ps_is_gone_too(tmp_path: Path) -> None:
    """A whole job deleted: the PS goes first, so handing the task back cannot succeed; the worker
    still exits within its grace period instead of retrying until the kubelet's SIGKILL."""
    job = Training(tmp_path)
    try:
        job.ps.kill()
        job.ps.wait()
        code, took = job.sigterm_worker()
        assert code == 143, job.worker_log()
        assert took < STOP_GRACE_S + 5
    finally:
        job.close()
