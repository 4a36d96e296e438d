"""``criteo``: Criteo's click logs (the Display Advertising Challenge's TSV), as embedding ids.

Each line: the click label (0 or 1), 13 integer features (counts, possibly empty, ``I1``..``I13``)
and 26 categorical features (32-bit hashes written in hex, possibly empty, ``C1``..``C26``), tab
separated, no header. ``read`` returns int64 features ``(n, 39)``, one embedding id per field, and
int64 labels; a CTR model looks every id up in its tables (``elasticps.backends.keras.layers.Embedding``):

* an integer ``v`` is bucketed on a log scale (the usual Criteo recipe): ``v`` itself up to 2,
  else ``3 + floor(ln(v) ** 2)`` (3 -> 4, 1,000 -> 50, 10 ** 6 -> 193), an empty cell a bucket of
  its own;
* a categorical value is its 32-bit number; an empty cell a value of its own;
* the id of (field, value) is a 64-bit mix of both (:func:`field_ids`), so fields never share ids
  and the ids spread evenly over the shards (``id mod N``).

The file is indexed and read by byte range as ``tsv`` is (``csv_reader.py``); a cell that is not
a number (an integer field) or not hex (a categorical one) fails the read naming the record.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import mix_ids
from elasticps.data.api import DataError, Labels, ReaderOptions
from elasticps.data.csv_reader import TsvReader

INTEGER_FIELDS = 13
CATEGORICAL_FIELDS = 26
FIELDS = INTEGER_FIELDS + CATEGORICAL_FIELDS
MISSING = 1 << 33  # beyond any bucket or 32-bit value
_NEGATIVE = 1 << 34  # integer buckets are offset so negative counts (I2 has -1, -2, -3) stay apart


def bucket(value: int) -> int:
    """The bucket of an integer feature: itself up to 2, else 3 + floor(ln(value) ** 2)."""
    return value if value <= 2 else 3 + int(math.floor(math.log(value) ** 2))


def field_ids(field: int, values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The ids of ``values`` in field ``field`` (0-based over the 39 fields)."""
    return mix_ids(np.uint64(field + 1) << np.uint64(40), values)


class CriteoReader(TsvReader):
    """Criteo TSV files (a path or a glob) as ``(ids (n, 39) int64, labels (n,) int64)``."""

    def __init__(self, path: str, options: ReaderOptions = ReaderOptions()) -> None:
        super().__init__(path, replace(options, delimiter="\t", header=False, label_column="0", feature_columns=()))

    def _convert(self, rows: list[tuple[list[str], str, int]], integer_labels: bool) -> tuple[np.ndarray, Labels]:
        if self._fields != 1 + FIELDS:  # the base class parses the first records when it opens the file
            raise DataError(f"{self._paths[0]}: line 1 has {self._fields} fields; a Criteo line has {1 + FIELDS} "
                            f"(label, {INTEGER_FIELDS} integers, {CATEGORICAL_FIELDS} categoricals)")
        n = len(rows)
        ids = np.empty((n, FIELDS), np.int64)
        labels = np.empty(n, np.int64)
        values = np.empty(n, np.int64)
        for k, (cells, path, record) in enumerate(rows):
            if cells[0] not in ("0", "1"):
                raise DataError(f"{path}: record {record}: label {cells[0]!r} is not 0 or 1")
            labels[k] = int(cells[0])
        for f in range(FIELDS):
            column = 1 + f
            for k, (cells, path, record) in enumerate(rows):
                text = cells[column].strip()
                try:
                    if not text:
                        values[k] = MISSING
                    elif f < INTEGER_FIELDS:
                        values[k] = bucket(int(text)) + _NEGATIVE
                    else:
                        values[k] = int(text, 16)
                        if not 0 <= values[k] < 1 << 32:
                            raise ValueError
                except ValueError:
                    what = "an integer" if f < INTEGER_FIELDS else "a 32-bit hex value"
                    name = f"I{f + 1}" if f < INTEGER_FIELDS else f"C{f - INTEGER_FIELDS + 1}"
                    raise DataError(f"{path}: record {record}: field {name}: {text!r} is not {what}") from None
            ids[:, f] = field_ids(f, values)
        return ids, labels
