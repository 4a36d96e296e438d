"""ElasticDL's model contract as its zoo writes it today, end to end: `elasticps run` (2 PS + 2
workers, real processes) of ``edl_style_net.CustomModel``: a class named by ``modelDef``, the
3-argument ``feed``, and ``callbacks()``'s learning-rate schedule applied by the PS by model version,
which the job's TensorBoard curves show (``train/learning_rate``); its ``PredictionOutputsProcessor``
gets every prediction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edl_style_net import BOUNDARY
from local_jobs import elasticps, job_document, read_curves, stop_run, summary_values, write_data, write_job

pytestmark = pytest.mark.slow

RECORDS = 4000

# Run in a fresh interpreter without the model's module on its path: plain Keras loads the export.
RELOAD = r"""
import sys
import numpy as np
import keras
model_file, validation = sys.argv[1:3]
data = np.load(validation)
logits = np.asarray(keras.models.load_model(model_file)({"x": data["x"].astype("float32")}, training=False))
print(float(np.mean(np.argmax(logits, axis=-1) == data["y"].reshape(-1))))
"""

def run_job(tmp_path: Path, document: dict[str, object]) -> dict[str, Any]:
    """``elasticps run`` of ``document`` (2 PS + 2 workers) to its end: its result, the run a success."""
    job = write_job(tmp_path / "job.yaml", document)
    result_file = tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file),
                        cwd=tmp_path)  # fmt: skip
    try:
        _, stderr = process.communicate(timeout=600)
    finally:
        stop_run(process)
    assert process.returncode == 0, stderr
    found: dict[str, Any] = json.loads(result_file.read_text())
    return found


@pytest.mark.parametrize("training", [{}, {"useAsync": True}], ids=["sync", "async"])
def test_an_elasticdl_style_module_trains_with_its_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, training: dict[str, object]
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
    train, validation = write_data(tmp_path, records=RECORDS)
    document = job_document("edl", train, validation, **training)
    document["spec"]["model"] = {"modelDef": "edl_style_net.CustomModel"}  # type: ignore[index]
    document["spec"]["output"] = str(tmp_path / "out")  # type: ignore[index]
    document["spec"]["prediction"] = {"data": str(validation)}  # type: ignore[index]
    processed = tmp_path / "processed.jsonl"
    monkeypatch.setenv("EDL_STYLE_PREDICTIONS", str(processed))
    result = run_job(tmp_path, document)
    assert result["epoch_records"] == [RECORDS, RECORDS]
    assert result["metrics"]["accuracy"] > 0.85, result["metrics"]

    rates = read_curves(tmp_path / "out" / "tensorboard")["train/learning_rate"]
    # A push's rate is the schedule's at the version its gradient was computed on, and the curve
    # shows the latest push's: in async a push computed before the drop lands up to its staleness
    # later (a rehearsal of CI saw 0.1 at version 66, the drop at 60), so the curve may lag by that much.
    lag = max_staleness(tmp_path / "out" / "tensorboard") if training else 0
    print(f"\n--- {training or 'sync'}: the PS's learning rate by model version (staleness up to {lag}): {rates}")
    early = [rate for version, rate in rates if version < BOUNDARY - 4]
    late = [rate for version, rate in rates if version > BOUNDARY + 4 + lag]
    assert early and late, rates
    assert early == pytest.approx([0.1] * len(early)) and late == pytest.approx([0.01] * len(late))

    # A subclassed model, whose class Keras cannot locate in a fresh process: model.keras holds its
    # functional twin, which plain Keras loads there (no PYTHONPATH, elsewhere) and which scores
    # what the job reported.
    out = tmp_path / "out"
    loading = json.loads((out / "loading.json").read_text())
    assert loading["model.keras"] == {"keras.models.load_model": True, "needs": [], "functional_twin_of": "CustomModel"}
    assert (out / "saved_model" / "saved_model.pb").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "3"}
    reload = subprocess.run([sys.executable, "-c", RELOAD, str(out / "model.keras"), str(validation)],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path / "run")  # fmt: skip
    assert reload.returncode == 0, reload.stderr[-3000:]
    reloaded = float(reload.stdout.strip().splitlines()[-1])
    print(f"accuracy: reported by the job {result['metrics']['accuracy']:.4f}, of model.keras reloaded {reloaded:.4f}")
    assert abs(reloaded - result["metrics"]["accuracy"]) <= 0.001

    # The processor got each prediction task's outputs once: every validation record, 2 logits each.
    tasks = [json.loads(line) for line in processed.read_text().splitlines()]
    assert sum(len(task["rows"]) for task in tasks) == result["records_predicted"] == 500
    assert {task["worker"] for task in tasks} <= {0, 1} and all(len(row) == 2 for t in tasks for row in t["rows"])


def max_staleness(folder: Path) -> int:
    """The largest staleness the job's ``train/staleness`` histograms hold (their buckets' upper
    bounds: at least the real one)."""
    maxima = [value.histo.max for _, value in summary_values(folder) if value.tag == "train/staleness"]
    assert maxima, "no staleness histogram"
    return int(max(maxima))


# Run in a fresh interpreter with the module's folder on its path: model.keras loads as loading.json
# says (elasticps's layers and the module imported, its own layer given by name).
RELOAD_CTR = r"""
import json, sys
import numpy as np
import keras
import elasticps.backends.keras.layers
import edl_style_ctr
model_file, validation = sys.argv[1:3]
data = np.load(validation)
model = keras.models.load_model(model_file, custom_objects={"ZeroMasked": edl_style_ctr.ZeroMasked})
logits = np.asarray(model(data["x"], training=False)["logits"]).reshape(-1)
print(float(np.mean((logits > 0).astype(np.int64) == data["y"].reshape(-1))))
"""


def write_clicks(directory: Path, records: int) -> tuple[Path, Path]:
    """Ids 1-199 (0: none), Zipf-distributed, ``edl_style_ctr.FIELDS`` a record; a click drawn from
    a logistic model of a hidden weight per id."""
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 1, 200)
    ids = rng.zipf(1.3, (records + 500, 6)) % 199 + 1
    ids[:, 5][rng.uniform(size=records + 500) < 0.3] = 0  # a field some records lack
    clicks = (rng.uniform(size=records + 500) < 1 / (1 + np.exp(-weights[ids].sum(axis=1)))).astype(np.int64)
    train, validation = directory / "clicks-train.npz", directory / "clicks-validation.npz"
    np.savez(train, x=ids[:records], y=clicks[:records])
    np.savez(validation, x=ids[records:], y=clicks[records:])
    return train, validation


def test_a_keras_2_style_ctr_module_trains_and_its_export_loads_with_its_own_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    train, validation = write_clicks(tmp_path, RECORDS)
    document = job_document("ctr", train, validation, useAsync=True, numEpochs=3)
    document["spec"]["model"] = {"modelDef": "edl_style_ctr.custom_model"}  # type: ignore[index]
    document["spec"]["output"] = str(tmp_path / "out")  # type: ignore[index]
    result = run_job(tmp_path, document)
    assert result["epoch_records"] == [RECORDS] * 3
    metrics = result["metrics"]
    print(f"\nthe Keras 2 style CTR module: {metrics}")
    assert metrics["auc"] > 0.7 and metrics["accuracy"] > 0.65, metrics  # learnt (chance: 0.5)

    loading = json.loads((tmp_path / "out" / "loading.json").read_text())
    assert loading["model.keras"] == {"keras.models.load_model": True, "custom_objects": ["ZeroMasked"],
                                      "needs": ["import elasticps.backends.keras.layers", "import edl_style_ctr"]}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": here, "TF_CPP_MIN_LOG_LEVEL": "3"}
    reload = subprocess.run([sys.executable, "-c", RELOAD_CTR, str(tmp_path / "out" / "model.keras"), str(validation)],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path / "run")  # fmt: skip
    assert reload.returncode == 0, reload.stderr[-3000:]
    reloaded = float(reload.stdout.strip().splitlines()[-1])
    print(f"accuracy: reported by the job {metrics['accuracy']:.4f}, of model.keras reloaded {reloaded:.4f}")
    assert abs(reloaded - metrics["accuracy"]) <= 0.001
