"""Prediction on the worker: the writer's JSON lines and its atomic replace, and the loop's
prediction tasks, after training (the task's version, pulled from the PS) and alone (an exported
model, no PS at all)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.spec import TrainingSpec
from elasticps.proto import elasticps_pb2 as pb
from elasticps.worker import predicting
from elasticps.worker.predicting import PredictionError, PredictionWriter, json_lines
from elasticps.worker.training import Prediction
from worker_fakes import ArrayReader, make_worker, prediction_task, training_task

SYNC = TrainingMode.of(TrainingSpec())


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- the writer ------------------------------------------------------------------------------------


def test_one_line_per_record_with_its_index_output_class_and_label() -> None:
    outputs = np.array([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0]], np.float32)
    text = json_lines(40, 42, outputs, labels=np.array([1, 2]))
    assert text.endswith("\n") and text.count("\n") == 2
    first, second = (json.loads(line) for line in text.splitlines())
    assert first == {"index": 40, "output": pytest.approx([0.1, 2.0, -1.0]), "class": 1, "label": 1}
    assert second["index"] == 41 and second["class"] == 0 and second["label"] == 2


def test_outputs_that_are_not_class_scores_have_no_class_and_odd_labels_are_left_out() -> None:
    text = json_lines(0, 2, np.array([[0.5], [0.7]]), labels=np.array([b"a", b"b"]))
    assert [json.loads(line) for line in text.splitlines()] == [
        {"index": 0, "output": [0.5]},
        {"index": 1, "output": [0.7]},
    ]


def test_several_outputs_are_written_by_name_and_nan_as_null() -> None:
    outputs = {"score": np.array([1.0, np.nan]), "embedding": np.zeros((2, 2))}
    first, second = (json.loads(line) for line in json_lines(5, 7, outputs).splitlines())
    assert first == {"index": 5, "output": {"score": 1.0, "embedding": [0.0, 0.0]}}
    assert second["output"]["score"] is None


def test_outputs_must_have_one_row_per_record() -> None:
    with pytest.raises(PredictionError, match="the model gave 3 rows for 2 records"):
        json_lines(0, 2, np.zeros((3, 2)))


def test_a_task_written_again_replaces_its_file(tmp_path: Path) -> None:
    writer = PredictionWriter(str(tmp_path / "out"))
    path = Path(writer.write(10, 13, np.zeros((3, 2))))
    assert path == tmp_path / "out" / "predictions" / "part-0000000010-0000000013.jsonl"
    again = Path(writer.write(10, 13, np.ones((3, 2))))
    assert again == path
    assert [line["output"] for line in lines(path)] == [[1.0, 1.0]] * 3
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary left behind


def test_a_write_that_fails_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = PredictionWriter(str(tmp_path))
    path = Path(writer.write(0, 2, np.zeros((2, 2))))
    before = path.read_text()

    def failing(*args: object, **kwargs: object) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(predicting, "json_lines", lambda *a, **k: "half a line")
    monkeypatch.setattr("os.replace", failing)
    with pytest.raises(OSError, match="disk full"):
        writer.write(0, 2, np.ones((2, 2)))
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_an_object_store_gets_the_file_in_one_upload(monkeypatch: pytest.MonkeyPatch) -> None:
    uploads: list[tuple[list[str], str]] = []

    def upload(folder: str, uri: str) -> None:
        uploads.append((sorted(p.name for p in Path(folder).iterdir()), uri))

    monkeypatch.setattr(predicting, "upload", upload)
    written = PredictionWriter("s3://bucket/run/").write(0, 1, np.zeros((1, 2)))
    assert written == "s3://bucket/run/predictions/part-0000000000-0000000001.jsonl"
    assert uploads == [(["part-0000000000-0000000001.jsonl"], "s3://bucket/run/predictions")]


# ---- the loop ----------------------------------------------------------------------------------------


def test_prediction_after_training_uses_the_tasks_version_and_reports_its_records(tmp_path: Path) -> None:
    data = ArrayReader(10)
    prediction = Prediction(data, PredictionWriter(str(tmp_path)))
    tasks = [training_task(1, 0, 8)]
    rig = make_worker(SYNC, tasks, prediction=prediction)
    rig.coordinator.tasks.append(prediction_task(2, 0, 6, version=2))  # 8 records, minibatches of 4: version 2
    rig.coordinator.tasks.append(prediction_task(3, 6, 10, version=2))
    rig.worker.run()
    reports = {r.task_id: r for r in rig.coordinator.reports}
    assert reports[2].success and reports[3].success and (reports[2].records, reports[3].records) == (6, 4)
    files = sorted((tmp_path / "predictions").iterdir())
    assert [f.name for f in files] == ["part-0000000000-0000000006.jsonl", "part-0000000006-0000000010.jsonl"]
    written = [line for f in files for line in lines(f)]
    assert [line["index"] for line in written] == list(range(10))
    assert [line["label"] for line in written] == list(range(10))
    # predicted with the PS's model of version 2, not the worker's initial copy
    assert {line["output"][1] for line in written} == {float(rig.ps.model()["dense/bias"][0])}  # type: ignore[index]
    assert rig.ps.shards[0].version == 2


def test_a_prediction_of_another_version_than_the_shards_hold_fails() -> None:
    prediction = Prediction(ArrayReader(4), PredictionWriter("/nonexistent"))
    rig = make_worker(SYNC, [prediction_task(1, 0, 4, version=7)], prediction=prediction)
    with pytest.raises(RuntimeError, match="asked to predict with version 7, but the PS shards hold 0"):
        rig.worker.run()
    assert [r.success for r in rig.coordinator.reports] == [False]


def test_a_worker_predicting_with_an_exported_model_never_talks_to_the_ps(tmp_path: Path) -> None:
    prediction = Prediction(ArrayReader(5), PredictionWriter(str(tmp_path)), standalone=True)
    rig = make_worker(SYNC, [prediction_task(1, 0, 5)], prediction=prediction, training=False, validation=False)
    rig.worker.run()
    assert rig.ps.events == [("predict", 0), ("report", 1), ("leave",)]  # no pull, no push
    assert not rig.trainer.built
    assert [r.records for r in rig.coordinator.reports] == [5]
    assert len(lines(tmp_path / "predictions" / "part-0000000000-0000000005.jsonl")) == 5


def test_a_worker_without_training_data_must_be_predicting_with_an_exported_model() -> None:
    with pytest.raises(ValueError, match="only predicts, with an exported model"):
        make_worker(SYNC, [], training=False)


def test_a_prediction_task_without_prediction_data_fails() -> None:
    rig = make_worker(TrainingMode.of(TrainingSpec(use_async=True)), [prediction_task(1, 0, 4)])
    assert TrainingMode.of(TrainingSpec(use_async=True)).rule is UpdateRule.ASYNC
    with pytest.raises(RuntimeError, match="no --prediction_data"):
        rig.worker.run()
    assert rig.coordinator.reports[0].task_id == 1 and not rig.coordinator.reports[0].success
    assert rig.coordinator.reports[0].error.startswith("RuntimeError")
    assert isinstance(rig.coordinator.reports[0], pb.TaskResult)
