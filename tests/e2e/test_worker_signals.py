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

pytestmark = pytest.mark.slow

CHILD_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "elasticps", *args], stdout=out, stderr=subprocess.STDOUT, env=CHILD_ENV
        )


def test_sigterm_stops_a_training_worker_and_requeues_its_task(tmp_path: Path) -> None:
    train, _ = write_data(tmp_path, records=20000)
    data = ["--data_reader=npz", f"--training_data={train}", "--records_per_task=20000", "--num_epochs=50"]
    port_file = tmp_path / "ps.port"
    ps = start(["ps", "--host=127.0.0.1", "--port=0", f"--port_file={port_file}", "--task_timeout_seconds=600", *data], tmp_path / "ps.log")
    worker: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert ps.poll() is None and time.monotonic() < deadline, (tmp_path / "ps.log").read_text()
            time.sleep(0.05)
        address = f"127.0.0.1:{port_file.read_text().strip()}"
        worker = start(
            ["worker", f"--ps_addrs={address}", "--model_def=elasticps.zoo.mlp", "--minibatch_size=32", *data],
            tmp_path / "worker.log",
        )
        status = CoordinatorClient(address, worker="test")
        deadline = time.monotonic() + 120
        while status.status().model_version < 5:  # training is under way, inside its one long task
            assert worker.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        assert status.status().tasks_requeued == 0

        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        took = time.monotonic() - signalled
        print(f"worker exited with {code} {took:.2f} s after SIGTERM")

        assert code == 143, (tmp_path / "worker.log").read_text()
        assert took < 10
        # Handed back at once, not after the 600 s task timeout.
        assert status.status().tasks_requeued == 1
        status.close()
    finally:
        for process in (worker, ps):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
