"""``elasticps export``: the files of an export, assembled after the fact from PS checkpoints.

For a job that failed late or was stopped, or one without ``spec.output``: every PS shard's
checkpoint folder (``<checkpointDir>/ps-<i>``, or the folder holding them) and the job's YAML give
the same model files (``model.keras`` and ``saved_model/`` for Keras), ``job.json`` and
``metrics.json`` a finished job writes (``exporting.py``). The version is the newest one every
shard has a good checkpoint of (or the one asked for); the model is built by the job's framework
backend (``spec.model.framework``, :meth:`~elasticps.backends.api.Backend.export_model`) from the
model module on one training record, as a worker builds it, and every checkpointed tensor is
assigned to the model variable of its name.

Checkpoint keys (``ps/checkpointing.py``): each table's entries under its own prefix (the dense
table's ``var/<variable path>``), the optimizer's under ``opt/``. Optimizer entries are skipped;
every other entry must name a model variable, trainable or not, after its table prefix; the row
slices of a variable split over shards (``<name>#rows<start>:<stop>``, ``psclient/sharding.py``) are
joined first, and must cover its rows exactly once (:func:`join_slices`). A trainable
variable no shard holds is an error; a non-trainable one (a seed, a statistic the PS does not keep)
keeps its initial value, and is named on stderr.

Callers: ``cli.py`` only, which imports this module when the command runs (the backend, and its
framework, are imported when an export is made). Every problem raises :class:`ExportProblem`, one line.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elasticps.api.output import exported_job
from elasticps.api.spec import TrainingJob
from elasticps.backends.api import ModelError, Variable
from elasticps.ps import checkpoint
from elasticps.ps.checkpoint_deltas import load_whole
from elasticps.psclient.sharding import parse_slice
from elasticps.worker.exporting import Exporter, metrics_document

OPTIMIZER_PREFIX = "opt/"  # the optimizer's entries in a checkpoint (slots, step counts)


class ExportProblem(Exception):
    """Why no export can be assembled (a bad folder, job, checkpoint or model); one line."""


def shard_folders(paths: Sequence[Path]) -> list[Path]:
    """The shard folders named, a folder that holds ``ps-<i>`` folders standing for all of them."""
    folders: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise ExportProblem(f"{path}: no such checkpoint folder")
        shards = sorted(path.glob("ps-*"), key=lambda p: (len(p.name), p.name))
        if not checkpoint.list_checkpoints(path) and shards:
            folders += [p for p in shards if p.is_dir()]
        else:
            folders.append(path)
    return folders


def newest_common(folders: Sequence[Path], wanted: int | None = None) -> tuple[int, list[checkpoint.Checkpoint]]:
    """The newest version (or ``wanted``) every folder has a good checkpoint of, and those checkpoints."""
    held: list[set[int]] = []
    for folder in folders:
        versions = {v for v in (checkpoint.version_of(p) for p in checkpoint.list_checkpoints(folder)) if v is not None}
        if not versions:
            raise ExportProblem(f"{folder}: holds no checkpoint (ckpt-<version>.eps)")
        held.append(versions)
    common = sorted(set.intersection(*held), reverse=True)
    if wanted is not None:
        if wanted not in common:
            raise ExportProblem(f"version {wanted} is not checkpointed by every shard (common: {common or 'none'})")
        common = [wanted]
    if not common:
        described = "; ".join(f"{f}: {sorted(v)}" for f, v in zip(folders, held))
        raise ExportProblem(f"no version is checkpointed by every shard ({described})")
    problems: list[str] = []
    for version in common:
        try:
            return version, [load_whole(f, version) for f in folders]  # a delta with its base (checkpointFullEvery)
        except checkpoint.CheckpointError as err:
            problems.append(str(err))
            print(f"elasticps export: skipping version {version}: {err}", file=sys.stderr)
    raise ExportProblem(f"no good checkpoint of a version every shard has: {problems[-1]}")


def model_tensors(found: Sequence[checkpoint.Checkpoint], folders: Sequence[Path]) -> dict[str, np.ndarray]:
    """Every shard's table entries (not the optimizer's) in one mapping; a shard given twice is refused."""
    shards: dict[Any, Path] = {}
    tensors: dict[str, np.ndarray] = {}
    for ckpt, folder in zip(found, folders):
        shard = ckpt.meta.get("shard")
        if shard is not None and shard in shards:
            raise ExportProblem(f"{folder} and {shards[shard]} both hold PS shard {shard}")
        shards[shard] = folder
        for key, value in ckpt.arrays.items():
            if key.startswith(OPTIMIZER_PREFIX):
                continue
            if key in tensors:
                raise ExportProblem(f"{key} is in more than one shard's checkpoint ({folder})")
            tensors[key] = value
    return join_slices(tensors)


def join_slices(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``tensors`` with the row slices of each split tensor joined into the whole tensor, under its
    own name; slices that leave rows out, overlap, or disagree in their other dimensions are refused."""
    joined: dict[str, np.ndarray] = {}
    slices: dict[str, list[tuple[int, int, np.ndarray]]] = {}
    for key, value in tensors.items():
        found = parse_slice(key)
        if found is None:
            joined[key] = value
        else:
            name, start, stop = found
            slices.setdefault(name, []).append((start, stop, value))
    for name, parts in sorted(slices.items()):
        parts.sort(key=lambda part: part[0])
        expected = 0
        for start, stop, value in parts:
            if start != expected or value.ndim == 0 or value.shape[0] != stop - start:
                raise ExportProblem(f"the row slices of {name!r} do not join (rows {start}:{stop} after {expected})")
            expected = stop
        try:
            whole = np.concatenate([value for _, _, value in parts])
        except ValueError as err:
            raise ExportProblem(f"the row slices of {name!r} do not join: {err}") from None
        if name in joined:
            raise ExportProblem(f"{name!r} is in the checkpoints both whole and in row slices")
        joined[name] = whole
    return joined


