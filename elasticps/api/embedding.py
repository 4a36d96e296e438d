"""Embedding tables (issue 17): what a table is, where its rows live, and their first values. Pure.

A table is named, has a row width (``dim``) and an initializer; its rows are keyed by int64 ids
(categorical values hashed with :func:`hash_ids` when they are strings) and live across all PS
shards, row ``id`` on shard ``id mod N`` (:func:`shard_of`). Nobody needs the vocabulary: a row is
made the first time an id is pulled, with values that depend only on the table's seed, its name
and the id (:func:`initial_rows`), so the row is the same whichever shard makes it, in whichever
order, after any restart, and in one plain process with no PS at all.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from elasticps.api.table_kinds import DECLARED, DEFAULT_KIND, TableKind

IdArray = npt.NDArray[np.int64]
INITIALIZERS = ("uniform", "normal", "zeros")
_NAME = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")
MAX_DIM = 4096
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


# A table's parts in a tensor stream (TensorMeta.name beside TensorMeta.table in the .proto): a
# push's ids and row gradients, a pull's rows.
PART_IDS, PART_GRADIENT, PART_ROWS = "ids", "gradient", "rows"


@dataclass(frozen=True)
class RowGrads:
    """One table's part of a push: distinct ids and each one's gradient summed over the minibatch."""

    ids: IdArray
    grads: np.ndarray


class EmbeddingError(ValueError):
    """A table or a batch of ids that cannot be served: the message says which and why."""


@dataclass(frozen=True)
class TableSpec:
    """One declared table. ``initializer``: ``uniform`` (in [-scale, scale), Keras's default
    for ``Embedding`` with scale 0.05), ``normal`` (standard deviation ``scale``) or ``zeros``.
    ``kind``: what the table is (``api/table_kinds.py``), an embedding table unless it says."""

    name: str
    dim: int
    initializer: str = "uniform"
    scale: float = 0.05
    seed: int = 0
    kind: TableKind = DEFAULT_KIND

    def __post_init__(self) -> None:
        if isinstance(self.kind, str) and not isinstance(self.kind, TableKind):  # "embedding" from JSON or a caller
            object.__setattr__(self, "kind", kind_of(self.kind, f"table {self.name!r}"))
        problem = table_problem(self)
        if problem:
            raise EmbeddingError(problem)


def kind_of(value: str, where: str) -> TableKind:
    """The kind ``value`` names (``""``: an embedding table, as everything written before kinds),
    or :class:`EmbeddingError` naming ``where`` it was found and the value."""
    if not value:
        return DEFAULT_KIND
    try:
        return TableKind(value)
    except ValueError:
        known = ", ".join(sorted(kind.value for kind in DECLARED))
        raise EmbeddingError(f"{where}: table kind {value!r} is unknown (known: {known})") from None


def table_problem(spec: TableSpec) -> str:
    """Why ``spec`` is not a table, or ``""``."""
    if not isinstance(spec.kind, TableKind) or spec.kind not in DECLARED:
        return (f"table {spec.name!r}: kind {spec.kind!r} cannot be declared "
                f"(declared kinds: {', '.join(sorted(kind.value for kind in DECLARED))})")
    if not isinstance(spec.name, str) or not _NAME.match(spec.name):
        return f"embedding table name {spec.name!r} must be 1-128 letters, digits or _ . - /"
    if isinstance(spec.dim, bool) or not isinstance(spec.dim, int) or not 1 <= spec.dim <= MAX_DIM:
        return f"embedding table {spec.name!r}: dim {spec.dim!r} must be an integer in [1, {MAX_DIM}]"
    if spec.initializer not in INITIALIZERS:
        return f"embedding table {spec.name!r}: initializer {spec.initializer!r} is not one of {', '.join(INITIALIZERS)}"
    if not (isinstance(spec.scale, (int, float)) and math.isfinite(spec.scale) and spec.scale >= 0):
        return f"embedding table {spec.name!r}: scale {spec.scale!r} must be a finite number >= 0"
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, int) or not 0 <= spec.seed < 2**63:
        return f"embedding table {spec.name!r}: seed {spec.seed!r} must be an integer in [0, 2**63)"
    return ""


def as_ids(values: Any, what: str = "ids") -> IdArray:
    """``values`` as a flat int64 array, or :class:`EmbeddingError` (floats, strings, bools, more
    than one dimension)."""
    array = np.asarray(values)
    if array.dtype.kind not in "iu" or array.dtype == np.uint64 and array.size and int(array.max()) >= 2**63:
        raise EmbeddingError(f"{what} must be integers that fit int64 (got {array.dtype}); hash strings with hash_ids")
    if array.ndim != 1:
        raise EmbeddingError(f"{what} must be one-dimensional (got shape {list(array.shape)})")
    return array.astype(np.int64, copy=False)


def hash_ids(values: Iterable[str | bytes]) -> IdArray:
    """Stable int64 ids of categorical values (the same in every process and Python version,
    unlike ``hash``): the first 8 bytes of each value's BLAKE2b digest."""
    out = [int.from_bytes(hashlib.blake2b(v.encode() if isinstance(v, str) else v, digest_size=8).digest(), "little", signed=True)
           for v in values]
    return np.array(out, dtype=np.int64)


