"""Embedding tables on real PS processes (issue 17): DeepFM through `elasticps run` with 2 PS and
2 workers on a small Criteo-format file the test writes, and the same job with a PS killed (-9).

Counted: the rows each shard holds at the end (every distinct id of the training data, each on
the shard ``id mod 2``, none twice, none else: rows are made only for the ids training pulled;
evaluation makes none), the rows a
restarted shard took back from its checkpoint (exactly the checkpoint's), the AUC the job reports."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from elasticps.data.criteo import CriteoReader
from elasticps.ps import checkpoint
from local_jobs import elasticps, wait_for, write_job
from test_faults import coordinator

pytestmark = pytest.mark.slow

RECORDS, TRAIN = 3000, 2400
TABLES = ("deepfm_linear", "deepfm_factors")


def write_criteo(path: Path, seed: int = 0) -> Path:
    """Criteo's format (label, 13 counts, 26 hex categoricals); a click follows field C1: its first
    6 values of 20 click 85% of the time, the others 10%."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(RECORDS):
        c1 = int(rng.integers(0, 20))
        label = int(rng.random() < (0.85 if c1 < 6 else 0.1))
        counts = ["" if rng.random() < 0.1 else str(int(rng.integers(0, 1000))) for _ in range(13)]
        cats = [format(c1, "08x")] + [format(int(rng.integers(0, 300)), "08x") for _ in range(25)]
        lines.append("\t".join([str(label), *counts, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


def job(tmp_path: Path, name: str, output: str = "", **training: object) -> Path:
    data = write_criteo(tmp_path / "criteo.txt")
    document: dict[str, object] = {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"modelDef": "elasticps.backends.keras.zoo.deepfm", "params": {"dim": 4, "hidden": [16]}},
            "data": {"reader": "criteo", "training": f"{data}[0:{TRAIN}]", "validation": f"{data}[{TRAIN}:]"},
            "training": {"minibatchSize": 64, "recordsPerTask": 600, "numEpochs": 2, "learningRate": 0.02,
                         **training},
            "ps": {"replicas": 2},
            "worker": {"replicas": 2},
            "runPolicy": {"backoffLimit": 3},
        },
    }
    if output:
        document["spec"]["output"] = output  # type: ignore[index]
    return write_job(tmp_path / "job.yaml", document)


def distinct_ids(tmp_path: Path) -> np.ndarray:
    """The distinct ids of the training records (evaluation pulls make no row)."""
    reader = CriteoReader(str(tmp_path / "criteo.txt"))
    ids, _ = reader.read(0, TRAIN)
    return np.unique(ids)


def rows_at_stop(log: str) -> dict[str, int]:
    found = re.findall(r"stops at version \d+, embedding rows held: (\{.*?\}), (\d+) bytes", log)
    assert found, log[-3000:]
    return dict(ast.literal_eval(found[-1][0]))


def run(tmp_path: Path, job_file: Path) -> tuple[object, Path, Path]:
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job_file), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    return process, run_dir, result_file


def assert_rows_are_the_datas_ids(tmp_path: Path, run_dir: Path, name: str) -> None:
    ids = distinct_ids(tmp_path)
    for shard in (0, 1):
        held = rows_at_stop((run_dir / f"{name}-ps-{shard}.log").read_text())
        mine = int(np.sum(np.mod(ids, 2) == shard))
        assert held == {table: mine for table in TABLES}, (shard, held, mine)


def test_deepfm_on_two_ps_holds_exactly_the_rows_of_its_ids_learns_and_exports_them(tmp_path: Path) -> None:
    process, run_dir, result_file = run(tmp_path, job(tmp_path, "ctr", output=str(tmp_path / "model")))
    _, stderr = process.communicate(timeout=600)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [TRAIN, TRAIN]
    assert result["metrics"]["auc"] > 0.8, result["metrics"]
    assert_rows_are_the_datas_ids(tmp_path, run_dir, "ctr")
    # The export holds every row the shards held, and predicts as the job's last evaluation did.
    import keras

    from elasticps.backends.keras.layers import Embedding
    from elasticps.backends.keras.zoo import deepfm

    model = keras.models.load_model(tmp_path / "model" / "model.keras")
    held = {layer.spec.name: layer.held for layer in model.layers if isinstance(layer, Embedding)}
    assert held == {table: distinct_ids(tmp_path).size for table in TABLES}
    reader = CriteoReader(str(tmp_path / "criteo.txt"))
    x, y = reader.read(TRAIN, RECORDS)
    auc = deepfm.auc(y, model.predict(x, verbose=0))
    assert abs(auc - result["metrics"]["auc"]) < 1e-4, (auc, result["metrics"])


