"""Jobs whose data and output are in an object store: a real S3-compatible server (moto's, on
loopback: the ``s3_bucket`` fixture of ``tests/conftest.py``) holds TFRecord files of
``tf.train.Example``s; ``elasticps run``, given the AWS environment as a user's shell would hold
it, trains on them, exports the model into the bucket and the model downloaded from there scores
what the job reported. An output that refuses the model fails the job with ExportFailed (the
export retried a bounded number of times, no worker restarted); one that cannot work is refused
before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from elasticps import storage
from local_jobs import REPO, elasticps, job_document, write_data, write_job

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
RECORDS, VALIDATION = 4000, 500

# Run in a fresh interpreter: the model comes from the bucket through elasticps.storage.
RELOAD = r"""
import json, sys, tempfile
import numpy as np
import keras
import tensorflow as tf
from elasticps import Mode, storage
from elasticps.data.readers import open_reader
import examples_net

output, validation = sys.argv[1], sys.argv[2]
folder = tempfile.mkdtemp()
storage.download(output, folder)
records = open_reader("tfrecord", validation)
features, _ = records.read(0, records.num_records)
dataset = examples_net.dataset_fn(tf.data.Dataset.from_tensor_slices(features), Mode.EVALUATION, None)
x, y = next(iter(dataset.batch(records.num_records)))
model = keras.models.load_model(folder + "/model.keras")
logits = model(x, training=False).numpy()
saved = tf.saved_model.load(folder + "/saved_model")  # kept: its functions need the object alive
served = saved.serve(x).numpy()
accuracy = float(np.mean(np.argmax(logits, axis=-1) == y.numpy().reshape(-1)))
print(json.dumps({"accuracy": accuracy, "records": int(records.num_records),
                  "max_serve_difference": float(np.max(np.abs(served - logits)))}))
