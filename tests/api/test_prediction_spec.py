"""spec.prediction: parsing (output required, a model path without training data), the flags and
command lines it becomes, and the prediction files' names."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from job_builders import job_document

from elasticps.api.flags import add_prediction_flags, prediction_args, prediction_from_args
from elasticps.api.output import prediction_file, predictions_path
from elasticps.api.parsing import SpecError, parse_job
from elasticps.api.replicas import ps_replica, worker_replica
from elasticps.api.spec import PredictionSpec


def predicting(prediction: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return job_document({"output": "/out", "prediction": prediction, **spec})


def exported_model_only() -> dict[str, Any]:
    document = predicting({"data": "/p/t10k", "model": "/models/mnist"})
    del document["spec"]["data"]["training"]
    return document


def test_a_job_without_prediction_predicts_nothing() -> None:
    job = parse_job(job_document())
    assert job.spec.prediction == PredictionSpec() and not job.spec.prediction.enabled


def test_train_then_predict() -> None:
    job = parse_job(predicting({"data": "/p/t10k"}))
    assert job.spec.prediction.enabled and not job.spec.prediction.standalone
    assert job.spec.data.training == "/data/train"


def test_predicting_with_an_exported_model_needs_no_training_data() -> None:
    job = parse_job(exported_model_only())
    assert job.spec.prediction.standalone
    assert job.spec.data.training == ""


@pytest.mark.parametrize(
    "document,message",
    [
        (job_document({"prediction": {"data": "/p"}}), "spec.output: required with spec.prediction"),
        (job_document({"output": "", "prediction": {"data": "/p"}}), "spec.output: required with spec.prediction"),
        (predicting({"model": "/m"}), "spec.prediction.model: needs spec.prediction.data"),
        (predicting({"data": "/p", "model": "/m"}), "spec.data.training: must be empty when spec.prediction.model is set"),
        (
            predicting({"data": "/p", "model": "/m"}, data={"training": "", "validation": "/v"}),
            "spec.data.validation: must be empty when spec.prediction.model is set",
        ),
        (job_document({"data": {"training": ""}}), "spec.data.training: must not be empty (or set spec.prediction.model"),
        (predicting({"data": " /p"}), "spec.prediction.data: must not start or end with blanks"),
        (predicting({"data": "/p", "modle": "/m"}), "spec.prediction.modle: unknown field"),
    ],
)
def test_bad_prediction_specs_are_refused_naming_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_job(document)
    assert str(raised.value).startswith(message), raised.value


def test_export_steps_need_training() -> None:
    document = exported_model_only()
    document["spec"]["training"] = {"exportSteps": 10}
    with pytest.raises(SpecError, match=r"^spec.training.exportSteps: a job that predicts with spec.prediction.model"):
        parse_job(document)


def test_flags_round_trip() -> None:
    spec = PredictionSpec(data="s3://b/t10k", model="/models/m")
    args = prediction_args(spec)
    assert args == ["--prediction_data=s3://b/t10k", "--prediction_model=/models/m"]
    parser = argparse.ArgumentParser()
    add_prediction_flags(parser)
    assert prediction_from_args(parser.parse_args(args)) == spec
    assert prediction_args(PredictionSpec()) == []


def test_ps_0_and_the_workers_get_the_prediction_flags() -> None:
    job = parse_job(exported_model_only())
    ps0 = ps_replica(job, 0, host="127.0.0.1", port=0)
    ps1 = ps_replica(job, 1, host="127.0.0.1", port=0)
    worker = worker_replica(job, 0, ["a:1", "b:2"])
    for replica in (ps0, worker):
        assert "--prediction_data=/p/t10k" in replica.args and "--prediction_model=/models/mnist" in replica.args
        assert not any(arg.startswith("--training_data") for arg in replica.args)
    assert not any(arg.startswith("--prediction") for arg in ps1.args)


def test_prediction_files_sort_in_record_order() -> None:
    assert predictions_path("s3://b/out/") == "s3://b/out/predictions"
    assert prediction_file(0, 2048) == "part-0000000000-0000002048.jsonl"
    names = [prediction_file(start, start + 100) for start in (0, 100, 900, 1000, 10_000)]
    assert names == sorted(names)


def test_the_mnist_prediction_example_reads_the_model_the_mnist_example_exports() -> None:
    from pathlib import Path

    from elasticps.api.parsing import load_job_file

    examples = Path(__file__).resolve().parents[2] / "examples"
    trained = load_job_file(examples / "mnist.yaml")
    job = load_job_file(examples / "mnist-predict.yaml")
    assert job.spec.prediction.standalone and job.spec.prediction.model == trained.spec.output
    assert job.spec.prediction.data == trained.spec.data.validation  # the t10k test set
    assert job.spec.model == trained.spec.model and job.spec.data.reader == trained.spec.data.reader
