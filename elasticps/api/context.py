"""One role's job, parsed once from its command line: what ``elasticps ps``, ``elasticps worker``
and ``elasticps coordinator`` share.

Every replica of a job is started with the same job flags (``api/replicas.py`` renders them from
the TrainingJob: data, training, prediction and the output), beside flags of its own role. Each
role's ``config_from_args`` adds its own and takes the job from here, as one
:class:`RoleContext`: the spec parts, which replica this is, and the training mode, derived once
(``TrainingMode.of``) and refused here, as argparse refuses a bad value, when the flags combine
into a mode no TrainingJob may have.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from elasticps.api.flags import (
    add_data_flags,
    add_prediction_flags,
    add_training_flags,
    data_from_args,
    prediction_from_args,
    training_and_mode_from_args,
)
from elasticps.api.modes import TrainingMode
from elasticps.api.replicas import Role
from elasticps.api.spec import DataSpec, PredictionSpec, TrainingSpec


@dataclass(frozen=True)
class RoleContext:
    """Replica ``index`` of ``role`` and the job it serves. ``output``: ``spec.output``, where the
    job's model and predictions go ("": none)."""

    role: Role
    index: int
    data: DataSpec
    training: TrainingSpec
    prediction: PredictionSpec
    mode: TrainingMode
    output: str = ""


def add_job_flags(parser: argparse.ArgumentParser, output_help: str) -> None:
    """The flags every role takes from the job: ``--output`` (said in the role's own words) and
    one flag per field of ``spec.data``, ``spec.training`` and ``spec.prediction``."""
    parser.add_argument("--output", default="", help=output_help)
    add_data_flags(parser)
    add_training_flags(parser)
    add_prediction_flags(parser)


def context_from_args(args: argparse.Namespace, role: Role, index: int = 0) -> RoleContext:
    training, mode = training_and_mode_from_args(args)
    return RoleContext(
        role=role,
        index=index,
        data=data_from_args(args),
        training=training,
        prediction=prediction_from_args(args),
        mode=mode,
        output=args.output,
    )
