"""Helpers of the end-to-end tests: generated data, job documents, `elasticps run` as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[2]


def write_data(directory: Path, records: int, features: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """A linearly separable two-class problem: an MLP learns it to > 90% in one epoch."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(records + 500, features)).astype(np.float32)
    w = rng.normal(size=features)
    y = (x @ w > 0).astype(np.int64)
    train, validation = directory / "train.npz", directory / "validation.npz"
    np.savez(train, x=x[:records], y=y[:records])
    np.savez(validation, x=x[records:], y=y[records:])
    return train, validation


def job_document(name: str, train: Path, validation: Path, **training: object) -> dict[str, object]:
    return {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"modelDef": "elasticps.backends.keras.zoo.mlp"},
            "data": {"reader": "npz", "training": str(train), "validation": str(validation)},
            "training": {"minibatchSize": 32, "recordsPerTask": 400, "numEpochs": 2, **training},
            "ps": {"replicas": 2},
            "worker": {"replicas": 2},
            "runPolicy": {"backoffLimit": 3},
        },
    }


def write_job(path: Path, document: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(document))
    return path


def _sigint_as_in_a_terminal() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and children keep
    # that: `make test` run from such a script would leave `elasticps run` deaf to the Ctrl-C the
    # tests send. A run started in a terminal has the default handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def elasticps(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [sys.executable, "-m", "elasticps", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_sigint_as_in_a_terminal,
    )


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Polls ``predicate`` until it is true; fails the test naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read_curves(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalar curves (tag -> [(model version, value)]) of the one TensorBoard event file in
    ``folder``, as TensorFlow's own reader reads them."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for step, value in summary_values(folder):
        if not value.HasField("histo"):
            curves.setdefault(value.tag, []).append((step, value.simple_value))
    return curves


def summary_values(folder: Path) -> Iterator[tuple[int, Any]]:
    """Each (model version, summary value) of the one TensorBoard event file in ``folder``, as
    TensorFlow's own reader reads them: scalars and histograms."""
    import tensorflow as tf

    files = sorted(folder.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    for event in tf.compat.v1.train.summary_iterator(str(files[0])):
        for value in event.summary.value:
            yield event.step, value


def process_token(run_dir: Path, replica: str) -> str:
    """The job-identity token a run gave one of its processes (``replica``: e.g. ``apart-worker-0``),
    read from the process's environment: a test that speaks as that member (this machine's owner
    can read it; nobody else can)."""
    pid = int((run_dir / f"{replica}.pid").read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"ELASTICPS_TOKEN="))


def stop_run(process: subprocess.Popen[str]) -> None:
    """Ends an `elasticps run` still running (a failed test): SIGTERM first, so the runner stops the
    replicas it started (they run in sessions of their own and outlive a SIGKILL of the runner)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
