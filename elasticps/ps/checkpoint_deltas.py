"""Incremental checkpoints' deltas (issue 38, ``checkpoint_full_every``): which whole checkpoint a
delta is of, and a delta and its base put together into the whole checkpoint of the delta's
version. Pure over the file format (``checkpoint.py``); used by the shard's checkpoint schedule
(``checkpointing.py``) and by ``elasticps export`` from checkpoints (``worker/checkpoint_export.py``).

A table of rows keeps its arrays under ``emb/<name>/`` (:func:`table_key`): ``ids`` and, per id,
its values (rows, counts, last uses, slots), and ``clock``. A delta holds the same keys for the rows
used since its base, and ``gone``: the ids evicted since. Its meta names the base
(``delta_of``); the dense and state tables and the optimizer's arrays are always whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from elasticps.api.embedding import EmbeddingError
from elasticps.ps import checkpoint

__all__ = ["CLOCK", "GONE", "IDS", "PREFIX", "base_of", "load_whole", "merged", "table_key", "whole"]

Array = npt.NDArray[Any]
PREFIX = "emb/"  # of a table of rows' key in the shard's model and of its checkpoint keys
IDS = "ids"
CLOCK = "clock"  # the table's update count, one value
GONE = "gone"  # in a delta: ids evicted since its base


def table_key(name: str) -> str:
    """A table of rows' key among the shard's tables (``Model.tables``) and its checkpoint prefix."""
    return PREFIX + name


def base_of(found: Mapping[str, Any]) -> int | None:
    """The version of the whole checkpoint a checkpoint's meta says it is a delta of (None: whole)."""
    value = found.get("delta_of")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def load_whole(directory: Path, version: int) -> checkpoint.Checkpoint:
    """The checkpoint of ``version`` in ``directory`` made whole: itself, or a delta with the whole
    checkpoint it is of (both must read back: CheckpointError names the one that does not)."""
    found = checkpoint.load(checkpoint.path_of(directory, version))
    base = base_of(found.meta)
    return found if base is None else whole(found, checkpoint.load(checkpoint.path_of(directory, base)))


def whole(delta: checkpoint.Checkpoint, base: checkpoint.Checkpoint) -> checkpoint.Checkpoint:
    """The whole checkpoint a delta and its base make: the delta's dense, state and optimizer
    arrays and meta, each table of rows merged (``embeddings.merged``). CheckpointError when they
    do not belong together."""
    if base_of(base.meta) is not None or base.version != base_of(delta.meta) or base.version >= delta.version:
        raise checkpoint.CheckpointError("-", f"version {delta.version} is a delta of {base_of(delta.meta)}, "
                                         f"not of version {base.version}")  # fmt: skip
    arrays = {key: value for key, value in delta.arrays.items() if not key.startswith(PREFIX)}
    try:
        for spec in delta.meta.get("tables", []):
            arrays.update(merged(base.arrays, delta.arrays, str(spec["name"])))
    except (EmbeddingError, KeyError, TypeError) as err:
        raise checkpoint.CheckpointError("-", f"its delta does not fit its base: {err}") from None
    meta = {key: value for key, value in delta.meta.items() if key != "delta_of"}
    return checkpoint.Checkpoint(version=delta.version, arrays=arrays, meta=meta)


def merged(whole: Mapping[str, Array], delta: Mapping[str, Array], name: str) -> dict[str, Array]:
    """Table ``name``'s arrays of a whole checkpoint with a later delta of it applied
    (:meth:`EmbeddingTable.delta`): the rows evicted since gone, the rows in the delta replacing
    or joining the others, the delta's clock. Pure: the whole checkpoint's arrays are not changed."""
    prefix = f"{table_key(name)}/"
    base = {key.removeprefix(prefix): value for key, value in whole.items() if key.startswith(prefix)}
    change = {key.removeprefix(prefix): value for key, value in delta.items() if key.startswith(prefix)}
    if IDS not in base or IDS not in change or GONE not in change:
        raise EmbeddingError(f"embedding table {name!r}: the checkpoint or its delta holds no rows of it")
    parts = [key for key in base if key not in (IDS, CLOCK)]
    if set(parts) != {key for key in change if key not in (IDS, CLOCK, GONE)}:
        raise EmbeddingError(f"embedding table {name!r}: a delta with {sorted(change)} does not fit its base's {sorted(base)}")
    ids = np.asarray(base[IDS])
    stays = ~np.isin(ids, np.concatenate([np.asarray(change[GONE]), np.asarray(change[IDS])]))
    out = {IDS: np.concatenate([ids[stays], np.asarray(change[IDS])]), CLOCK: np.asarray(change[CLOCK])}
    for key in parts:
        out[key] = np.concatenate([np.asarray(base[key])[stays], np.asarray(change[key])])
    return {prefix + key: value for key, value in out.items()}
