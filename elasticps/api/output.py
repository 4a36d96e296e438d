"""A job's output folder (``spec.output``): where each export goes and the job document beside it. Pure.

Callers: PS 0's coordinator (the path it reports in ``JobStatus``, and why an export failed:
:func:`export_failure`), the worker's exporter (where it writes, ``worker/exporting.py``) and
``elasticps export`` (the same files from checkpoints).
The output is a local path, a path on a mounted volume, or an object-store URI; paths are joined
with ``/`` so the same function serves all three. Layout::

    <output>/model.keras            the final model: keras.models.load_model(...)
    <output>/saved_model/           the same model as a TensorFlow SavedModel: tf.saved_model.load(...)
                                    (a torch model instead: model.safetensors, its state_dict, and
                                    model.pt2, torch.export.load(...).module())
    <output>/job.json               the TrainingJob it came from (model, data, training, output)
    <output>/metrics.json           its version and final metrics; written last
    <output>/versions/<version>/    the same four files for each periodic export (exportSteps)
    <output>/predictions/part-<start>-<end>.jsonl
                                    batch prediction (spec.prediction): one file per prediction task,
                                    one JSON line per record of [start, end)
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from elasticps.api.fields import camel
from elasticps.api.spec import API_VERSION, KIND, DataSpec, Framework, ModelSpec, TrainingSpec

KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"
TORCH_STATE_FILE = "model.safetensors"
TORCH_PROGRAM_FILE = "model.pt2"
# The file a prediction job loads, per framework.
MODEL_FILES = {Framework.KERAS: KERAS_FILE, Framework.TORCH: TORCH_PROGRAM_FILE}
JOB_FILE = "job.json"
METRICS_FILE = "metrics.json"
LOADING_FILE = "loading.json"  # a Keras export: how model.keras loads in a fresh process, or why it is left out
VERSIONS_DIR = "versions"
PREDICTIONS_DIR = "predictions"
PART_DIGITS = 10  # record numbers in prediction file names are zero-padded to this many digits (at least)


def export_path(output: str, version: int, final: bool) -> str:
    """Where the export of ``version`` goes: the output folder itself for the job's final model,
    ``<output>/versions/<version>`` for a periodic one."""
    if final:
        return output
    return f"{output.rstrip('/')}/{VERSIONS_DIR}/{version}"


def predictions_path(output: str) -> str:
    """The folder of a job's predictions: ``<output>/predictions``."""
    return f"{output.rstrip('/')}/{PREDICTIONS_DIR}"


def prediction_file(start: int, end: int) -> str:
    """The file name of the predictions of records ``[start, end)``: ``part-<start>-<end>.jsonl``,
    zero-padded so that the names sort in record order; one name per task, so a task written again
    (its first worker died) replaces its file."""
    return f"part-{start:0{PART_DIGITS}d}-{end:0{PART_DIGITS}d}.jsonl"


ERROR_CHARS = 400  # of a worker's error, in a job's Failed condition


def export_failure(
    output: str, version: int, final: bool, attempts: int, error: str, checkpoint_dir: str = "", checkpoint_steps: int = 0
) -> str:
    """Why a job failed when its output refused an export every attempt: what, where, the last
    error, and what is left to export the model from once the output works."""
    what = "the final model" if final else "the periodic export of the model"
    error = " ".join(error.split()).rstrip(".")
    if len(error) > ERROR_CHARS:
        error = error[: ERROR_CHARS - 3] + "..."
    message = (
        f"could not write {what} (version {version}) to {export_path(output, version, final)}: "
        f"{attempts} attempts failed, the last with {error or 'no error given'}."
    )
    if checkpoint_dir and checkpoint_steps > 0:
        return message + (
            f" The PS checkpoints in {checkpoint_dir} are kept: once the output works, `elasticps export "
            f"{checkpoint_dir} --job JOB.yaml --out {output}` writes the newest version every shard checkpointed."
        )
    return message + " The PS wrote no checkpoints (spec.training.checkpointSteps is 0): the model cannot be exported later."


def document(instance: Any) -> Any:
    """A spec dataclass as the YAML spells it: camelCase keys, enums as their values, every field."""
    if dataclasses.is_dataclass(instance) and not isinstance(instance, type):
        return {camel(f.name): document(getattr(instance, f.name)) for f in dataclasses.fields(instance)}
    if isinstance(instance, Enum):
        return instance.value
    if isinstance(instance, dict):
        return {str(k): document(v) for k, v in instance.items()}
    if isinstance(instance, (list, tuple)):
        return [document(v) for v in instance]
    return instance


def exported_job(name: str, model: ModelSpec, data: DataSpec, training: TrainingSpec, output: str) -> dict[str, Any]:
    """``job.json``: a TrainingJob document with the fields that made the model (replicas, image and
    run policy are left out: a worker does not know them, and they do not change the weights).
    ``elasticps export --job job.json`` reads it back."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "model": document(model),
            "data": document(data),
            "training": document(training),
            "output": output,
        },
    }
