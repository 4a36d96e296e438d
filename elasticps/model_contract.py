"""What elasticps hands a model module's data function: the :class:`Mode` and the :class:`Metadata`.

A model module (``--model_def``; ``elasticps/backends/keras/model_loading.py`` checks it) may give
``dataset_fn(dataset, mode, metadata)``, the data function of ElasticDL's model zoo, or
``feed(dataset, mode)``. The worker's trainer (its framework's backend) calls it with these two.
Both are importable as ``from elasticps import Mode, Metadata``, so an ElasticDL module changes one
import line, ``from elasticdl.python.common.constants import Mode``, and nothing else.

Standard library only: every process imports the ``elasticps`` package, the PS too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Mode(StrEnum):
    """What the records are for. A ``str``: ``Mode.TRAINING == "training"``, as ElasticDL's string
    constants, so ``feed`` modules comparing ``mode`` with the strings keep working."""

    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


@dataclass(frozen=True)
class Metadata:
    """What the worker knows about the records beside the records themselves.

    ``column_names``: the names of the feature columns, for readers of tabular data that know them
    (a reader exposing a ``column_names`` attribute); ``None`` for the others (idx, npz, tfrecord),
    as ElasticDL gives ``None`` where its reader has none. ``reader``: the ``spec.data.reader`` the
    records came through (``"idx"``, ``"npz"``, ...), empty when unknown.
    """

    column_names: tuple[str, ...] | None = None
    reader: str = ""
