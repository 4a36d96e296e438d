"""Column roles of tabular data (csv, tsv, parquet): which column is the label, which are features.

Callers: the csv and parquet readers. ``spec.data.labelColumn`` and ``spec.data.featureColumns`` name
columns by name, or by 0-based index (the only way when a CSV has no header). A name wins over an
index: a column literally called ``"3"`` is that column, not the fourth. Without feature columns,
every column but the label is a feature; without a label column the data has no labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elasticps.data.api import DataError, ReaderOptions


@dataclass(frozen=True)
class Columns:
    """Column positions in a file's columns: the label's (or None) and the features', in order."""

    label: int | None
    features: tuple[int, ...]
    names: tuple[str, ...]  # every column's name, for messages ("3" when the file names none)

    def name(self, index: int) -> str:
        return repr(self.names[index])


def roles(names: Sequence[str] | None, count: int, options: ReaderOptions, where: str) -> Columns:
    """Resolves the options against a file's columns (``names`` from its header or schema, None when
    it has none; ``count`` columns). Raises :class:`DataError` naming ``where`` and the column."""
    shown = tuple(names) if names is not None else tuple(str(i) for i in range(count))

    def find(selector: str, role: str) -> int:
        if names is not None and selector in names:
            matches = [i for i, n in enumerate(names) if n == selector]
            if len(matches) > 1:
                raise DataError(f"{where}: {role} column {selector!r} names {len(matches)} columns")
            return matches[0]
        if selector.isascii() and selector.isdigit():
            index = int(selector)
            if index < count:
                return index
            raise DataError(f"{where}: {role} column {index}: the file has {count} columns")
        listed = ", ".join(shown) if names is not None else f"none: no header, {count} columns by index"
        raise DataError(f"{where}: no {role} column {selector!r} (columns: {listed})")

    label = find(options.label_column, "label") if options.label_column else None
    if options.feature_columns:
        features = tuple(find(c, "feature") for c in options.feature_columns)
        if len(set(features)) != len(features):
            raise DataError(f"{where}: a feature column is listed twice in {', '.join(options.feature_columns)}")
        if label is not None and label in features:
            raise DataError(f"{where}: column {shown[label]!r} is both the label and a feature")
    else:
        features = tuple(i for i in range(count) if i != label)
    if not features:
        raise DataError(f"{where}: no feature column (columns: {', '.join(shown)})")
    return Columns(label, features, shown)
