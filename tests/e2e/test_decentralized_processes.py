"""Decentralized training across real processes: ``elasticps coordinator`` and four ``elasticps
worker --strategy decentralized`` on 127.0.0.1, models between the workers over their Peer
services, tasks from the coordinator (the command lines the local runner and the operator will
render; and once through `elasticps run`).

Counted: every record of every epoch reported trained once (the coordinator's ledger), every
worker's iterations and what its neighbours' models contributed (its log), the job's accuracy, and
the lowest and highest iteration the coordinator heard of.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.ports import free_ports
from local_jobs import elasticps, job_document, wait_for, write_data, write_job

RECORDS = 6000
WORKERS = 4

pytestmark = pytest.mark.slow


def _common(train: Path, validation: Path) -> list[str]:
    return ["--data_reader=npz", f"--training_data={train}", f"--validation_data={validation}",
            "--minibatch_size=32", "--records_per_task=300", "--num_epochs=2", "--learning_rate=0.05"]


def run_job(tmp_path: Path, hop: list[str], slowdown: str = "", kill_at: int = 0) -> tuple[list[str], dict[str, object]]:
    """``kill_at``: once the coordinator heard of that iteration, worker 2 is killed (SIGKILL) and a
    new process started in its place (what a restart policy does), which must rejoin."""
    train, validation = write_data(tmp_path, records=RECORDS)
    port_file = tmp_path / "coordinator.port"
    training = _common(train, validation) + ([f"--slowdown={slowdown}"] if slowdown else [])
    if kill_at:
        training.append("--task_timeout_seconds=5")  # the dead worker's task goes back soon
    coordinator = elasticps("coordinator", "--host=127.0.0.1", "--port=0", f"--port_file={port_file}", *training,
                            cwd=tmp_path)
    workers: list[subprocess.Popen[str]] = []
    try:
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60, "the coordinator's port")
        address = f"127.0.0.1:{port_file.read_text().strip()}"
        peers = ",".join(f"127.0.0.1:{p}" for p in free_ports(WORKERS))

        def start(i: int) -> subprocess.Popen[str]:
            return elasticps(
                "worker", f"--worker_id={i}", "--strategy=decentralized", f"--coordinator_addr={address}",
                f"--peer_addrs={peers}", "--model_def=elasticps.backends.keras.zoo.mlp", *training, *hop, cwd=tmp_path)

        workers.extend(start(i) for i in range(WORKERS))
        status = CoordinatorClient(address, worker="test")
        spans: list[tuple[int, int]] = []
        killed: list[subprocess.Popen[str]] = []
        lowest_at_kill: list[int] = []  # the slowest worker's iteration the coordinator had heard of

        def finished() -> bool:
            got = status.status()
            if got.max_iteration >= 0:
                spans.append((got.min_iteration, got.max_iteration))
            if kill_at and not killed and got.max_iteration >= kill_at:
                workers[2].kill()
                killed.append(workers[2])
                lowest_at_kill.append(got.min_iteration)
                workers[2].wait()
                workers[2] = start(2)
            return all(w.poll() is not None for w in workers)

        wait_for(finished, 400, "the workers to finish")
        final = status.status()
        status.close()
        logs = []
        for i, w in enumerate(workers):
            _, err = w.communicate(timeout=30)
            assert w.returncode == 0, f"worker {i}:\n{err[-3000:]}"
            logs.append(err)
        result = {"records": list(final.epoch_records), "metrics": dict(final.metrics), "finished": final.finished,
                  "spans": spans, "killed": len(killed),
                  "lowest_at_kill": lowest_at_kill[0] if lowest_at_kill else -1}
        return logs, result
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        coordinator.terminate()
        coordinator.communicate(timeout=30)


def _hop_counters(log: str) -> dict[str, float]:
    found = re.search(r"decentralized: HopCounters\((.*?)\)", log)
    assert found, log[-2000:]
    return {k: float(v) for k, v in (part.split("=") for part in found.group(1).split(", "))}


def test_decentralized_ring_trains_every_record_once_and_learns(tmp_path: Path) -> None:
    logs, result = run_job(tmp_path, ["--graph=ring"])
    assert result["finished"] and result["records"] == [RECORDS, RECORDS]
    assert result["metrics"]["accuracy"] > 0.85  # type: ignore[index]
    counters = [_hop_counters(log) for log in logs]
    minibatches = sum(c["iterations"] for c in counters)
    assert minibatches >= 2 * -(-RECORDS // 32)  # at least one iteration per minibatch trained (idle ones too)
    for c in counters:
        assert c["jumps"] == 0 and c["reduced"] > 0  # the standard rule: nobody skips
    # The job status carried the workers' iterations (from heartbeats, seconds apart: no gap bound here;
    # the bound is the simulation's and the transport tests' to check).
    spans = result["spans"]
    assert spans and all(0 <= low <= high for low, high in spans)  # type: ignore[union-attr]
    assert max(high for _, high in spans) > 0  # type: ignore[union-attr]


def test_backup_workers_and_skipping_under_a_straggler(tmp_path: Path) -> None:
    logs, result = run_job(tmp_path, ["--graph=complete", "--backup_workers=1", "--max_iteration_gap=6",
                                      "--skip_max_jump=4"], slowdown="0:4")
    assert result["finished"] and result["records"] == [RECORDS, RECORDS]
    assert result["metrics"]["accuracy"] > 0.8  # type: ignore[index]
    straggler = _hop_counters(logs[0])
    assert straggler["jumps"] > 0 and straggler["skipped"] >= straggler["jumps"]
    assert "slowed_s=0.0)" not in logs[0]
    # The others did not wait for it: each trained more minibatches than the straggler.
    steps = [int(re.search(r"done: Counters\(steps=(\d+)", log).group(1)) for log in logs]  # type: ignore[union-attr]
    assert all(steps[0] < s for s in steps[1:]), steps


def test_elasticps_run_trains_a_decentralized_job_and_refuses_to_scale_it(tmp_path: Path) -> None:
    """The same job from one YAML through the local runner: a coordinator process, four workers
    on a ring, the mode on the first line, and `elasticps scale` refused with the reason."""
    train, validation = write_data(tmp_path, records=RECORDS)
    document = job_document("hop", train, validation, learningRate=0.05, recordsPerTask=300)
    spec = document["spec"]
    assert isinstance(spec, dict)
    spec.pop("ps")
    spec["strategy"] = "decentralized"
    spec["decentralized"] = {"graph": "ring", "maxIterationGap": 2}
    spec["worker"] = {"replicas": WORKERS}
    job = write_job(tmp_path / "job.yaml", document)
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    wait_for(lambda: (run_dir / "coordinator.port").exists() or process.poll() is not None, 120, "the coordinator")
    scale = subprocess.run([sys.executable, "-m", "elasticps", "scale", str(run_dir), "--workers=6"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert scale.returncode == 0, scale.stderr  # the request is written; the run refuses it
    _, err = process.communicate(timeout=400)
    assert process.returncode == 0, err[-3000:]
    assert "a coordinator (ring graph) + 4 workers, Decentralized" in err
    assert "ignored a scale request: a decentralized job's graph is fixed" in err
    result = json.loads(result_file.read_text())
    assert result["succeeded"] and result["epoch_records"] == [RECORDS, RECORDS]
    assert result["metrics"]["accuracy"] > 0.85
    assert result["model_version"] > 0  # the highest iteration a worker reached



def test_a_worker_killed_mid_training_is_restarted_and_rejoins(tmp_path: Path) -> None:
    logs, result = run_job(tmp_path, ["--graph=ring"], kill_at=15)
    assert result["killed"] == 1
    assert result["finished"] and result["records"] == [RECORDS, RECORDS]  # its task was trained again
    assert result["metrics"]["accuracy"] > 0.85  # type: ignore[index]
    replacement = _hop_counters(logs[2])
    # It goes on where worker 2 stopped: at least where the slowest worker stood at the kill (worker
    # 2 itself may have been that one, behind the 15 the fastest had reached).
    assert replacement["rejoined_at"] >= max(1, int(result["lowest_at_kill"])), (replacement, result["lowest_at_kill"])  # type: ignore[call-overload]
    assert "rejoins at iteration" in logs[2]
    for log in logs:
        assert _hop_counters(log)["iterations"] > 0