"""


def with_model_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's processes (and the reload) import ``examples_net`` from this folder."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", str(REPO))]))


def write_records(folder: Path) -> None:
    """The separable two-class problem of ``local_jobs.write_data`` as TFRecord shards of examples."""
    import examples_net
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(RECORDS + VALIDATION, examples_net.FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=examples_net.FEATURES) > 0).astype(np.int64)
    folder.mkdir(parents=True)
    shards = {"train": (0, RECORDS, 4), "validation": (RECORDS, RECORDS + VALIDATION, 2)}
    for split, (start, end, count) in shards.items():
        bounds = np.linspace(start, end, count + 1).astype(int)
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            with tf.io.TFRecordWriter(str(folder / f"{split}-{i}.tfrecord")) as writer:
                for row in range(a, b):
                    writer.write(examples_net.example(x[row], int(y[row])))


def run_job(tmp_path: Path, document: dict[str, Any], timeout: float = 300) -> tuple[int, str, dict[str, Any]]:
    job = write_job(tmp_path / "job.yaml", document)
    result_file = tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file), cwd=tmp_path)
    try:
        _, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    return process.returncode, stderr, result


def read_curves(folder: Path) -> dict[str, list[tuple[int, float]]]:
    import tensorflow as tf

    [events] = sorted(folder.glob("events.out.tfevents.*"))
    curves: dict[str, list[tuple[int, float]]] = {}
    for event in tf.compat.v1.train.summary_iterator(str(events)):
        for value in event.summary.value:
            if not value.HasField("histo"):
                curves.setdefault(value.tag, []).append((event.step, value.simple_value))
    return curves


def test_a_job_reads_tfrecord_from_s3_and_exports_its_model_there(
    tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_model_folder(monkeypatch)
    write_records(tmp_path / "data")
    storage.upload(tmp_path / "data", f"s3://{s3_bucket}/data")
    data = f"s3://{s3_bucket}/data"
    output = f"s3://{s3_bucket}/models/s3job"
    document = job_document("s3job", tmp_path, tmp_path, evaluationSteps=40, checkpointSteps=20)
    spec: Any = document["spec"]
    spec["model"] = {"modelDef": "examples_net"}
    spec["data"] = {"reader": "tfrecord", "training": f"{data}/train-*.tfrecord", "validation": f"{data}/validation-*.tfrecord"}
    spec["output"] = output

    code, stderr, result = run_job(tmp_path, document)
    assert code == 0, stderr
    version = result["model_version"]
    assert (result["export_path"], result["export_version"]) == (output, version)

    # The bucket: the data as uploaded (the record-offset indexes were cached locally, not here), the export beside it.
    found = [uri.removeprefix(f"s3://{s3_bucket}/") for uri in storage.glob(f"s3://{s3_bucket}/**")]
    assert sorted(p for p in found if p.startswith("data/")) == sorted(f"data/{p.name}" for p in (tmp_path / "data").iterdir())
    exported = sorted(p.removeprefix("models/s3job/") for p in found if p.startswith("models/s3job/"))
    assert {"model.keras", "job.json", "metrics.json", "saved_model/saved_model.pb"} <= set(exported)
    assert any(p.startswith("saved_model/variables/") for p in exported)
    assert [p for p in exported if p.startswith("tensorboard/")] != []
    assert not any(p.startswith(("versions/", ".export")) for p in exported)
    fs, inner = storage._remote(output)
    stamps = {p: fs.info(f"{inner}/{p}")["mtime"] for p in exported if not p.startswith("tensorboard/")}
    assert stamps["metrics.json"] == max(stamps.values())  # written last (the store's stamps are to the second)

    local = tmp_path / "downloaded"
    storage.download(output, local)
    metrics = json.loads((local / "metrics.json").read_text())
    assert metrics["model_version"] == version and metrics["final"] is True
    assert metrics["metrics"] == result["metrics"] and metrics["records_trained"] == 2 * RECORDS
    assert json.loads((local / "job.json").read_text())["spec"]["output"] == output

    # The training curves, uploaded by PS 0 after every evaluation and when it stopped.
    curves = read_curves(local / "tensorboard")
    assert curves["eval/accuracy"][-1] == (result["metrics_version"], pytest.approx(result["metrics"]["accuracy"], abs=1e-6))
    assert len(curves["eval/accuracy"]) >= 2
    assert curves["train/records"][-1][1] == 2 * RECORDS

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", RELOAD, output, f"{data}/validation-*.tfrecord"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    reloaded = json.loads(done.stdout.strip().splitlines()[-1])
    reported = result["metrics"]["accuracy"]
    print(f"accuracy: reported by the job {reported:.4f}, of the model reloaded from S3 {reloaded['accuracy']:.4f}")
    assert reloaded["records"] == VALIDATION
    assert abs(reloaded["accuracy"] - reported) <= 0.001
    assert reported > 0.9
    assert reloaded["max_serve_difference"] < 1e-5


def test_an_output_that_refuses_the_model_fails_the_job_with_export_failed(
    tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    train, validation = write_data(tmp_path, records=800)
    output = f"s3://{s3_bucket}-gone/models/doomed"  # a bucket that does not exist: the check at start cannot tell
    document = job_document("doomed", train, validation, numEpochs=1, checkpointSteps=5)
    document["spec"]["output"] = output  # type: ignore[index]
    code, stderr, result = run_job(tmp_path, document)
    assert code == 1, stderr
    reason = result["reason"]
    print(reason)
    assert reason.startswith("ExportFailed: TrainingJob default/doomed: could not write the final model"), reason
    assert f"to {output}: 3 attempts failed, the last with " in reason and "not found" in reason
    checkpoints = tmp_path / "run" / "checkpoints"
    assert f"`elasticps export {checkpoints} --job JOB.yaml --out {output}`" in reason
    assert "BackoffLimitExceeded" not in stderr
    logs = "".join(p.read_text() for p in (tmp_path / "run").glob("doomed-worker-*.log"))
    assert logs.count("could not write export task") == 3
    assert "--- start 1" not in logs  # no worker exited for it, none was restarted
    assert sorted(checkpoints.glob("ps-*/ckpt-*")) != []  # what `elasticps export` needs is there


def test_an_output_under_a_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    train, validation = write_data(tmp_path, records=100)
    (tmp_path / "file").write_text("a file, not a folder")
    document = job_document("early", train, validation)
    document["spec"]["output"] = f"file://{tmp_path}/file/model"  # type: ignore[index]
    code, stderr, result = run_job(tmp_path, document, timeout=60)
    assert code == 2
    assert stderr.strip() == f"elasticps: error: {tmp_path}/job.yaml: spec.output: file://{tmp_path}/file/model: cannot make a folder under {tmp_path}/file, a file"
    assert not (tmp_path / "run").exists() and result == {}