def match(tensors: Mapping[str, np.ndarray], variables: Mapping[str, Variable]) -> tuple[dict[str, np.ndarray], list[str]]:
    """Checkpoint entries by model variable path, and the non-trainable variables none sets.

    An entry names its variable after its table's prefix (``var/mlp/dense/kernel``); an entry
    saved under the bare path is taken too."""
    assigned: dict[str, np.ndarray] = {}
    for key, value in sorted(tensors.items()):
        name = next((n for n in (key.split("/", 1)[-1], key) if n in variables), None)
        if name is None:
            raise ExportProblem(f"the checkpoint holds {key!r}, which the model has no variable for (another model?)")
        if tuple(value.shape) != variables[name].shape:
            raise ExportProblem(
                f"{key!r} has shape {tuple(value.shape)} in the checkpoint, the model's variable {tuple(variables[name].shape)}"
            )
        assigned[name] = value
    missing = sorted(n for n, v in variables.items() if v.trainable and n not in assigned)
    if missing:
        raise ExportProblem(f"no checkpoint holds the model's variables {missing} (a shard's folder missing?)")
    untouched = sorted(n for n, v in variables.items() if not v.trainable and n not in assigned)
    return assigned, untouched


def export_from_checkpoints(paths: Sequence[Path], job: TrainingJob, out: str, version: int | None = None) -> int:
    """Writes the export of the newest common checkpointed version into ``out``; returns that version."""
    from elasticps.backends.registry import backend_for
    from elasticps.data.readers import DataError, ReaderOptions, open_reader

    folders = shard_folders(paths)
    found_version, found = newest_common(folders, version)
    tensors = model_tensors(found, folders)
    spec = job.spec
    try:
        backend = backend_for(spec.model.framework)
        module = backend.load_model(spec.model.model_def)
        features, labels = open_reader(spec.data.reader, spec.data.training, ReaderOptions.of(spec.data)).read(0, 1)
        model = backend.export_model(module, spec.model.params, spec.training.minibatch_size, features, labels)
    except (ModelError, DataError) as err:
        raise ExportProblem(str(err)) from None
    assigned, untouched = match(tensors, model.variables())
    for name, value in assigned.items():
        model.assign(name, value)
    if untouched:
        print(f"elasticps export: not in the checkpoints, left at their initial values: {untouched}", file=sys.stderr)
    exporter = Exporter(out, exported_job(job.name, spec.model, spec.data, spec.training, spec.output))
    metrics = metrics_document(None, found_version, True, source="checkpoints", checkpoints=[str(f) for f in folders])
    try:
        exporter.write(model.export, found_version, True, metrics)
    except OSError as err:
        raise ExportProblem(f"{out}: cannot write: {err}") from None
    return found_version
