"""Field declarations for the TrainingJob spec: one place for each field's default, bounds and help.

The spec dataclasses in ``spec.py`` declare their fields with :func:`spec_field`; the YAML parser
(``parsing.py``), the command-line flags (``flags.py``) and the CRD schema read the same metadata,
so a bound or a default is written once. Counters that size what a job allocates or starts
(epochs, replicas, steps between pulls) carry a ``maximum`` far above any real job, so a typo
fails at parsing with the field's name instead of exhausting memory later.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_META_KEY = "elasticps"


@dataclass(frozen=True)
class FieldInfo:
    """What the parser, the flags and the schema know about one field."""

    help: str
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None  # inclusive; a sanity bound no real job reaches (numEpochs 1e12 is a typo)
    aliases: tuple[str, ...] = ()  # extra command-line spellings, e.g. ElasticDL's --get_model_steps
    opaque: bool = False  # a free-form object (a pod template): kept as given, not validated here
    flag: str = ""  # the command-line name when it is not the field's (--training_data for data.training)
    check: Callable[[Any], str | None] | None = None  # why a value is refused (one line), or None

    def flag_name(self, field: dataclasses.Field[Any]) -> str:
        return self.flag or field.name


def spec_field(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    minimum: float | None = None,
    exclusive_minimum: bool = False,
    maximum: float | None = None,
    aliases: tuple[str, ...] = (),
    opaque: bool = False,
    flag: str = "",
    check: Callable[[Any], str | None] | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field carrying a :class:`FieldInfo`."""
    info = FieldInfo(help, minimum, exclusive_minimum, maximum, aliases, opaque, flag, check)
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={_META_KEY: info})
    return dataclasses.field(default=default, metadata={_META_KEY: info})


def field_info(field: dataclasses.Field[Any]) -> FieldInfo:
    info = field.metadata.get(_META_KEY)
    if not isinstance(info, FieldInfo):
        raise TypeError(f"field {field.name} was not declared with spec_field()")
    return info


# Words the YAML writes in capitals inside a camelCase key: ``local_sgd_steps`` -> ``localSGDSteps``.
ACRONYMS = frozenset({"sgd"})


def camel(name: str) -> str:
    """``lr_staleness_modulation`` -> ``lrStalenessModulation`` (the YAML spelling)."""
    head, *rest = name.split("_")
    return head + "".join(part.upper() if part in ACRONYMS else part[:1].upper() + part[1:] for part in rest)


def snake(name: str) -> str:
    """``lrStalenessModulation`` -> ``lr_staleness_modulation``, ``localSGDSteps`` ->
    ``local_sgd_steps`` (the flag spelling)."""
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", words).lower()


def check_bounds(value: float, info: FieldInfo, where: str) -> None:
    """Raises ValueError with a message naming ``where`` when ``value`` is out of bounds.

    NaN and infinities are refused first: NaN compares false with every bound, so it would pass.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: must be a finite number, got {value}")
    if info.maximum is not None and value > info.maximum:
        raise ValueError(f"{where}: must be <= {_num(info.maximum)}, got {_num(value)}")
    if info.minimum is None:
        return
    if info.exclusive_minimum and not value > info.minimum:
        raise ValueError(f"{where}: must be > {_num(info.minimum)}, got {_num(value)}")
    if not info.exclusive_minimum and value < info.minimum:
        raise ValueError(f"{where}: must be >= {_num(info.minimum)}, got {_num(value)}")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
