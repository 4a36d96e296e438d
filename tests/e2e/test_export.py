"""Exports end to end: a job with spec.output leaves a model that loads in a fresh process and
scores what the job reported; a worker killed mid-export leaves it to another; ``elasticps export``
rebuilds the same model from the PS checkpoints."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from local_jobs import REPO, elasticps, job_document, process_token, read_curves, wait_for, write_job
from elasticps.ps import checkpoint

pytestmark = pytest.mark.slow

# Run in a fresh interpreter: nothing of the job's processes or of this one is reused.
RELOAD = r"""
import json, sys
import numpy as np
import keras
import tensorflow as tf
from elasticps.backends.keras.zoo import mlp

folder, validation = sys.argv[1], sys.argv[2]
data = np.load(validation)
dataset = mlp.feed(tf.data.Dataset.from_tensor_slices((data["x"], data["y"])), "evaluation")
x, y = next(iter(dataset.batch(len(data["y"]))))
model = keras.models.load_model(folder + "/model.keras")
logits = model(x, training=False).numpy()
saved = tf.saved_model.load(folder + "/saved_model")  # kept: its functions need the object alive
served = saved.serve(x).numpy()
accuracy = float(np.mean(np.argmax(logits, axis=-1) == y.numpy()))
weights = {v.path: v.numpy().tolist() for v in model.variables}
print(json.dumps({"accuracy": accuracy, "max_serve_difference": float(np.max(np.abs(served - logits))),
                  "weights": weights}))
