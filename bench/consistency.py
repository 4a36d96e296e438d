"""Sync training stays consistent: backup workers and PS restarts on MNIST, counted from the shards' logs.

    .venv/bin/python -m bench.consistency [--kills 5] [--mnist ../shared/data/mnist]

Runs local jobs (`elasticps run`) of MNIST with 2 PS shards and 4 workers, each shard logging every
sync round's minibatches (``ELASTICPS_ROUND_LOG``):

* backup workers (``gradsToWait: 2``), 2 epochs: minibatches applied twice, rounds whose minibatch
  sets differ between the shards, test accuracy;
* ``--kills`` runs of the same job with ``checkpointSteps: 20`` in which PS 1 is killed with SIGKILL at a random
  model version: each run's final shard versions, records trained per epoch, accuracy, and the
  version every shard and the ledger rolled back to.

Writes ``docs/consistency.md`` and ``bench/results/consistency.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token
from elasticps.tools import round_log

REPO = Path(__file__).resolve().parents[1]


def job(name: str, mnist: Path, **training: object) -> dict[str, Any]:
    return {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"modelDef": "elasticps.backends.keras.zoo.mnist_cnn"},
            "data": {"reader": "idx", "training": str(mnist / "train"), "validation": str(mnist / "t10k")},
            "training": {
                "learningRate": 0.05,
                "minibatchSize": 64,
                "numEpochs": 2,
                "recordsPerTask": 2048,
                **training,
            },
            "ps": {"replicas": 2},
            "worker": {"replicas": 4},
        },
    }


def start(work: Path, document: dict[str, Any]) -> tuple[subprocess.Popen[str], Path, Path, Path]:
    shutil.rmtree(work, ignore_errors=True)  # a run appends to its round logs: start from nothing
    work.mkdir(parents=True)
    (work / "job.yaml").write_text(yaml.safe_dump(document))
    run_dir, result, logs = work / "run", work / "result.json", work / "rounds"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "ELASTICPS_ROUND_LOG": str(logs)}
    command = [sys.executable, "-m", "elasticps", "run", "job.yaml", "--run_dir", "run", "--result_file", "result.json"]
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return process, run_dir, result, logs


def audit(logs: Path) -> dict[str, int]:
    """Rounds per shard, rounds whose sets differ between the shards, minibatches applied twice."""
    shards = sorted(logs.glob("ps-*.jsonl"))
    rounds = [  # the rounds in each shard's model: a restore from a checkpoint takes later ones out
        {(row["round"], tuple(sorted(row["minibatches"]))) for row in round_log.in_model(round_log.read(p))}
        for p in shards
    ]
    by_round = [{r: m for r, m in shard} for shard in rounds]
    common = set.intersection(*(set(d) for d in by_round))
    differ = sum(1 for r in common if len({d[r] for d in by_round}) > 1)
    applied = Counter(name for _, members in rounds[0] for name in members)
    return {
        "rounds": len(by_round[0]),
        "rounds_differing": differ,
        "applied_twice": sum(1 for n in applied.values() if n > 1),
        "minibatches": len(applied),
    }


def backup_workers(work: Path, mnist: Path) -> dict[str, Any]:
    process, _, result_file, logs = start(work, job("backup", mnist, gradsToWait=2))
    _, stderr = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the backup-workers job failed:\n{stderr[-2000:]}")
    result = json.loads(result_file.read_text())
    return {**audit(logs), **{k: result[k] for k in ("shard_versions", "epoch_records", "metrics", "elapsed_s")}}


def kill_run(work: Path, mnist: Path, moment: int) -> dict[str, Any]:
    process, run_dir, result_file, logs = start(work, job("restart", mnist, gradsToWait=2, checkpointSteps=20))
    while not (run_dir / "ps-0.port").exists():
        time.sleep(0.2)
    client = CoordinatorClient(f"127.0.0.1:{int((run_dir / 'ps-0.port').read_text())}", worker="bench", token=observer_token(run_dir))
    while process.poll() is None:
        try:
            if client.status().model_version >= moment:
                break
        except Exception:
            pass
        time.sleep(0.1)
    if process.poll() is not None:
        raise SystemExit(f"the job ended before version {moment}: pick an earlier moment")
    os.kill(int((run_dir / "restart-ps-1.pid").read_text()), signal.SIGKILL)
    _, stderr = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the job with PS 1 killed failed:\n{stderr[-2000:]}")
    result = json.loads(result_file.read_text())
    rolled = [line for line in (run_dir / "restart-ps-0.log").read_text().splitlines() if "rolled back to version" in line]
    return {
        "killed_at": moment,
        "rolled_back_to": rolled[-1].split("rolled back to version ")[1].split()[0] if rolled else None,
        **{k: result[k] for k in ("shard_versions", "epoch_records", "metrics", "restarts", "elapsed_s")},
    }


def report(backup: dict[str, Any], kills: list[dict[str, Any]]) -> str:
    lines = [
        "# Sync training stays consistent",
        "",
        "Measured by `python -m bench.consistency` (local runner, MNIST, 2 PS shards, 4 workers, minibatch 64,",
        "2 epochs, learning rate 0.05). Each shard logs every sync round's minibatches; the figures are",
        "counted from those logs and from the job's result.",
        "",
        "## Backup workers (`gradsToWait: 2`)",
        "",
        "| rounds | rounds whose minibatch sets differ between shards | minibatches applied twice | minibatches | shard versions | records per epoch | accuracy |",
        "|---|---|---|---|---|---|---|",
        f"| {backup['rounds']} | {backup['rounds_differing']} | {backup['applied_twice']} | {backup['minibatches']} "
        f"| {backup['shard_versions']} | {backup['epoch_records']} | {backup['metrics']['accuracy']:.4f} |",
        "",
        "## PS 1 killed (SIGKILL) at a random version, `gradsToWait: 2`, `checkpointSteps: 20`",
        "",
        "| run | killed at version | every shard and the ledger rolled back to | final shard versions | records per epoch | accuracy | restarts |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, run in enumerate(kills, 1):
        lines.append(
            f"| {i} | {run['killed_at']} | {run['rolled_back_to']} | {run['shard_versions']} | {run['epoch_records']} "
            f"| {run['metrics']['accuracy']:.4f} | {run['restarts']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--mnist", type=Path, default=REPO.parent / "shared" / "data" / "mnist")
    parser.add_argument("--work", type=Path, default=Path("/tmp/elasticps-consistency"))
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print("backup workers ...", flush=True)
    backup = backup_workers(args.work / "backup", args.mnist)
    print(backup, flush=True)
    kills = []
    for i in range(args.kills):
        moment = rng.randint(30, 850)  # 2 gradients a round: about 940 rounds in 2 epochs
        print(f"run {i + 1}: killing PS 1 at version {moment} ...", flush=True)
        kills.append(kill_run(args.work / f"kill-{i}", args.mnist, moment))
        print(kills[-1], flush=True)
    (REPO / "bench" / "results").mkdir(exist_ok=True)
    (REPO / "bench" / "results" / "consistency.json").write_text(json.dumps({"backup": backup, "kills": kills}, indent=1))
    (REPO / "docs" / "consistency.md").write_text(report(backup, kills))
    print(report(backup, kills))


if __name__ == "__main__":
    main()
