"""PyTorch workers on the same parameter servers (issue 36), end to end: `elasticps run` of a job
whose model is a torch module (``spec.model.framework: torch``), in sync, async with the
staleness-aware rate, SSP and LocalSGD: every record trained once per epoch, the model learns, and
the exported program (``model.pt2``) scores the job's accuracy in a fresh process that has no
model module to import. DeepFM with its embedding tables on 2 PS (``backends/pytorch/layers.py``),
with and without a PS killed: the rows the shards hold are exactly the data's ids, and the export
holds them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from local_jobs import elasticps, job_document, wait_for, write_job
from test_embeddings_processes import RECORDS, TRAIN, assert_rows_are_the_datas_ids, write_criteo
from test_faults import coordinator

# Not imported here: this process may hold TensorFlow already (tests/conftest.py says why).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")]


def torch_job(name: str, train: Path, validation: Path, output: Path, **training: object) -> dict[str, object]:
    document = job_document(name, train, validation, evaluationSteps=0, **training)
    spec = document["spec"]
    assert isinstance(spec, dict)
    spec["model"] = {"framework": "torch", "modelDef": "elasticps.backends.pytorch.zoo.mlp"}
    spec["output"] = str(output)
    return document


@pytest.mark.parametrize(
    "training",
    [
        pytest.param({}, id="sync"),
        pytest.param({"useAsync": True, "lrStalenessModulation": True}, id="async-staleness"),
        pytest.param({"useAsync": True, "getModelFrequency": 4}, id="async-ssp"),
        pytest.param({"localSGDSteps": 4}, id="localsgd"),
    ],
)
def test_a_torch_job_trains_every_record_learns_and_exports_a_program(
    tmp_path: Path, data: tuple[Path, Path], training: dict[str, object]
) -> None:
    output = tmp_path / "model"
    job = write_job(tmp_path / "job.yaml", torch_job("torch", *data, output, **training))
    result_file = tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file), cwd=tmp_path)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [4000, 4000]
    accuracy = result["metrics"]["accuracy"]
    assert accuracy > 0.85, result
    assert {"job.json", "metrics.json", "model.pt2", "model.safetensors"} <= {p.name for p in output.iterdir()}
    # The program alone, in a process that cannot import the model module, on the validation records.
    code = textwrap.dedent(f"""
        import sys, numpy as np, torch
        sys.modules["elasticps"] = None  # neither the zoo nor anything of ours
        program = torch.export.load({str(output / 'model.pt2')!r}).module()
        data = np.load({str(data[1])!r})
        outputs = program(torch.from_numpy(data["x"].astype(np.float32))).detach().numpy()
        print(float((outputs.argmax(axis=1) == data["y"]).mean()))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip()) == pytest.approx(accuracy, abs=0.001)


def test_a_decentralized_torch_job_trains_every_record_and_learns(tmp_path: Path, data: tuple[Path, Path]) -> None:
    """Four torch workers on a ring (Hop), no PS: models between the workers over their Peer service."""
    document = torch_job("torch-hop", *data, tmp_path / "model", learningRate=0.1)
    spec = document["spec"]
    assert isinstance(spec, dict)
    spec.pop("ps")
    spec["strategy"] = "decentralized"
    spec["decentralized"] = {"graph": "ring", "maxIterationGap": 2}
    spec["worker"] = {"replicas": 4}
    job = write_job(tmp_path / "job.yaml", document)
    result_file = tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file), cwd=tmp_path)
    _, stderr = process.communicate(timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    assert "a coordinator (ring graph) + 4 workers, Decentralized" in stderr
    result = json.loads(result_file.read_text())
    assert result["succeeded"] and result["epoch_records"] == [4000, 4000]
    print(f"decentralized torch: accuracy {result['metrics']['accuracy']:.4f}")
    assert result["metrics"]["accuracy"] > 0.85
    assert {"model.pt2", "model.safetensors"} <= {p.name for p in (tmp_path / "model").iterdir()}


def test_a_torch_job_predicts_after_training_and_a_prediction_job_predicts_with_its_program(
    tmp_path: Path, data: tuple[Path, Path]
) -> None:
    """(a) train, export, predict the validation records; (b) predict only, with (a)'s ``model.pt2``:
    every record once, the same classes, the outputs within float noise."""
    from test_prediction import read_predictions, run_job

    train, validation = data
    records = int(len(np.load(validation)["y"]))
    out = tmp_path / "trained"
    document = torch_job("torch-predict", train, validation, out, numEpochs=1)
    document["spec"]["prediction"] = {"data": str(validation)}  # type: ignore[index]
    _, result = run_job(tmp_path, "a", document)
    assert result["records_predicted"] == records
    lines = sorted(read_predictions(out / "predictions"), key=lambda line: line["index"])
    assert [line["index"] for line in lines] == list(range(records))
    labels = np.load(validation)["y"]
    accuracy = float(np.mean(np.array([line["class"] for line in lines]) == labels))
    assert accuracy == pytest.approx(result["metrics"]["accuracy"], abs=1e-6)  # the final evaluation's model
    alone = tmp_path / "alone"
    document = torch_job("torch-predict-only", train, validation, alone)
    spec = document["spec"]
    assert isinstance(spec, dict)
    spec["data"] = {"reader": "npz"}
    spec["prediction"] = {"data": str(validation), "model": str(out)}
    _, result = run_job(tmp_path, "b", document)
    assert (result["records_predicted"], result["records_done"]) == (records, 0)
    again = sorted(read_predictions(alone / "predictions"), key=lambda line: line["index"])
    assert [line["class"] for line in again] == [line["class"] for line in lines]
    assert max(abs(a - b) for x, y in zip(lines, again) for a, b in zip(x["output"], y["output"])) < 1e-5


# Put first on every process's import path: TensorFlow and Keras are absent, as in an environment
# without them (``import`` fails, ``importlib.util.find_spec`` finds nothing).
NO_TENSORFLOW = """
import sys
for name in ("tensorflow", "keras", "tf_keras"):
    sys.modules[name] = None
"""


def test_a_torch_job_runs_where_tensorflow_cannot_be_imported(
    tmp_path: Path, data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner, the PS, the coordinator and the torch workers: none of them imports TensorFlow."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_TENSORFLOW)
    monkeypatch.setenv("PYTHONPATH", f"{site}:{Path(__file__).parent}")
    check = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True)
    assert "import of tensorflow halted" in check.stderr  # the block holds
    output = tmp_path / "model"
    job = write_job(tmp_path / "job.yaml", torch_job("no-tf", *data, output, useAsync=True))
    result_file = tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file), cwd=tmp_path)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    assert "halted" not in stderr
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [4000, 4000] and result["metrics"]["accuracy"] > 0.85
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").glob("*.log"))
    assert "halted" not in logs


