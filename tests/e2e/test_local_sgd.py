"""LocalSGD end to end: `elasticps run` with localSGDSteps, counted from the shards' round logs.

A round's log line names the periods it averaged (one name per worker period: the worker's K local
steps, or fewer at the end of a task). Every period of every task must be averaged once, on every
shard alike, with the number of rounds a period of K steps makes, and the job must train.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections import Counter
from pathlib import Path

import pytest

from local_jobs import elasticps, job_document, wait_for, write_data, write_job
from test_faults import coordinator

RECORDS = 6000
MINIBATCH = 32
RECORDS_PER_TASK = 400  # 13 minibatches: 12 of 32 and one of 16
TASKS_PER_EPOCH = RECORDS // RECORDS_PER_TASK
EPOCHS = 2
K = 4


def rounds_of(log: Path) -> list[tuple[int, tuple[str, ...]]]:
    return [(row["round"], tuple(sorted(row["minibatches"]))) for row in map(json.loads, log.read_text().splitlines())]


def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, **training: object) -> tuple[object, Path, Path, Path]:
    train, validation = write_data(tmp_path, records=RECORDS)
    document = job_document("local", train, validation, minibatchSize=MINIBATCH, numEpochs=EPOCHS, **training)
    document["spec"]["worker"]["replicas"] = workers  # type: ignore[index]
    job = write_job(tmp_path / "job.yaml", document)
    logs = tmp_path / "rounds"
    monkeypatch.setenv("ELASTICPS_ROUND_LOG", str(logs))
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    return process, run_dir, result_file, logs


def finished(
    process: object, result_file: Path, logs: Path, label: str = f"LocalSGD{K}"
) -> tuple[dict[str, object], list[tuple[int, tuple[str, ...]]], str]:
    """The run's result, its rounds (the same on both shards) and its stderr."""
    stdout, stderr = process.communicate(timeout=420)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert f"{label}, model" in stderr  # the job line names the mode
    shard0, shard1 = rounds_of(logs / "ps-0.jsonl"), rounds_of(logs / "ps-1.jsonl")
    assert shard0 == shard1  # the same periods in every round, on both shards
    return json.loads(result_file.read_text()), shard0, stderr


def test_localsgd_averages_every_period_of_every_task_once_on_every_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    process, _, result_file, logs = start(tmp_path, monkeypatch, workers=4, localSGDSteps=K)
    result, rounds, _ = finished(process, result_file, logs)
    assert [r for r, _ in rounds] == list(range(len(rounds)))  # one commit per round, in order
    periods = Counter(name for _, members in rounds for name in members)
    assert [name for name, n in periods.items() if n > 1] == []  # none twice
    # Each task's 13 minibatches make 4 periods: 4+4+4 and the task's short last one, or, for a
    # worker's first task, its first period of one step (the coordinator's K comes with its
    # answer) and 4+4+4.
    assert len(periods) == 4 * TASKS_PER_EPOCH * EPOCHS
    assert all(1 <= len(members) <= 4 for _, members in rounds)
    assert result["epoch_records"] == [RECORDS] * EPOCHS
    assert result["shard_versions"] == [len(rounds), len(rounds)]
    assert result["metrics"]["accuracy"] > 0.85  # type: ignore[index]


def test_kill_a_localsgd_worker_at_a_random_moment_the_others_rounds_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed mid-period never joins its round: the round must not wait for it past its
    task's timeout, and its task's records are trained again by whoever takes the task."""
    moment = random.Random().randint(5, 40)
    print(f"killing worker 1 at version >= {moment}")
    process, run_dir, result_file, logs = start(
        tmp_path, monkeypatch, workers=3, localSGDSteps=K, taskTimeoutSeconds=10
    )
    client = coordinator(run_dir)
    wait_for(lambda: client.status().model_version >= moment, 240, f"version {moment}")
    os.kill(int((run_dir / "local-worker-1.pid").read_text()), signal.SIGKILL)
    result, rounds, stderr = finished(process, result_file, logs)
    assert "local-worker-1 exited with code -9" in stderr
    periods = Counter(name for _, members in rounds for name in members)
    assert [name for name, n in periods.items() if n > 1] == []
    assert result["epoch_records"] == [RECORDS] * EPOCHS  # nothing lost, nothing counted twice
    assert result["metrics"]["accuracy"] > 0.85  # type: ignore[index]


def test_adaptive_localsgd_shortens_its_period_as_the_training_loss_falls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    process, _, result_file, logs = start(tmp_path, monkeypatch, workers=2, localSGDSteps=8, adaptiveLocalSGD=True)
    result, rounds, _ = finished(process, result_file, logs, label="LocalSGDAdaptive")
    periods = Counter(name for _, members in rounds for name in members)
    assert [name for name, n in periods.items() if n > 1] == []
    assert result["epoch_records"] == [RECORDS] * EPOCHS
    assert result["metrics"]["accuracy"] > 0.85  # type: ignore[index]
    # K0 = 8 at the first round's loss; the loss fell, so K = int(8 sqrt(F / F0)) fell with it.
    assert 1 <= result["local_steps"] < 8  # type: ignore[operator]
    # Fewer rounds than a period of one step would make, more than periods of 8 would.
    minibatches = TASKS_PER_EPOCH * EPOCHS * 13
    assert minibatches / 8 < len(periods) < minibatches
