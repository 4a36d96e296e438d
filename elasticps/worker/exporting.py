"""Writing one export into the job's output, so that no reader ever sees a half-written model.

Callers: the training loop, for an export task (``training.py``, the model written by the
trainer's ``export``), and ``elasticps export`` (``checkpoint_export.py``, the model rebuilt from
PS checkpoints). Both hand :meth:`Exporter.write` a function that writes the model files
(``model.keras``, ``saved_model/``) into a folder; this module adds ``job.json`` and
``metrics.json`` and puts the folder where ``api/output.py`` says. No TensorFlow here.

Local outputs: the export is written into a hidden temporary folder beside its destination
(``.export-<version>-*``, same filesystem), then renamed into place: a periodic export's folder
``versions/<version>`` in one rename; the final export entry by entry into the output folder
itself (it also holds ``versions/``), the old ``metrics.json`` removed first and the new one moved
last, so a ``metrics.json`` present always describes the files beside it. A folder or file being
replaced is renamed aside first and deleted after. An export interrupted (its worker killed) leaves
its temporary folder behind; the next export of the same version deletes it.
Object stores (``s3://...``): written into a local temporary folder, uploaded with
``storage.upload``, ``metrics.json`` in a second upload after everything else.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticps.api.output import JOB_FILE, METRICS_FILE, export_path
from elasticps.proto import elasticps_pb2 as pb
from elasticps.storage import is_remote, upload

ModelWriter = Callable[[Path], None]  # writes model.keras and saved_model/ into the folder given

_TEMP_PREFIX = ".export-"


class ExportError(Exception):
    """An export that cannot be written (the model is not the one asked for, the output refuses)."""


def local_path(path: str) -> Path:
    """A local output as a path (``file:///x`` is ``/x``)."""
    return Path(path.removeprefix("file://")) if path.startswith("file://") else Path(path)


def metrics_document(status: pb.JobStatus | None, version: int, final: bool, **extra: Any) -> dict[str, Any]:
    """``metrics.json``: the exported version and, from the coordinator's status when known, the
    latest test metrics with the version they evaluated, the training loss, records and epochs."""
    document: dict[str, Any] = {"model_version": version, "final": final, "exported_at": round(time.time(), 3)}
    if status is not None:
        document.update(
            metrics=dict(status.metrics),
            metrics_version=status.metrics_version,
            loss=status.loss if status.loss == status.loss else None,  # JSON has no NaN
            records_trained=status.records_done,
            records_total=status.records_total,
            epochs=status.num_epochs,
            epoch_records=list(status.epoch_records),
            shard_versions=list(status.shard_versions),
        )
    document.update(extra)
    return document


@dataclass(frozen=True)
class Exporter:
    """The job's output folder and the ``job.json`` written into each export."""

    output: str
    job: Mapping[str, Any]

    def write(self, write_model: ModelWriter, version: int, final: bool, metrics: Mapping[str, Any]) -> str:
        """Writes one export (the final model, or the periodic one of ``version``); returns where."""
        destination = export_path(self.output, version, final)
        if is_remote(destination):
            self._upload(write_model, destination, metrics)
        else:
            self._write_local(write_model, local_path(destination), version, final, metrics)
        return destination

    def _fill(self, folder: Path, write_model: ModelWriter) -> None:
        write_model(folder)
        (folder / JOB_FILE).write_text(json.dumps(self.job, indent=2, sort_keys=True) + "\n")

    def _upload(self, write_model: ModelWriter, destination: str, metrics: Mapping[str, Any]) -> None:
        with tempfile.TemporaryDirectory(prefix="elasticps-export-") as scratch:
            files, last = Path(scratch) / "files", Path(scratch) / "last"
            files.mkdir()
            last.mkdir()
            self._fill(files, write_model)
            _write_json(last / METRICS_FILE, metrics)
            upload(files, destination)
            upload(last, destination)

    def _write_local(
        self, write_model: ModelWriter, destination: Path, version: int, final: bool, metrics: Mapping[str, Any]
    ) -> None:
        parent = destination if final else destination.parent
        parent.mkdir(parents=True, exist_ok=True)
        stem = f"{_TEMP_PREFIX}{version}-"
        temporary = Path(tempfile.mkdtemp(prefix=stem, dir=parent))
        try:
            self._fill(temporary, write_model)
            _write_json(temporary / METRICS_FILE, metrics)
            if final:
                _move_into(temporary, destination)
            else:
                _replace(temporary, destination)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        for leftover in parent.glob(f"{stem}*"):  # interrupted earlier exports of this version
            shutil.rmtree(leftover, ignore_errors=True)


def _write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def _replace(source: Path, target: Path) -> None:
    """Renames ``source`` onto ``target``; an existing ``target`` is renamed aside first, then deleted."""
    if not target.exists() and not target.is_symlink():
        os.replace(source, target)
        return
    aside = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}old-", dir=target.parent)) / target.name
    os.replace(target, aside)
    try:
        os.replace(source, target)
    finally:
        shutil.rmtree(aside.parent, ignore_errors=True)


def _move_into(folder: Path, output: Path) -> None:
    """Moves every entry of ``folder`` into ``output``: the old metrics.json goes first, the new
    one comes last."""
    (output / METRICS_FILE).unlink(missing_ok=True)
    entries = sorted(folder.iterdir(), key=lambda p: (p.name == METRICS_FILE, p.name))
    for entry in entries:
        target = output / entry.name
        if entry.is_dir() or target.is_dir():
            _replace(entry, target)
        else:
            os.replace(entry, target)