def shard_of(ids: IdArray, num_shards: int) -> npt.NDArray[np.int64]:
    """The shard of each id: ``id mod num_shards``, in [0, num_shards) for negative ids too."""
    if num_shards < 1:
        raise EmbeddingError(f"num_shards {num_shards} must be >= 1")
    return np.mod(ids, num_shards)


MIX_1, MIX_2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's multipliers (shifts 30, 27, 31)


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finaliser: a bijection of uint64 whose outputs look independent."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(MIX_1)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(MIX_2)
        return x ^ (x >> np.uint64(31))


def mix_ids(key: np.uint64, values: npt.NDArray[np.int64]) -> IdArray:
    """Ids of ``values`` under ``key`` (a feature field, say): a 64-bit mix of both, so the ids of
    two keys do not collide in practice and spread evenly over any number of shards."""
    with np.errstate(over="ignore"):
        return _mix(_mix(values.astype(np.uint64) ^ key) + GOLDEN).view(np.int64)


def table_seed(spec: TableSpec) -> int:
    """The key the first values of a table's rows are drawn under (its name's hash and its seed)."""
    return int(_table_key(spec))


def _table_key(spec: TableSpec) -> np.uint64:
    name = int.from_bytes(hashlib.blake2b(spec.name.encode(), digest_size=8).digest(), "little")
    return np.uint64(name ^ spec.seed)


def _uniform01(ids: IdArray, dim: int, key: np.uint64, stream: int) -> npt.NDArray[np.float64]:
    """(len(ids), dim) values in [0, 1), a function of (key, id, column, stream) only: SplitMix64
    (the finaliser of a counter stepped by the golden ratio) from a seed mixed of key and id."""
    with np.errstate(over="ignore"):
        base = _mix(ids.astype(np.uint64) ^ key) + np.uint64(stream) * GOLDEN
        counters = base[:, None] + (np.arange(1, dim + 1, dtype=np.uint64) * GOLDEN)[None, :]
    bits = _mix(counters)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def initial_rows(spec: TableSpec, ids: IdArray, dtype: npt.DTypeLike = np.float32) -> npt.NDArray[Any]:
    """The first values of the rows of ``ids``: the same for an id whenever and wherever made."""
    ids = as_ids(ids)
    if spec.initializer == "zeros" or not ids.size:
        return np.zeros((ids.size, spec.dim), dtype=dtype)
    key = _table_key(spec)
    u = _uniform01(ids, spec.dim, key, 0)
    if spec.initializer == "uniform":
        return ((2.0 * u - 1.0) * spec.scale).astype(dtype)
    v = _uniform01(ids, spec.dim, key, 1)
    normal = np.sqrt(-2.0 * np.log1p(-u)) * np.cos(2.0 * np.pi * v)  # Box-Muller; 1 - u is in (0, 1]
    return (normal * spec.scale).astype(dtype)


def summed_by_id(ids: IdArray, grads: npt.NDArray[Any]) -> tuple[IdArray, npt.NDArray[Any]]:
    """The distinct ids, sorted, and each one's rows of ``grads`` summed (ids may repeat)."""
    if not ids.size:
        return ids, grads
    order = np.argsort(ids, kind="stable")
    ids, grads = ids[order], grads[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return ids[starts], np.add.reduceat(grads, starts, axis=0)


def row_grads(parts: Mapping[str, Sequence[tuple[IdArray, npt.NDArray[Any]]]]) -> dict[str, RowGrads]:
    """Each table's gradients from its parts (the layers, or calls, that looked rows up in it):
    one part as it is, several summed per id."""
    out: dict[str, RowGrads] = {}
    for name, found in parts.items():
        if len(found) == 1:
            ids, grads = found[0]
        else:
            ids, grads = summed_by_id(np.concatenate([i for i, _ in found]), np.concatenate([g for _, g in found]))
        out[name] = RowGrads(ids, grads)
    return out