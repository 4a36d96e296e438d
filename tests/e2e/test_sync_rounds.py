"""Sync rounds under backup workers and PS restarts, counted from the shards' own round logs.

Each PS shard appends every commit's minibatch names to ``$ELASTICPS_ROUND_LOG/ps-<k>.jsonl``; a
minibatch keeps its name when it is trained again, so the logs show whether any minibatch was applied
twice and whether two shards ever averaged different minibatches in the same round.
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
from test_local_changes import scale

RECORDS = 6000
MINIBATCH = 32
RECORDS_PER_TASK = 400


def rounds_of(log: Path) -> list[tuple[int, tuple[str, ...]]]:
    """Every round the shard committed, in order (its restores from checkpoints left out)."""
    rows = map(json.loads, log.read_text().splitlines())
    return [(row["round"], tuple(sorted(row["minibatches"]))) for row in rows if "round" in row]


def run_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **training: object) -> tuple[object, Path, Path, Path]:
    train, validation = write_data(tmp_path, records=RECORDS)
    document = job_document("rounds", train, validation, minibatchSize=MINIBATCH, **training)
    document["spec"]["worker"]["replicas"] = 4  # type: ignore[index]
    job = write_job(tmp_path / "job.yaml", document)
    logs = tmp_path / "rounds"
    monkeypatch.setenv("ELASTICPS_ROUND_LOG", str(logs))
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    return process, run_dir, result_file, logs


def test_backup_workers_every_shard_averages_the_same_minibatches_each_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 shards, 4 workers, gradsToWait 2: before rounds, shards drifted apart and summed minibatches twice."""
    process, _, result_file, logs = run_job(tmp_path, monkeypatch, gradsToWait=2)
    _, stderr = process.communicate(timeout=300)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    result = json.loads(result_file.read_text())
    shard0, shard1 = rounds_of(logs / "ps-0.jsonl"), rounds_of(logs / "ps-1.jsonl")
    assert shard0 == shard1  # the same minibatches in every round, on both shards
    assert [r for r, _ in shard0] == list(range(len(shard0)))  # one commit per round, in order
    applied = Counter(name for _, members in shard0 for name in members)
    assert [name for name, n in applied.items() if n > 1] == []  # none twice
    tasks_per_epoch = -(-RECORDS // RECORDS_PER_TASK)
    minibatches = 2 * tasks_per_epoch * -(-RECORDS_PER_TASK // MINIBATCH)
    assert len(applied) == minibatches  # every minibatch of both epochs applied once
    assert all(1 <= len(members) <= 2 for _, members in shard0)  # gradsToWait 2: at most two per round
    assert sum(len(members) == 2 for _, members in shard0) > len(shard0) // 2
    assert result["shard_versions"] == [len(shard0), len(shard0)]
    assert result["epoch_records"] == [RECORDS, RECORDS]
    assert result["metrics"]["accuracy"] > 0.85


def test_kill_ps1_at_a_random_moment_every_shard_rolls_back_to_one_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a restarted shard came back at its own checkpoint while the others and the ledger did not."""
    moment = random.Random().randint(25, 150)
    print(f"killing PS 1 at version >= {moment}")
    process, run_dir, result_file, logs = run_job(tmp_path, monkeypatch, checkpointSteps=20, numEpochs=3)
    client = coordinator(run_dir)
    wait_for(lambda: client.status().model_version >= moment, 180, f"version {moment}")
    os.kill(int((run_dir / "rounds-ps-1.pid").read_text()), signal.SIGKILL)
    _, stderr = process.communicate(timeout=300)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert "rounds-ps-1 exited with code -9: replacing it" in stderr
    assert "every shard and the task ledger rolled back to version" in (run_dir / "rounds-ps-0.log").read_text()
    result = json.loads(result_file.read_text())
    assert len(set(result["shard_versions"])) == 1, result["shard_versions"]
    assert result["epoch_records"] == [RECORDS] * 3  # records reported after the rollback point trained again
    assert result["metrics"]["accuracy"] > 0.85
    # After the rollback both shards applied the same rounds: the tails of their logs agree.
    shard0, shard1 = rounds_of(logs / "ps-0.jsonl"), rounds_of(logs / "ps-1.jsonl")
    last = result["shard_versions"][0]
    tail0 = [r for r in shard0 if r[0] >= last - 20]
    tail1 = [r for r in shard1 if r[0] >= last - 20]
    assert tail0 == tail1 and tail0


def test_sums_made_on_arrival_stay_one_round_on_every_shard_while_workers_die_and_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gradsToWait 0 (every live worker): each shard adds a push into its round's sum as it arrives
    (``ps/arrivals.py``), and a round that cannot count exactly what was summed must abort on
    every shard. Worker kills at random moments (a push cut off half-way, a member gone) and
    scaling 4 -> 5 -> 3 (a worker that pushes after its round opened) do exactly that; the shards
    must still agree on every round's members, each round once, and most pushes are summed."""
    rng = random.Random()
    first, second, third = sorted(rng.sample(range(8, 90), 3))
    print(f"kill worker 1 at version >= {first}, scale to 5 at >= {second}, kill worker 2 and scale to 3 at >= {third}")
    process, run_dir, result_file, logs = run_job(tmp_path, monkeypatch, numEpochs=3)
    client = coordinator(run_dir)
    wait_for(lambda: client.status().model_version >= first, 180, f"version {first}")
    os.kill(int((run_dir / "rounds-worker-1.pid").read_text()), signal.SIGKILL)
    wait_for(lambda: client.status().model_version >= second, 180, f"version {second}")
    assert "asked job rounds" in scale(run_dir, 5)
    wait_for(lambda: client.status().model_version >= third, 180, f"version {third}")
    os.kill(int((run_dir / "rounds-worker-2.pid").read_text()), signal.SIGKILL)
    scale(run_dir, 3)
    _, stderr = process.communicate(timeout=400)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    result = json.loads(result_file.read_text())
    shard0, shard1 = rounds_of(logs / "ps-0.jsonl"), rounds_of(logs / "ps-1.jsonl")
    assert shard0 == shard1  # every round the same members on both shards
    assert [r for r, _ in shard0] == list(range(len(shard0)))  # one commit per round, in order
    assert all(len(set(members)) == len(members) for _, members in shard0)
    assert result["shard_versions"] == [len(shard0), len(shard0)]
    assert result["epoch_records"] == [RECORDS] * 3
    assert result["metrics"]["accuracy"] > 0.85
    summed = [row["summed"] for row in map(json.loads, (logs / "ps-0.jsonl").read_text().splitlines()) if "round" in row]
    counted = sum(len(members) for _, members in shard0)
    print(f"{len(shard0)} rounds, {counted} gradients, {sum(summed)} summed on arrival")
    assert sum(summed) > counted // 2
