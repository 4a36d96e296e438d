"""Training settings as command-line flags, both ways, derived from :class:`TrainingSpec`.

``elasticps ps`` and ``elasticps worker`` take the same training flags (ElasticDL style): booleans
accept ``--use_async`` as well as ``--use_async=true`` / ``--use_async=false``; ElasticDL's
``--get_model_steps`` is an alias of ``--get_model_frequency``. The planner renders a spec back into
flags with :func:`training_args`, so a pod's arguments and the YAML can never disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

from elasticps.api.fields import check_bounds, field_info, snake
from elasticps.api.modes import TrainingMode
from elasticps.api.spec import TrainingSpec

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
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        try:
            check_bounds(value, info, "value")
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("value: ")) from None
        return value

    convert.__name__ = kind.__name__
    return convert


def add_training_flags(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per TrainingSpec field, with its default and help."""
    group = parser.add_argument_group("training settings (the TrainingJob's spec.training)")
    hints = typing.get_type_hints(TrainingSpec)
    for field in dataclasses.fields(TrainingSpec):
        info = field_info(field)
        names = [f"--{field.name}", *(f"--{alias}" for alias in info.aliases)]
        kind = hints[field.name]
        if kind is bool:
            group.add_argument(
                *names,
                dest=field.name,
                nargs="?",
                const=True,
                default=field.default,
                type=parse_bool,
                metavar="BOOL",
                help=f"{info.help} (default: false)",
            )
        else:
            group.add_argument(
                *names,
                dest=field.name,
                default=field.default,
                type=_bounded(kind, field),
                help=f"{info.help} (default: {field.default})",
            )


def training_from_args(args: argparse.Namespace) -> TrainingSpec:
    """The flags' TrainingSpec (``config_from_args`` of ``elasticps ps`` and ``elasticps worker``).

    Refuses the mode combinations a TrainingJob refuses (``TrainingMode.problems``): prints
    ``error: --<flag>: <why>`` and exits 2, as argparse does for a bad value.
    """
    spec = TrainingSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainingSpec)})
    for field, why in TrainingMode.of(spec).problems():
        print(f"error: --{snake(field)}: {why}", file=sys.stderr)
        raise SystemExit(2)
    return spec


def training_args(spec: TrainingSpec) -> list[str]:
    """The flags that reproduce ``spec``; fields left at their default are omitted."""
    args: list[str] = []
    for field in dataclasses.fields(TrainingSpec):
        value = getattr(spec, field.name)
        if value == field.default:
            continue
        if value is True:
            args.append(f"--{field.name}")
        elif value is False:
            args.append(f"--{field.name}=false")
        else:
            args.append(f"--{field.name}={value}")
    return args