def test_a_ps_killed_mid_job_restores_every_row_of_its_checkpoint(tmp_path: Path) -> None:
    process, run_dir, result_file = run(tmp_path, job(tmp_path, "ctr-kill", checkpointSteps=10, keepCheckpointMax=100))
    client = coordinator(run_dir)
    wait_for(lambda: client.status().model_version >= 25, 300, "a few checkpoints")
    os.kill(int((run_dir / "ctr-kill-ps-1.pid").read_text()), signal.SIGKILL)
    _, stderr = process.communicate(timeout=600)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert "ctr-kill-ps-1 exited with code -9: replacing it" in stderr
    log = (run_dir / "ctr-kill-ps-1.log").read_text()
    resumed = re.search(r"resumes at version (\d+), embedding rows held: (\{.*?\})", log)
    assert resumed, log[-3000:]
    version, held = int(resumed[1]), ast.literal_eval(resumed[2])
    saved = checkpoint.load(checkpoint.path_of(run_dir / "checkpoints" / "ps-1", version)).arrays
    for table in TABLES:
        assert held[table] == len(saved[f"emb/{table}/ids"]) > 0  # every row of the checkpoint, back
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [TRAIN, TRAIN]
    assert len(set(result["shard_versions"])) == 1, result["shard_versions"]
    # Learning goes on after the restore (chance is 0.5). Rolled back at a moment that varies, the
    # job ends at AUC 0.80-0.84 (eight runs alone on 2 cores, before and after issue 32) and 0.798
    # once in a loaded full suite: 0.8 is inside its spread, 0.75 clear of it.
    assert result["metrics"]["auc"] > 0.75, result["metrics"]
    assert_rows_are_the_datas_ids(tmp_path, run_dir, "ctr-kill")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tables_keep_every_row_once_while_a_worker_joins_and_another_is_killed(tmp_path: Path, mode: str) -> None:
    """Workers change mid-job: a third joins (`elasticps scale`), declares the tables and trains;
    then worker 1 is killed (-9) mid-minibatch and replaced. Every record is trained once per
    epoch, the shards end at one version (sync), and each shard holds exactly its ids of the data:
    a worker that died after pulling rows, or joined late, made no row the data does not name."""
    # Async makes a version per minibatch, sync one per round of all workers: enough epochs that
    # the job is still training once the joining worker has started TensorFlow (under a loaded CI,
    # 12 sync epochs ended before worker 2 trained a step).
    epochs, then = (40, 20) if mode == "sync" else (40, 150)
    training: dict[str, object] = {"numEpochs": epochs}
    if mode == "async":
        training["useAsync"] = True
    name = f"ctr-{mode}-change"
    process, run_dir, result_file = run(tmp_path, job(tmp_path, name, **training))
    try:
        client = coordinator(run_dir)
        wait_for(lambda: process.poll() is not None or client.status().model_version >= 10, 300, "training to start")  # type: ignore[attr-defined]
        done = subprocess.run([sys.executable, "-m", "elasticps", "scale", str(run_dir), "--workers", "3"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        joined = run_dir / f"{name}-worker-2.log"
        # The run's end first in each wait: once it ended, its coordinator answers nothing (refused).
        # Worker 2 counts once the coordinator has heard from it: TensorFlow started, it trains beside the others.
        wait_for(lambda: process.poll() is not None or client.status().live_workers >= 3, 180, "worker 2 heard from")  # type: ignore[attr-defined]
        at = client.status().model_version
        wait_for(lambda: process.poll() is not None or client.status().model_version >= at + then, 120, "more versions")  # type: ignore[attr-defined]
        assert process.poll() is None, "the job ended before the kill"  # type: ignore[attr-defined]
        os.kill(int((run_dir / f"{name}-worker-1.pid").read_text()), signal.SIGKILL)
        _, stderr = process.communicate(timeout=600)  # type: ignore[attr-defined]
    finally:
        if process.poll() is None:  # type: ignore[attr-defined]
            process.terminate()  # type: ignore[attr-defined]
            process.communicate(timeout=30)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert "workers: 2 -> 3" in stderr and f"{name}-worker-1 exited with code -9: replacing it" in stderr
    steps = re.search(r"worker-2 done: Counters\(steps=(\d+)", joined.read_text())
    assert steps and int(steps[1]) > 0, joined.read_text()[-3000:]
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [TRAIN] * epochs  # every record once per epoch, the killed worker's task again
    if mode == "sync":
        assert len(set(result["shard_versions"])) == 1, result["shard_versions"]
    assert result["metrics"]["auc"] > 0.7, result["metrics"]  # learned (chance: 0.5; 40 epochs of 2,400 records overfit)
    assert_rows_are_the_datas_ids(tmp_path, run_dir, name)


CAP = 2500  # rows of a table a shard may hold: more than a round asks of it (~1,600), fewer than the data's ids


def test_capped_tables_hold_at_most_their_cap_learn_and_export_the_rows_held_at_the_end(tmp_path: Path) -> None:
    """Issue 38: ``embeddingPolicy: maxRows=...`` on every table. Each shard ends holding at most
    the cap of each table (rows evicted on the way, counted in the result), the job still learns,
    and the export holds exactly the rows the shards held at the end (an id without one looks up its
    first values, as on the PS) and predicts about as the job's last evaluation did."""
    name = "ctr-capped"
    process, run_dir, result_file = run(tmp_path, job(tmp_path, name, output=str(tmp_path / "model"),
                                                      embeddingPolicy=f"maxRows={CAP}"))  # fmt: skip
    _, stderr = process.communicate(timeout=600)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [TRAIN, TRAIN]
    held = [rows_at_stop((run_dir / f"{name}-ps-{shard}.log").read_text()) for shard in (0, 1)]
    ids = distinct_ids(tmp_path)
    for shard in (0, 1):
        mine = int(np.sum(np.mod(ids, 2) == shard))
        assert mine > CAP  # the data has more ids than the cap
        assert held[shard] == {table: min(mine, held[shard][table]) for table in TABLES}
        assert all(count <= CAP for count in held[shard].values()), held
    assert result["shard_embedding_rows"] == [sum(h.values()) for h in held]
    made, evicted = result["shard_embedding_rows_made"], result["shard_embedding_rows_evicted"]
    assert all(e > 0 for e in evicted) and [m - e for m, e in zip(made, evicted)] == result["shard_embedding_rows"]
    assert result["metrics"]["auc"] > 0.75, result["metrics"]  # learned: the click follows the hot field C1
    import keras

    from elasticps.backends.keras.layers import Embedding
    from elasticps.backends.keras.zoo import deepfm

    model = keras.models.load_model(tmp_path / "model" / "model.keras")
    exported = {layer.spec.name: layer.held for layer in model.layers if isinstance(layer, Embedding)}
    assert exported == {table: held[0][table] + held[1][table] for table in TABLES}
    reader = CriteoReader(str(tmp_path / "criteo.txt"))
    x, y = reader.read(TRAIN, RECORDS)
    auc = deepfm.auc(y, model.predict(x, verbose=0))
    # As uncapped: ids evicted at the end read their first values in the export as on the PS (the
    # export's first values were once other in a graph, model.predict's: 0.0003-0.0035 apart).
    assert abs(auc - result["metrics"]["auc"]) < 1e-4, (auc, result["metrics"])


def test_a_ps_killed_mid_job_under_a_row_policy_resumes_its_rows_with_their_last_use_and_keeps_the_cap(
    tmp_path: Path,
) -> None:
    """Issue 38: with ``embeddingPolicy`` (a cap and a TTL) a shard killed -9 comes back with
    exactly its checkpoint's rows, each with its last use and the table's clock (saved beside the
    rows), and goes on evicting under the cap to the end."""
    name = "ctr-policy-kill"
    process, run_dir, result_file = run(tmp_path, job(tmp_path, name, checkpointSteps=10, keepCheckpointMax=100,
                                                      embeddingPolicy=f"maxRows={CAP},ttl=30"))  # fmt: skip
    client = coordinator(run_dir)
    wait_for(lambda: client.status().model_version >= 25, 300, "a few checkpoints")
    os.kill(int((run_dir / f"{name}-ps-1.pid").read_text()), signal.SIGKILL)
    _, stderr = process.communicate(timeout=600)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert f"{name}-ps-1 exited with code -9: replacing it" in stderr
    log = (run_dir / f"{name}-ps-1.log").read_text()
    resumed = re.search(r"resumes at version (\d+), embedding rows held: (\{.*?\})", log)
    assert resumed, log[-3000:]
    version, held = int(resumed[1]), ast.literal_eval(resumed[2])
    saved = checkpoint.load(checkpoint.path_of(run_dir / "checkpoints" / "ps-1", version)).arrays
    for table in TABLES:
        ids, updated, clock = saved[f"emb/{table}/ids"], saved[f"emb/{table}/updated"], saved[f"emb/{table}/clock"]
        assert held[table] == len(ids) > 0 and (updated <= clock[0]).all() and clock[0] > 0
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [TRAIN, TRAIN]
    assert len(set(result["shard_versions"])) == 1, result["shard_versions"]
    final = rows_at_stop(log)
    assert all(count <= CAP for count in final.values()), final
    assert result["metrics"]["auc"] > 0.7, result["metrics"]


def test_a_ps_killed_at_three_random_moments_under_incremental_checkpoints_resumes_every_row_of_its_version(
    tmp_path: Path,
) -> None:
    """Issue 38: ``checkpointFullEvery: 3`` (a whole checkpoint, then two deltas of it) with a capped,
    TTL'd table; PS 1 is killed -9 three times at random versions. Each time it comes back at a
    version with exactly the rows that version's checkpoint holds once made whole (base + delta),
    the job ends Succeeded at one version on both shards with every record trained once per epoch."""
    name = "ctr-incremental"
    rng = np.random.default_rng()
    moments = sorted(int(v) for v in rng.choice(np.arange(12, 60), size=3, replace=False))
    print(f"\nkills of PS 1 at versions >= {moments}")
    process, run_dir, result_file = run(tmp_path, job(tmp_path, name, checkpointSteps=4, keepCheckpointMax=100,
                                                      checkpointFullEvery=3, numEpochs=4,
                                                      embeddingPolicy=f"maxRows={CAP},ttl=30"))  # fmt: skip
    client = coordinator(run_dir)

    def version() -> int:
        try:
            return int(client.status().model_version)
        except grpc.RpcError:  # PS 0 busy rolling every shard back: asked again
            return -1

    try:
        for at in moments:
            wait_for(lambda: version() >= at or process.poll() is not None, 300, f"version {at}")  # type: ignore[attr-defined]
            assert process.poll() is None, "the job ended before the kills"  # type: ignore[attr-defined]
            os.kill(int((run_dir / f"{name}-ps-1.pid").read_text()), signal.SIGKILL)
            wait_for(lambda: "resumes at version" in (run_dir / f"{name}-ps-1.log").read_text().rsplit("--- start", 1)[-1],
                     120, "PS 1 to resume")  # fmt: skip
        _, stderr = process.communicate(timeout=600)  # type: ignore[attr-defined]
    finally:
        if process.poll() is None:  # type: ignore[attr-defined]
            process.terminate()  # type: ignore[attr-defined]
            process.communicate(timeout=30)  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert stderr.count(f"{name}-ps-1 exited with code -9: replacing it") == 3
    from elasticps.ps.checkpointing import Checkpointing, base_of

    folder = run_dir / "checkpoints" / "ps-1"
    deltas = [v for v in (checkpoint.version_of(p) for p in checkpoint.list_checkpoints(folder))
              if v is not None and base_of(checkpoint.load(checkpoint.path_of(folder, v)).meta) is not None]  # fmt: skip
    assert deltas, "no delta was written"
    log = (run_dir / f"{name}-ps-1.log").read_text()
    resumed = re.findall(r"resumes at version (\d+), embedding rows held: (\{.*?\})", log)
    assert len(resumed) == 3, log[-3000:]
    shard = Checkpointing(folder, shard=1)
    for version, held in resumed:
        model = shard.load(int(version))  # the version's checkpoint made whole
        assert ast.literal_eval(held) == {t: model.embeddings[t].rows_held for t in TABLES}, (version, held)
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [TRAIN] * 4
    assert len(set(result["shard_versions"])) == 1, result["shard_versions"]