def test_elasticps_export_rebuilds_the_torch_model_from_the_checkpoints(tmp_path: Path, data: tuple[Path, Path]) -> None:
    from safetensors.numpy import load_file  # numpy's side of safetensors: no torch in this process

    output = tmp_path / "model"
    job = write_job(tmp_path / "job.yaml", torch_job("torch", *data, output, checkpointSteps=1))
    process = elasticps("run", str(job), "--run_dir", str(tmp_path / "run"), cwd=tmp_path)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    rebuilt = tmp_path / "rebuilt"
    export = elasticps("export", str(tmp_path / "run" / "checkpoints"), "--job", str(job), "--out", str(rebuilt), cwd=tmp_path)
    out, err = export.communicate(timeout=300)
    assert export.returncode == 0, err[-3000:]
    assert "exported model version" in out
    final, again = load_file(str(output / "model.safetensors")), load_file(str(rebuilt / "model.safetensors"))
    assert sorted(final) == sorted(again) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for name in final:
        np.testing.assert_array_equal(final[name], again[name])


def deepfm_job(tmp_path: Path, name: str, **training: object) -> Path:
    data = write_criteo(tmp_path / "criteo.txt")
    document = job_document(name, data, data, minibatchSize=64, recordsPerTask=600, numEpochs=2, learningRate=0.02,
                            evaluationSteps=0, **training)  # fmt: skip
    spec = document["spec"]
    assert isinstance(spec, dict)
    spec["model"] = {"framework": "torch", "modelDef": "elasticps.backends.pytorch.zoo.deepfm",
                     "params": {"dim": 4, "hidden": [16]}}  # fmt: skip
    spec["data"] = {"reader": "criteo", "training": f"{data}[0:{TRAIN}]", "validation": f"{data}[{TRAIN}:]"}
    spec["output"] = str(tmp_path / "model")
    return write_job(tmp_path / "job.yaml", document)


def program_auc(tmp_path: Path) -> float:
    """The exported program's AUC on the validation records, in a process without elasticps."""
    from elasticps.api.metrics import auc
    from elasticps.data.criteo import CriteoReader

    x, y = CriteoReader(str(tmp_path / "criteo.txt")).read(TRAIN, RECORDS)
    np.save(tmp_path / "x.npy", np.asarray(x, np.int64))
    code = textwrap.dedent(f"""
        import sys, numpy as np, torch
        sys.modules["elasticps"] = None
        program = torch.export.load({str(tmp_path / 'model' / 'model.pt2')!r}).module()
        np.save({str(tmp_path / 'logits.npy')!r}, program(torch.from_numpy(np.load({str(tmp_path / 'x.npy')!r}))).detach().numpy())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return auc(y, np.load(tmp_path / "logits.npy"))


@pytest.mark.parametrize("kill", [False, True], ids=["deepfm", "deepfm-ps-killed"])
def test_torch_deepfm_on_two_ps_holds_exactly_the_rows_of_its_ids_learns_and_exports_them(
    tmp_path: Path, kill: bool
) -> None:
    name = "ctr-torch-kill" if kill else "ctr-torch"
    job = deepfm_job(tmp_path, name, **({"checkpointSteps": 10, "keepCheckpointMax": 100} if kill else {}))
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    if kill:
        client = coordinator(run_dir)
        wait_for(lambda: client.status().model_version >= 25, 300, "a few checkpoints")
        os.kill(int((run_dir / f"{name}-ps-1.pid").read_text()), signal.SIGKILL)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    if kill:
        assert f"{name}-ps-1 exited with code -9: replacing it" in stderr
        assert re.search(r"resumes at version \d+, embedding rows held: \{'deepfm_", (run_dir / f"{name}-ps-1.log").read_text())
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [TRAIN, TRAIN]
    assert len(set(result["shard_versions"])) == 1, result["shard_versions"]
    assert result["metrics"]["auc"] > 0.75, result["metrics"]  # chance: 0.5; Keras's DeepFM on this data: 0.80-0.84
    assert_rows_are_the_datas_ids(tmp_path, run_dir, name)
    exported = program_auc(tmp_path)
    print(f"{name}: AUC {result['metrics']['auc']:.4f}, the exported program's {exported:.4f}")
    assert exported == pytest.approx(result["metrics"]["auc"], abs=1e-4)
