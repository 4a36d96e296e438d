"""`make run`'s job (examples/mnist.yaml) on the real MNIST files, one epoch: what it leaves in its
output. The exported model, loaded in a fresh process and applied to the test records after the
module's own ``feed``, scores the accuracy the job reported; the TensorBoard event file holds the
training loss and one point of every metric per evaluation the coordinator logged."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from local_jobs import REPO, elasticps, read_curves

pytestmark = pytest.mark.slow

MNIST = REPO.parent / "shared" / "data" / "mnist"

SCORE = r"""
import json, sys
import numpy as np
import keras
import tensorflow as tf
from elasticps.data.readers import open_reader
from elasticps.backends.keras.zoo import mnist_cnn

folder, prefix = sys.argv[1], sys.argv[2]
reader = open_reader("idx", prefix)
x, y = reader.read(0, reader.num_records)
images, labels = next(iter(mnist_cnn.feed(tf.data.Dataset.from_tensor_slices((x, y)), "evaluation").batch(len(y))))
model = keras.models.load_model(folder + "/model.keras")
predicted = np.argmax(model.predict(images, batch_size=1000, verbose=0), axis=-1)
print(json.dumps({"accuracy": float(np.mean(predicted == labels.numpy())), "records": int(len(y))}))
"""


@pytest.mark.skipif(not (MNIST / "train-images-idx3-ubyte.gz").exists(), reason=f"no MNIST in {MNIST}")
def test_the_mnist_example_exports_a_model_that_scores_its_reported_accuracy_and_draws_its_curves(
    tmp_path: Path,
) -> None:
    document = yaml.safe_load((REPO / "examples" / "mnist.yaml").read_text())
    spec = document["spec"]
    assert spec["output"], "the example names its output"
    for key in ("training", "validation"):  # relative to the repository, where `make run` runs
        spec["data"][key] = str((REPO / spec["data"][key]).resolve())
    spec["output"] = str(tmp_path / "model")
    spec["training"]["numEpochs"] = 1
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    result_file = tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file), cwd=tmp_path)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    result = json.loads(result_file.read_text())
    out = Path(result["export_path"])
    assert out == tmp_path / "model" and result["export_version"] == result["model_version"]

    scored = subprocess.run(
        [sys.executable, "-c", SCORE, str(out), spec["data"]["validation"]],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    reloaded = json.loads(scored.stdout.strip().splitlines()[-1])
    reported = result["metrics"]["accuracy"]
    print(f"test accuracy: reported {reported:.4f}, exported model reloaded {reloaded['accuracy']:.4f}")
    assert reloaded["records"] == 10000
    assert abs(reloaded["accuracy"] - reported) <= 0.001

    curves = read_curves(out / "tensorboard")
    logged = re.findall(r"evaluation of model version (\d+):", (tmp_path / "run" / "mnist-sync-ps-0.log").read_text())
    assert len(logged) >= 2  # every evaluationSteps versions, and the final evaluation
    for metric in ("eval/accuracy", "eval/loss"):
        assert [step for step, _ in curves[metric]] == [int(version) for version in logged], metric
    assert curves["eval/accuracy"][-1][1] == pytest.approx(reported, abs=1e-6)
    assert len(curves["train/loss"]) == -(-60000 // spec["training"]["recordsPerTask"])  # one per task
    losses = [loss for _, loss in curves["train/loss"]]
    assert losses[-1] < losses[0] / 4  # the curve goes down
