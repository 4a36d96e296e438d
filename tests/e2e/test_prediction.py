"""Batch prediction end to end: a job that trains, exports and then predicts a dataset, and a job
that only predicts with that exported model; one JSON line per record, each record once, and the
outputs those of the exported model reloaded in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from local_jobs import elasticps, job_document, write_job

pytestmark = pytest.mark.slow

# The exported model's logits for every record of an npz file, in a fresh interpreter.
LOGITS = r"""
import json, sys
import numpy as np
import keras
import tensorflow as tf
from elasticps.backends.keras.zoo import mlp

folder, records = sys.argv[1], sys.argv[2]
data = np.load(records)
dataset = mlp.feed(tf.data.Dataset.from_tensor_slices((data["x"], data["y"])), "prediction")
x, _ = next(iter(dataset.batch(len(data["y"]))))
model = keras.models.load_model(folder + "/model.keras")
print(json.dumps(model(x, training=False).numpy().tolist()))
"""


def run_job(tmp_path: Path, name: str, document: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    job = write_job(tmp_path / f"{name}.yaml", document)
    result_file = tmp_path / f"{name}.json"
    process = elasticps(
        "run", str(job), "--run_dir", str(tmp_path / f"run-{name}"), "--result_file", str(result_file), cwd=tmp_path
    )
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    return stdout, json.loads(result_file.read_text())


def read_predictions(folder: Path) -> list[dict[str, Any]]:
    files = sorted(folder.iterdir())
    assert all(f.name.startswith("part-") and f.name.endswith(".jsonl") for f in files), files  # no temporaries
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def exported_logits(folder: Path, records: Path) -> np.ndarray:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", LOGITS, str(folder), str(records)],
        capture_output=True, text=True, timeout=120, env=env, cwd=folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return np.array(json.loads(done.stdout.strip().splitlines()[-1]))


def test_train_then_predict_and_predict_with_the_exported_model(tmp_path: Path, data: tuple[Path, Path]) -> None:
    train, validation = data
    records = int(len(np.load(validation)["y"]))  # 500: tasks of 400 and 100 records
    out = tmp_path / "trained"

    # (a) train, evaluate, export, then predict the validation records with the final model
    document = job_document("trainpredict", train, validation, numEpochs=1)
    document["spec"].update(output=str(out), prediction={"data": str(validation)})  # type: ignore[attr-defined]
    stdout, result = run_job(tmp_path, "a", document)
    predictions = out / "predictions"
    assert result["records_predicted"] == records and result["predictions_path"] == str(predictions)
    assert stdout.strip().splitlines()[-1] == f"  {records} predictions written to {predictions}"
    assert result["export_path"] == str(out)  # the final export came first
    lines = read_predictions(predictions)
    assert sorted(line["index"] for line in lines) == list(range(records))  # every record once
    logits = exported_logits(out, validation)
    outputs = np.array([line["output"] for line in sorted(lines, key=lambda line: line["index"])])
    assert np.array_equal(np.argmax(outputs, axis=1), np.argmax(logits, axis=1))
    assert np.max(np.abs(outputs - logits)) < 1e-4
    assert [line["class"] for line in lines] == [int(np.argmax(line["output"])) for line in lines]
    labels = np.load(validation)["y"]
    assert [line["label"] for line in sorted(lines, key=lambda line: line["index"])] == labels.tolist()
    accuracy = float(np.mean(np.argmax(outputs, axis=1) == labels))
    assert accuracy == pytest.approx(result["metrics"]["accuracy"], abs=1e-6)  # the final evaluation's model

    # (b) predict only, with (a)'s export: no training data, no training
    alone = tmp_path / "alone"
    document = job_document("predictonly", train, validation)
    document["spec"]["data"] = {"reader": "npz"}  # type: ignore[index]
    document["spec"].update(  # type: ignore[attr-defined]
        output=str(alone), prediction={"data": str(validation), "model": str(out)}, worker={"replicas": 2}
    )
    stdout, result = run_job(tmp_path, "b", document)
    assert (result["records_predicted"], result["records_done"], result["export_path"]) == (records, 0, "")
    assert stdout.strip().splitlines()[-1] == f"  {records} predictions written to {alone / 'predictions'}"
    assert sorted(p.name for p in alone.iterdir()) == ["predictions"]  # no export, no training curves
    again = read_predictions(alone / "predictions")
    assert sorted(line["index"] for line in again) == list(range(records))
    by_index = {line["index"]: line for line in again}
    assert all(by_index[line["index"]]["class"] == line["class"] for line in lines)
    assert max(abs(a - b) for line in lines for a, b in zip(line["output"], by_index[line["index"]]["output"])) < 1e-5


def test_a_prediction_model_that_is_not_there_is_refused_before_anything_starts(
    tmp_path: Path, data: tuple[Path, Path]
) -> None:
    document = job_document("nomodel", *data)
    document["spec"]["data"] = {"reader": "npz"}  # type: ignore[index]
    document["spec"].update(output=str(tmp_path / "o"), prediction={"data": str(data[1]), "model": str(tmp_path / "none")})  # type: ignore[attr-defined]
    job = write_job(tmp_path / "job.yaml", document)
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), cwd=tmp_path)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert f"spec.prediction.model: no {tmp_path / 'none'}/model.keras" in stderr
