"""Training settings and data settings as command-line flags, both ways, derived from
:class:`TrainingSpec` and :class:`DataSpec`.

``elasticps ps`` and ``elasticps worker`` take the same training and data flags (ElasticDL style): booleans
accept ``--use_async`` as well as ``--use_async=true`` / ``--use_async=false``; ElasticDL's
``--get_model_steps`` is an alias of ``--get_model_frequency``. The planner renders a spec back into
flags with :func:`training_args` and :func:`data_args`, so a pod's arguments and the YAML can never
disagree. A flag is named after its field unless the field says otherwise (``FieldInfo.flag``:
``spec.data.training`` is ``--training_data``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from enum import Enum
from typing import Any, TypeVar

from elasticps.api.fields import check_bounds, field_info, snake
from elasticps.api.modes import TrainingMode
from elasticps.api.spec import DataSpec, DecentralizedSpec, PredictionSpec, TrainingSpec

T = TypeVar("T")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _bounded(kind: type, field: dataclasses.Field[Any]) -> Any:
    info = field_info(field)

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            if issubclass(kind, Enum):
                raise argparse.ArgumentTypeError(
                    f"expected one of {', '.join(m.value for m in kind)}, got {text!r}"
                ) from None
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if isinstance(value, (int, float)):
            try:
                check_bounds(value, info, "value")
            except ValueError as err:
                raise argparse.ArgumentTypeError(str(err).removeprefix("value: ")) from None
        problem = info.check(value) if info.check is not None else None
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = kind.__name__
    return convert


def _add_spec_flags(
    group: argparse._ArgumentGroup, cls: type[Any], required: bool = False
) -> None:
    """One flag per field of dataclass ``cls`` (named by ``FieldInfo.flag_name``), with its default
    and help. A field without a default is ``required``, or else defaults to an empty string."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        info = field_info(field)
        flag = info.flag_name(field)
        names = [f"--{flag}", *(f"--{alias}" for alias in info.aliases)]
        kind = hints[field.name]
        if kind is bool:
            group.add_argument(
                *names,
                dest=flag,
                nargs="?",
                const=True,
                default=field.default,
                type=parse_bool,
                metavar="BOOL",
                help=f"{info.help} (default: {str(field.default).lower()})",
            )
        elif field.default is dataclasses.MISSING:
            group.add_argument(
                *names, dest=flag, required=required, default="", type=_bounded(kind, field), help=info.help
            )
        else:
            default = field.default.value if isinstance(field.default, Enum) else field.default
            shown = default if default != "" else "empty"
            group.add_argument(
                *names,
                dest=flag,
                default=field.default,
                type=_bounded(kind, field),
                help=f"{info.help} (default: {shown})",
            )


def _spec_from_args(cls: type[T], args: argparse.Namespace) -> T:
    fields = dataclasses.fields(typing.cast(Any, cls))
    return cls(**{f.name: getattr(args, field_info(f).flag_name(f)) for f in fields})


def _spec_args(spec: Any) -> list[str]:
    """The flags that reproduce ``spec``; fields left at their default are omitted."""
    args: list[str] = []
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        flag = field_info(field).flag_name(field)
        if value == field.default:
            continue
        if value is True:
            args.append(f"--{flag}")
        elif value is False:
            args.append(f"--{flag}=false")
        else:
            args.append(f"--{flag}={value.value if isinstance(value, Enum) else value}")
    return args


def add_training_flags(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per TrainingSpec field, with its default and help."""
    _add_spec_flags(parser.add_argument_group("training settings (the TrainingJob's spec.training)"), TrainingSpec)


def training_from_args(args: argparse.Namespace) -> TrainingSpec:
    """The flags' TrainingSpec (``config_from_args`` of ``elasticps ps`` and ``elasticps worker``).

    Refuses the mode combinations a TrainingJob refuses (``TrainingMode.problems``): prints
    ``error: --<flag>: <why>`` and exits 2, as argparse does for a bad value.
    """
    return training_and_mode_from_args(args)[0]


def training_and_mode_from_args(args: argparse.Namespace) -> tuple[TrainingSpec, TrainingMode]:
    """:func:`training_from_args` with the training mode it was checked against (derived once)."""
    spec = _spec_from_args(TrainingSpec, args)
    mode = TrainingMode.of(spec)
    for field, why in mode.problems():
        print(f"error: --{snake(field)}: {why}", file=sys.stderr)
        raise SystemExit(2)
    return spec, mode


def training_args(spec: TrainingSpec) -> list[str]:
    """The flags that reproduce ``spec``; fields left at their default are omitted."""
    return _spec_args(spec)


def add_data_flags(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per DataSpec field (``--training_data``, ``--data_reader``, ``--label_column`` ...).
    ``--training_data`` may be empty (a job that only predicts with ``--prediction_model``): the
    worker and PS 0 check that themselves; a PS other than PS 0 reads no data."""
    _add_spec_flags(parser.add_argument_group("data (the TrainingJob's spec.data)"), DataSpec)


def data_from_args(args: argparse.Namespace) -> DataSpec:
    return _spec_from_args(DataSpec, args)


def data_args(spec: DataSpec) -> list[str]:
    """The flags that reproduce ``spec`` (the training path always; other fields when not default)."""
    return _spec_args(spec)


def add_prediction_flags(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per PredictionSpec field (``--prediction_data``, ``--prediction_model``)."""
    _add_spec_flags(parser.add_argument_group("batch prediction (the TrainingJob's spec.prediction)"), PredictionSpec)


def prediction_from_args(args: argparse.Namespace) -> PredictionSpec:
    return _spec_from_args(PredictionSpec, args)


def prediction_args(spec: PredictionSpec) -> list[str]:
    """The flags that reproduce ``spec`` (none for a job that does not predict)."""
    return _spec_args(spec)


def add_decentralized_flags(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per DecentralizedSpec field (``--graph``, ``--max_iteration_gap`` ...)."""
    _add_spec_flags(parser.add_argument_group("decentralized training (the TrainingJob's spec.decentralized)"), DecentralizedSpec)


def decentralized_from_args(args: argparse.Namespace) -> DecentralizedSpec:
    return _spec_from_args(DecentralizedSpec, args)


def decentralized_args(spec: DecentralizedSpec) -> list[str]:
    """The flags that reproduce ``spec``; fields left at their default are omitted."""
    return _spec_args(spec)
