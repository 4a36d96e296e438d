"""What a job's coordinator needs to cut its data into tasks: record counts only (it never loads the
data itself). Read by PS 0 (``ps/main.py``) and by the standalone coordinator of a decentralized
job (``coordinator/main.py``)."""

from __future__ import annotations

from elasticps.api.spec import DataSpec, PredictionSpec, TrainingSpec
from elasticps.coordinator.tasks.base import QueueSettings
from elasticps.data.readers import DataError, ReaderOptions, open_reader


def queue_settings(data: DataSpec, t: TrainingSpec, prediction: PredictionSpec, output: str) -> QueueSettings:
    """The task queue's settings; :class:`DataError` for data it cannot count. A job that predicts
    with an exported model (``--prediction_model``) has no training data."""
    if not data.training and not prediction.standalone:
        raise DataError("the coordinator needs --training_data (or --prediction_model and --prediction_data)")
    if prediction.enabled and not output:
        raise DataError("--prediction_data needs --output (the predictions go to <output>/predictions/)")
    options = ReaderOptions.of(data)
    records = open_reader(data.reader, data.training, options).num_records if data.training else 0
    validation = open_reader(data.reader, data.validation, options).num_records if data.validation else 0
    to_predict = open_reader(data.reader, prediction.data, options).num_records if prediction.enabled else 0
    if data.training and records == 0:
        raise DataError(f"--training_data {data.training}: holds no records")
    if prediction.enabled and to_predict == 0:
        raise DataError(f"--prediction_data {prediction.data}: holds no records")
    return QueueSettings(
        num_records=records,
        records_per_task=t.records_per_task,
        num_epochs=t.num_epochs,
        validation_records=validation,
        evaluation_steps=t.evaluation_steps,
        task_timeout=t.task_timeout_seconds,
        export=bool(output),
        export_steps=t.export_steps,
        prediction_records=to_predict,
        stall_records=round(t.stall_epochs * records),
        fail_unhealthy=t.fail_unhealthy,
        seed=t.seed,
    )
