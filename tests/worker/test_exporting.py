"""Export tasks on the worker (against fakes) and the exporter's folder layout, local and remote."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.output import exported_job
from elasticps.api.parsing import parse_job
from elasticps.api.spec import DataSpec, ModelSpec, TrainingSpec
from elasticps.proto import elasticps_pb2 as pb
from elasticps.storage import is_remote
from elasticps.worker import training
from elasticps.worker.exporting import Exporter, ExportError
from elasticps.worker.local_model import NotSettled
from worker_fakes import FakePS, FakeTrainer, export_task, make_model, make_worker, training_task


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training, "WAIT_S", 0.0)


def exporter(output: Path | str) -> Exporter:
    job = exported_job("tiny", ModelSpec("tests.tiny"), DataSpec("train.npz"), TrainingSpec(), str(output))
    return Exporter(str(output), job)


def visible(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_a_final_export_writes_the_model_the_shards_hold(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rig = make_worker(TrainingMode(), [export_task(1, 0)], exporter=exporter(out))
    rig.worker.run()
    [report] = rig.coordinator.reports
    assert (report.task_id, report.success, report.model_version) == (1, True, 0)
    assert visible(out) == ["job.json", "metrics.json", "model.keras", "saved_model", "saved_model/saved_model.pb"]
    weights = {k: np.array(v) for k, v in json.loads((out / "model.keras").read_text()).items()}
    assert weights.keys() == rig.ps.model().keys()
    assert all(np.array_equal(weights[k], v) for k, v in rig.ps.model().items())
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model_version"] == 0 and metrics["final"] is True
    assert metrics["metrics"] == {"accuracy": 0.75} and metrics["metrics_version"] == 3
    assert metrics["records_trained"] == 32 and metrics["epochs"] == 1
    job = json.loads((out / "job.json").read_text())
    assert parse_job(job).spec.output == str(out)  # job.json reads back as a TrainingJob


@pytest.mark.parametrize("rule", [UpdateRule.SYNC, UpdateRule.ASYNC])
def test_an_export_after_training_has_the_trained_weights(tmp_path: Path, rule: UpdateRule) -> None:
    ps = FakePS(rule)
    rig = make_worker(TrainingMode(rule=rule), [training_task(1, 0, 8), export_task(2, 2)], ps=ps, exporter=exporter(tmp_path))
    rig.worker.run()
    assert [r.success for r in rig.coordinator.reports] == [True, True]
    weights = json.loads((tmp_path / "model.keras").read_text())
    assert all(np.array_equal(np.array(weights[k]), v) for k, v in ps.model().items())
    assert rig.coordinator.reports[-1].model_version == 2


def test_a_final_export_of_a_version_the_shards_do_not_hold_fails(tmp_path: Path) -> None:
    rig = make_worker(TrainingMode(), [export_task(1, 5)], exporter=exporter(tmp_path / "out"))
    with pytest.raises(ExportError, match="version 5"):
        rig.worker.run()
    [report] = rig.coordinator.reports
    assert not report.success and "version 5" in report.error  # back to the queue at once
    assert not report.export_failed  # the PS, not the output: no attempt counted
    assert not (tmp_path / "out").exists()


def test_an_output_that_refuses_the_export_is_reported_and_the_worker_goes_on(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "model"  # a path under a regular file: refused even to root
    rig = make_worker(TrainingMode(), [export_task(1, 0), training_task(2, 0, 8)], exporter=exporter(out))
    rig.worker.run()  # no exception: the process does not exit for it
    failed, trained = rig.coordinator.reports
    assert (failed.task_id, failed.success, failed.export_failed) == (1, False, True)
    assert failed.error.startswith(("NotADirectoryError: ", "FileExistsError: ")) and "file" in failed.error
    assert (trained.task_id, trained.success, trained.export_failed) == (2, True, False)  # the next task ran


def test_a_model_that_cannot_be_saved_counts_as_a_failed_export(tmp_path: Path) -> None:
    trainer = FakeTrainer()

    def broken(directory: Path) -> None:
        raise TypeError("cannot serialize layer SlowToSave")

    trainer.export = broken  # type: ignore[method-assign]
    rig = make_worker(TrainingMode(), [export_task(1, 0)], trainer=trainer, exporter=exporter(tmp_path / "out"))
    rig.worker.run()
    [report] = rig.coordinator.reports
    assert (report.success, report.export_failed, report.error) == (False, True, "TypeError: cannot serialize layer SlowToSave")


def test_an_export_task_without_an_output_fails() -> None:
    rig = make_worker(TrainingMode(), [export_task(1, 0)])
    with pytest.raises(ExportError, match="no --output"):
        rig.worker.run()


def test_a_periodic_export_goes_to_versions_and_takes_the_version_it_pulled(tmp_path: Path) -> None:
    ps = FakePS()
    rig = make_worker(TrainingMode(), [training_task(1, 0, 4), export_task(2, 0, final=False)], ps=ps, exporter=exporter(tmp_path))
    rig.worker.run()
    version = ps.shards[0].version
    assert version > 0 and rig.coordinator.reports[-1].model_version == version
    assert visible(tmp_path / "versions") == [
        f"{version}",
        *(f"{version}/{name}" for name in ["job.json", "metrics.json", "model.keras", "saved_model", "saved_model/saved_model.pb"]),
    ]
    assert json.loads((tmp_path / "versions" / str(version) / "metrics.json").read_text())["final"] is False


def test_exports_replace_what_is_there_and_leave_no_temporary_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "saved_model").mkdir(parents=True)
    (out / "saved_model" / "stale.pb").write_text("old")
    (out / "metrics.json").write_text("{}")
    (out / ".export-7-interrupted").mkdir()  # a worker killed while exporting version 7
    weights = {"w": [1.0]}

    def write_model(folder: Path) -> None:
        (folder / "model.keras").write_text(json.dumps(weights))
        (folder / "saved_model").mkdir()
        (folder / "saved_model" / "saved_model.pb").write_text("new")

    target = exporter(out)
    assert target.write(write_model, 7, final=True, metrics={"model_version": 7}) == str(out)
    weights = {"w": [2.0]}
    assert target.write(write_model, 9, final=False, metrics={"model_version": 9}) == f"{out}/versions/9"
    weights = {"w": [3.0]}
    target.write(write_model, 9, final=False, metrics={"model_version": 9})  # again (a requeued export)
    assert visible(out) == [
        "job.json", "metrics.json", "model.keras", "saved_model", "saved_model/saved_model.pb",
        "versions", "versions/9", "versions/9/job.json", "versions/9/metrics.json", "versions/9/model.keras",
        "versions/9/saved_model", "versions/9/saved_model/saved_model.pb",
    ]  # fmt: skip
    assert json.loads((out / "metrics.json").read_text()) == {"model_version": 7}
    assert json.loads((out / "model.keras").read_text()) == {"w": [1.0]}
    assert json.loads((out / "versions" / "9" / "model.keras").read_text()) == {"w": [3.0]}


def test_an_export_to_an_object_store_is_uploaded_with_metrics_last() -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    written: list[str] = []
    original = fs.put_file

    def put_file(local: str, remote: str, *args: object, **kwargs: object) -> None:
        written.append(remote.rsplit("/", 1)[-1])
        original(local, remote, *args, **kwargs)

    fs.put_file = put_file  # memory:// is one shared instance: the exporter's upload goes through this

    def write_model(folder: Path) -> None:
        (folder / "model.keras").write_text("model")
        (folder / "saved_model").mkdir()
        (folder / "saved_model" / "saved_model.pb").write_text("graph")

    try:
        assert exporter("memory://bucket/job").write(write_model, 3, True, {"model_version": 3}) == "memory://bucket/job"
    finally:
        del fs.put_file
    assert written == ["saved_model.pb", "job.json", "model.keras", "metrics.json"]
    assert fs.cat("/bucket/job/model.keras") == b"model"
    assert json.loads(fs.cat("/bucket/job/metrics.json")) == {"model_version": 3}


@pytest.mark.parametrize(
    ("path", "remote"),
    [("s3://bucket/x", True), ("gs://b", True), ("memory://b", True), ("file:///tmp/x", False),
     ("/tmp/x", False), (".elasticps/models/job", False), ("C:/x", False)],
)  # fmt: skip
def test_is_remote(path: str, remote: bool) -> None:
    assert is_remote(path) is remote


def test_pull_settled_waits_for_a_shard_behind_and_refuses_or_settles_for_less() -> None:
    ps = FakePS(UpdateRule.ASYNC)
    model = make_model(ps, FakeTrainer())
    model.initialise()
    ps.others_update(shard=0)
    ps.on_wait = lambda: ps.others_update(shard=1)  # the shard behind catches up while the pull waits
    assert model.pull_settled(wait_ms=10, attempts=3, strict=True) == 1
    ps.others_update(shard=0)  # shard 0 at 2, shard 1 stays at 1
    with pytest.raises(NotSettled):
        model.pull_settled(wait_ms=10, attempts=3, strict=True)
    assert model.pull_settled(wait_ms=10, attempts=3, strict=False) == 1  # async periodic: the oldest


def test_the_status_call_failing_does_not_stop_an_export(tmp_path: Path) -> None:
    rig = make_worker(TrainingMode(), [export_task(1, 0)], exporter=exporter(tmp_path))

    def unreachable(timeout_s: float = 5.0) -> pb.JobStatus:
        raise ConnectionError("coordinator unreachable")

    rig.coordinator.status = unreachable  # type: ignore[method-assign]
    rig.worker.run()
    assert rig.coordinator.reports[0].success
    assert "metrics" not in json.loads((tmp_path / "metrics.json").read_text())
