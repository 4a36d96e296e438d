"""A shard's model seen from the wire: its tensors' names, dtypes and shapes, and their bytes.

Built once per installed model (``Model.layout``), read by the servicer's intake checks
(``intake.py``) before a stream's payload arrives: no lock, no array touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from elasticps.api.embedding import TableSpec

Spec = tuple[np.dtype[np.generic], tuple[int, ...]]  # a tensor's dtype and shape


class Described(Protocol):
    """A tensor as a stream's head describes it, before its bytes (``rpc.frames.TensorSpec``)."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> np.dtype[np.generic]: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def state(self) -> bool: ...

    @property
    def table(self) -> str: ...


@dataclass(frozen=True)
class Layout:
    variables: Mapping[str, Spec]
    state: Mapping[str, Spec]
    adopts_state: bool  # the state table takes state tensors it does not hold (an old checkpoint's)
    nbytes: int  # of the variables and the state tensors
    tables: Mapping[str, TableSpec] = field(default_factory=dict)  # embedding tables, by name

    @classmethod
    def of(cls, variables: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray], *, adopts_state: bool,
           tables: Mapping[str, TableSpec] | None = None) -> Layout:
        return cls(
            {name: (value.dtype, value.shape) for name, value in variables.items()},
            {name: (value.dtype, value.shape) for name, value in state.items()},
            adopts_state,
            sum(int(v.nbytes) for v in variables.values()) + sum(int(v.nbytes) for v in state.values()),
            dict(tables or {}),
        )

    @property
    def empty(self) -> bool:
        return not self.variables and not self.state and not self.tables
