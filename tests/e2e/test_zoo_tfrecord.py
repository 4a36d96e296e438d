"""The ElasticDL-style example's path end to end, small: `elasticps run` of a job with
``reader: tfrecord`` and ``elasticps.backends.keras.zoo.mnist_functional`` (a dict input, BatchNormalization,
``dataset_fn`` parsing ``tf.train.Example``), 2 PS + 2 workers, over a few hundred generated
records in the module's layout, read from a glob under ``~`` as ``examples/mnist-tfrecord.yaml``
reads MNIST; it trains, evaluates, checkpoints BatchNorm's statistics and exports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from local_jobs import elasticps, write_job
from elasticps.data.tfrecord import frame
from elasticps.ps import checkpoint

pytestmark = pytest.mark.slow

TRAIN, VALIDATION = 640, 160


def images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28 x 28 pixels (0-255) of noise with a bright block whose place is the label's (10 places)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count)
    pixels = rng.uniform(0, 60, size=(count, 28, 28))
    for i, label in enumerate(labels):
        row, col = (label // 5) * 14 + 3, (label % 5) * 5 + 2
        pixels[i, row : row + 8, col : col + 4] = 255
    return pixels, labels


def write_records(path: Path, pixels: np.ndarray, labels: np.ndarray) -> None:
    from elasticps.backends.keras.zoo.mnist_functional import example  # TensorFlow, for tf.train.Example

    path.write_bytes(b"".join(frame(example(image, int(label))) for image, label in zip(pixels, labels)))


def test_a_tfrecord_job_of_the_zoo_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    data = home / "data"
    data.mkdir(parents=True)
    pixels, labels = images(TRAIN + VALIDATION, seed=0)
    for shard, (start, end) in enumerate([(0, 300), (300, TRAIN)]):  # two files, one glob
        write_records(data / f"train-{shard}-of-2.tfrecord", pixels[start:end], labels[start:end])
    write_records(data / "test.tfrecord", pixels[TRAIN:], labels[TRAIN:])
    monkeypatch.setenv("HOME", str(home))  # the job's paths start with ~, as the example's do

    document: dict[str, object] = {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "zootfr"},
        "spec": {
            "output": "model",
            "model": {"modelDef": "elasticps.backends.keras.zoo.mnist_functional"},
            "data": {"reader": "tfrecord", "training": "~/data/train-*.tfrecord", "validation": "~/data/test.tfrecord"},
            "training": {"minibatchSize": 16, "numEpochs": 3, "recordsPerTask": 160, "checkpointSteps": 10},
            "ps": {"replicas": 2},
            "worker": {"replicas": 2},
            "runPolicy": {"backoffLimit": 3},
        },
    }
    job = write_job(tmp_path / "job.yaml", document)
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [TRAIN] * 3  # every record of both files, each epoch
    assert result["metrics"]["accuracy"] > 0.6, result["metrics"]  # chance: 0.1

    # BatchNorm's statistics went to the shards and into their checkpoints, trained (not 0 and 1).
    state: dict[str, np.ndarray] = {}
    for shard in range(2):
        newest = checkpoint.load_latest(run_dir / "checkpoints" / f"ps-{shard}")
        assert newest is not None
        state.update({k.removeprefix("state/"): v for k, v in newest.arrays.items() if k.startswith("state/")})
    names = sorted(state)
    assert [name.rsplit("/", 1)[-1] for name in names] == ["moving_mean", "moving_variance"], names
    mean, variance = state[names[0]], state[names[1]]
    assert mean.shape == variance.shape == (64,)
    assert not np.allclose(mean, 0.0, atol=1e-3)
    assert not np.allclose(variance, 1.0, atol=1e-3)

    exported = tmp_path / result["export_path"]  # spec.output, relative to where the run started
    assert (exported / "model.keras").is_file() and (exported / "metrics.json").is_file()