"""

# A tiny model whose saving, the first time, announces the exporting worker's pid and then sleeps:
# the test kills that worker in the middle of its export.
SLOW_MODEL = r'''
import os, time
import keras
from elasticps.backends.keras.zoo.mlp import loss, optimizer, feed, eval_metrics_fn  # noqa: F401

MARKER = os.environ["SLOW_EXPORT_MARKER"]


@keras.saving.register_keras_serializable(package="slow_export")
class SlowToSave(keras.layers.Layer):
    def call(self, inputs):
        return inputs

    def get_config(self):
        if not os.path.exists(MARKER):
            with open(MARKER, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(120)
        return super().get_config()


def custom_model(features=8, hidden=16, classes=2):
    return keras.Sequential(
        [keras.Input(shape=(features,)), keras.layers.Dense(hidden, activation="relu"), SlowToSave(),
         keras.layers.Dense(classes)],
        name="slow",
    )
'''


def run_job(tmp_path: Path, document: dict[str, object], timeout: float = 300) -> tuple[int, str, str, dict[str, Any]]:
    job = write_job(tmp_path / "job.yaml", document)
    result_file = tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file), cwd=tmp_path)
    stdout, stderr = process.communicate(timeout=timeout)
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    return process.returncode, stdout, stderr, result


def reload(folder: Path, validation: Path) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", RELOAD, str(folder), str(validation)],
        capture_output=True, text=True, timeout=120, env=env, cwd=folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.mark.parametrize("training", [pytest.param({}, id="sync"), pytest.param({"useAsync": True}, id="async")])
def test_the_exported_model_reloads_with_the_reported_accuracy(
    tmp_path: Path, data: tuple[Path, Path], training: dict[str, object]
) -> None:
    out = tmp_path / "models" / "e2e"
    # splitBytes 256: the hidden kernel (8 x 16 float32, 512 bytes) is split into row slices over
    # both PS, so the export, the evaluations and `elasticps export` all see it joined back.
    document = job_document("e2e", *data, checkpointSteps=1, evaluationSteps=40, splitBytes=256, **training)
    document["spec"]["output"] = str(out)  # type: ignore[index]
    code, stdout, stderr, result = run_job(tmp_path, document)
    assert code == 0, stderr
    latest = [checkpoint.load_latest(tmp_path / "run" / "checkpoints" / f"ps-{i}") for i in range(2)]
    held = [sorted(found.arrays) if found is not None else [] for found in latest]
    assert "var/mlp/dense/kernel#rows0:4" in held[0] and "var/mlp/dense/kernel#rows4:8" in held[1], held
    version = result["model_version"]
    assert (result["export_path"], result["export_version"]) == (str(out), version)
    assert stdout.strip().splitlines()[-1] == f"  model version {version} exported to {out}"
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "loading.json", "metrics.json", "model.keras", "saved_model", "tensorboard"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model_version"] == version and metrics["final"] is True
    assert metrics["metrics"] == result["metrics"] and metrics["metrics_version"] == result["metrics_version"]
    assert metrics["records_trained"] == 8000 and metrics["epochs"] == 2
    assert json.loads((out / "job.json").read_text())["spec"]["output"] == str(out)

    # The training curves: loss per training report, one point per evaluation, the last the final one.
    curves = read_curves(out / "tensorboard")
    ps0 = (tmp_path / "run" / "e2e-ps-0.log").read_text()
    evaluations = re.findall(r"evaluation of model version (\d+):", ps0)
    assert len(evaluations) >= 2  # every 40 versions during training, and the final one
    assert [step for step, _ in curves["eval/accuracy"]] == [int(v) for v in evaluations]
    assert [step for step, _ in curves["eval/loss"]] == [int(v) for v in evaluations]
    assert curves["eval/accuracy"][-1] == (result["metrics_version"], pytest.approx(result["metrics"]["accuracy"], abs=1e-6))
    assert len(curves["train/loss"]) == 8000 // 400  # one point per training task reported
    assert curves["train/records"][-1][1] == 8000

    reloaded = reload(out, data[1])
    reported = result["metrics"]["accuracy"]
    print(f"accuracy: reported by the job {reported:.4f}, of the reloaded model {reloaded['accuracy']:.4f}")
    assert abs(reloaded["accuracy"] - reported) <= 0.001
    assert reloaded["max_serve_difference"] < 1e-5  # the SavedModel gives the Keras model's outputs

    # The same model from the PS checkpoints, by `elasticps export` (every version was checkpointed).
    rebuilt = tmp_path / "rebuilt"
    export = elasticps("export", str(tmp_path / "run" / "checkpoints"), "--job", str(tmp_path / "job.yaml"),
                       "--out", str(rebuilt), cwd=tmp_path)  # fmt: skip
    cli_out, cli_err = export.communicate(timeout=120)
    assert export.returncode == 0, cli_err
    assert f"exported model version {version} of job e2e to {rebuilt}" in cli_out
    assert sorted(p.name for p in rebuilt.iterdir()) == ["job.json", "loading.json", "metrics.json", "model.keras", "saved_model"]
    again = reload(rebuilt, data[1])
    assert again["weights"] == reloaded["weights"]
    assert again["accuracy"] == reloaded["accuracy"]


def test_a_worker_killed_while_exporting_leaves_the_export_to_another(
    tmp_path: Path, data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slow_export.py").write_text(SLOW_MODEL)
    marker = tmp_path / "exporting.pid"
    monkeypatch.setenv("SLOW_EXPORT_MARKER", str(marker))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", str(REPO))]))
    out = tmp_path / "model"
    document = job_document("slow", *data, numEpochs=1, taskTimeoutSeconds=5)
    document["spec"]["model"] = {"modelDef": "slow_export"}  # type: ignore[index]
    document["spec"]["output"] = str(out)  # type: ignore[index]
    job = write_job(tmp_path / "job.yaml", document)
    result_file = tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file), cwd=tmp_path)
    try:
        wait_for(lambda: marker.exists() and marker.read_text().strip(), timeout=240, what="a worker to start exporting")
        victim = int(marker.read_text())
        os.kill(victim, signal.SIGKILL)
        _, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    result = json.loads(result_file.read_text())
    assert result["tasks_requeued"] >= 1  # the killed worker's export went back to the queue
    assert result["export_path"] == str(out)
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "loading.json", "metrics.json", "model.keras", "saved_model", "tensorboard"]
    assert json.loads((out / "metrics.json").read_text())["model_version"] == result["model_version"]
    logs = "".join(p.read_text() for p in (tmp_path / "run").glob("slow-worker-*.log"))
    assert logs.count("exported model version") == 1, logs  # one worker finished it: not the one killed


def test_an_async_job_whose_shards_end_apart_still_exports(tmp_path: Path, data: tuple[Path, Path]) -> None:
    """Async shards count their own pushes: one push that reached only shard 1 (as from a worker
    killed between its pushes to the two shards) leaves their versions apart for good. The job
    still ends, with the model exported under the oldest shard's version."""
    from elasticps.psclient.client import PSClient, PushRequest

    out = tmp_path / "model"
    document = job_document("apart", *data, useAsync=True)
    document["spec"]["output"] = str(out)  # type: ignore[index]
    job = write_job(tmp_path / "job.yaml", document)
    result_file = tmp_path / "result.json"
    run = tmp_path / "run"
    process = elasticps("run", str(job), "--run_dir", str(run), "--result_file", str(result_file), cwd=tmp_path)
    try:
        port_file = run / "ps-1.port"
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), timeout=120, what="PS 1 to serve")
        wait_for(lambda: (run / "apart-worker-0.pid").exists(), timeout=120, what="worker 0 to start")
        # Worker 0's token: a push of the job's own worker, to one shard only (an observer may not push).
        shard = PSClient([f"127.0.0.1:{port_file.read_text().strip()}"], worker="worker-0",
                         token=process_token(run, "apart-worker-0"))
        try:
            pulled = None

            def trained() -> bool:
                nonlocal pulled
                pulled = shard.pull([-1])
                return pulled.versions[0] > 0

            wait_for(trained, timeout=120, what="shard 1 to take a push")
            assert pulled is not None
            zeros = {name: np.zeros_like(value) for name, value in pulled.tensors.items()}
            assert shard.push(PushRequest(zeros, pulled.versions)).result().accepted == [True]
        finally:
            shard.close()
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    result = json.loads(result_file.read_text())
    versions = result["shard_versions"]
    assert versions[1] == versions[0] + 1  # apart for good: nothing else pushes to one shard only
    assert (result["export_path"], result["export_version"]) == (str(out), min(versions))
    assert json.loads((out / "metrics.json").read_text())["shard_versions"] == versions
    assert (out / "model.keras").exists()
