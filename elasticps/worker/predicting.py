"""Writing one prediction task's outputs: a JSON-lines file that appears whole or not at all.

Caller: the training loop, for a prediction task (``training.py``), with the model's outputs for
records ``[start, end)`` of the prediction data (the backend's ``Trainer.predict``). No framework here:
outputs arrive as numpy arrays.

Each task writes ``<output>/predictions/part-<start>-<end>.jsonl`` (``api/output.py`` names it),
one line per record, in record order::

    {"index": 17, "output": [-1.3, 2.4], "class": 1, "label": 1}

``index`` is the record's number in the prediction data; ``output`` the model's output for it as
nested lists (a model with several outputs gives an object of them, by name or position);
``class`` the argmax, when the output is one vector of two or more scores (classes); ``label`` the
record's label, when the reader gives numeric labels (handy for scoring; never used by the model).

A file is written whole, then put in place: locally a temporary file in the same folder renamed
over it (``files.atomic_writer``), to an object store one upload of a one-file folder
(``storage.upload``; a put of one object is atomic). A task written again (its first worker died
or went silent) therefore replaces its file, and a reader never sees half of one.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elasticps.api.output import prediction_file, predictions_path
from elasticps.files import atomic_writer
from elasticps.storage import is_remote, upload
from elasticps.worker.exporting import local_path

Outputs = np.ndarray | Mapping[str, np.ndarray] | Sequence[np.ndarray]


class PredictionError(Exception):
    """Outputs that do not match the task's records (a data function that dropped or added some)."""


def _rows(outputs: Outputs) -> list[np.ndarray]:
    if isinstance(outputs, np.ndarray):
        return [outputs]
    if isinstance(outputs, Mapping):
        return [np.asarray(v) for v in outputs.values()]
    return [np.asarray(v) for v in outputs]


def _record(outputs: Outputs, i: int) -> Any:
    if isinstance(outputs, np.ndarray):
        return outputs[i].tolist()
    if isinstance(outputs, Mapping):
        return {str(name): np.asarray(value)[i].tolist() for name, value in outputs.items()}
    return [np.asarray(value)[i].tolist() for value in outputs]


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such numbers are written as null."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def json_lines(start: int, end: int, outputs: Outputs, labels: np.ndarray | None = None) -> str:
    """The lines of records ``[start, end)``; raises :class:`PredictionError` when an output does
    not have one row per record."""
    count = end - start
    for array in _rows(outputs):
        if array.ndim == 0 or len(array) != count:
            rows = "a scalar" if array.ndim == 0 else f"{len(array)} rows"
            raise PredictionError(
                f"records {start}-{end}: the model gave {rows} for {count} records (the data "
                "function must keep one element per record in prediction mode)"
            )
    classes = None
    if isinstance(outputs, np.ndarray) and outputs.ndim == 2 and outputs.shape[1] > 1:
        classes = np.argmax(outputs, axis=1)
    numeric_labels = (
        labels is not None and len(labels) == count and (np.issubdtype(labels.dtype, np.number) or labels.dtype == bool)
    )
    lines = []
    for i in range(count):
        line: dict[str, Any] = {"index": start + i, "output": _finite(_record(outputs, i))}
        if classes is not None:
            line["class"] = int(classes[i])
        if numeric_labels:
            assert labels is not None
            line["label"] = _finite(labels[i].tolist())
        lines.append(json.dumps(line, separators=(",", ":")))
    return "".join(line + "\n" for line in lines)


@dataclass(frozen=True)
class PredictionWriter:
    """The job's output (``spec.output``); each task's file goes under its ``predictions/``."""

    output: str

    @property
    def folder(self) -> str:
        return predictions_path(self.output)

    def write(self, start: int, end: int, outputs: Outputs, labels: np.ndarray | None = None) -> str:
        """Writes the predictions of records ``[start, end)``; returns the file's path or URI."""
        text = json_lines(start, end, outputs, labels).encode("utf-8")
        name = prediction_file(start, end)
        destination = f"{self.folder}/{name}"
        if is_remote(destination):
            with tempfile.TemporaryDirectory(prefix="elasticps-predictions-") as scratch:
                (Path(scratch) / name).write_bytes(text)
                upload(scratch, self.folder)
        else:
            path = local_path(destination)
            # The temporary file's name starts with a dot: a reader globbing part-*.jsonl skips it.
            with atomic_writer(path, prefix=f".{name}.") as (file, _):
                file.write(text)
        return destination
