"""``bench.peer_runs`` on a real small job: ``elasticps run`` as the benchmark starts it, its
coordinator polled, every process's CPU counted (no wall-clock figure is asserted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from bench import peer_jobs
from bench.peer_runs import run_elasticps

pytestmark = pytest.mark.slow

RECORDS = 3000


def write_data(directory: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(RECORDS + 500, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) > 0).astype(np.int64)
    train, validation = directory / "train.npz", directory / "validation.npz"
    np.savez(train, x=x[:RECORDS], y=y[:RECORDS])
    np.savez(validation, x=x[RECORDS:], y=y[RECORDS:])
    return train, validation


def test_an_async_run_gives_every_figure_from_its_own_answers(tmp_path: Path) -> None:
    train, validation = write_data(tmp_path)
    document = {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "peer-runs"},
        "spec": {
            "model": {"modelDef": "elasticps.backends.keras.zoo.mlp"},
            "data": {"reader": "npz", "training": str(train), "validation": str(validation)},
            "training": {"minibatchSize": 32, "recordsPerTask": 300, "numEpochs": 2, "evaluationSteps": 20},
            "ps": {"replicas": 2},
            "worker": {"replicas": 3},
        },
    }
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(peer_jobs.derive(document, peer_jobs.ASYNC_LR)))
    work = tmp_path / "work"
    work.mkdir()
    run = run_elasticps(job, work, num_epochs=2)
    assert run["examples"] == 2 * RECORDS
    # An epoch ends at the first answer at or past its records; a fast job may finish more than one
    # task between two answers, so epoch 1 may count a task or two of epoch 2's.
    first, second = [e["records"] for e in run["epochs"]]
    assert first >= RECORDS and first + second == 2 * RECORDS and second > 0
    assert 0 < run["first_step_s"] < run["epochs"][0]["ended_s"] < run["epochs"][1]["ended_s"] <= run["wall_s"]
    assert run["wall_s"] <= run["exited_s"]
    assert run["examples_per_s_epoch2"] > 0
    assert run["test_accuracy"] > 0.8
    # Two workers each import TensorFlow: more CPU than the runner alone could spend, so the replicas'
    # CPU (reaped by the runner, which the benchmark reaps) is counted.
    assert run["cpu_s"] > 2.0
    assert run["cpu_s_per_1000_examples"] == pytest.approx(run["cpu_s"] / (2 * RECORDS / 1000))
    assert run["restarts"] == 0 and run["gradients_rejected"] == 0
    assert (work / "run" / "ps-0.port").exists() and not any((work / "run").glob("*ps-1*"))  # 1 PS, as derived
