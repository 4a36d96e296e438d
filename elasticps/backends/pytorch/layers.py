"""PyTorch modules for model modules: :class:`Embedding`, a lookup in an embedding table served by
the parameter servers (issue 36), the torch twin of ``elasticps.backends.keras.layers.Embedding``.

A model module uses ``elasticps.backends.pytorch.layers.Embedding(table, dim)`` where it would use
``torch.nn.Embedding(vocabulary, dim)``: no vocabulary, ids are any int64 (hash strings with
``elasticps.api.embedding.hash_ids``; the ``criteo`` reader gives ids already). A table's rows
start from values that depend only on its name, its seed and the id (``api/embedding.py``), the
same as the Keras layer's.

In one plain process (a notebook, a DDP job, no elasticps at all) the table is local: a parameter
of ``local_rows`` rows, id ``i`` in row ``i mod local_rows``, trained by the model's optimizer like
any parameter.

Served by parameter servers (a module made inside :func:`served`, as the worker makes the model),
the module holds no table. Each call takes the distinct ids of its input, asks the worker's row
source for their rows (:meth:`Embedding.serve`: the PS client's pull; before the PS holds the
model, the rows' first values), and looks every id up in them; the rows are a leaf tensor, so after
``backward`` its gradient is each distinct id's gradient summed over the minibatch, which the
worker takes (:meth:`Embedding.taken`) and pushes. Only the rows a minibatch touches travel; they
are never among the module's parameters, so never among the dense variables the PS holds.

Exported from a PS job, each served module is swapped for one holding the rows the PS held
(``held`` of them: the ids, sorted, as a buffer and their rows as a parameter); an id it does not
hold looks up its first values (:func:`first_rows`), as the PS answers it. The exported program
needs no PS and no elasticps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from elasticps.api.embedding import GOLDEN, MIX_1, MIX_2, IdArray, TableSpec, initial_rows, table_seed
from elasticps.backends.api import tables_are_served, tables_served

LOCAL_ROWS = 1 << 18
served = tables_served  # as the worker makes its model: layers made inside take their rows from it


def _signed(word: int) -> int:
    """A uint64 as the int64 of the same bits (torch has no uint64 arithmetic)."""
    word %= 2**64
    return word - 2**64 if word >= 2**63 else word


def _shifted(x: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 ``x`` seen as uint64: torch's is arithmetic, so the bits it
    copies in from the sign are masked off."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """``api/embedding._mix`` on int64 tensors (products and sums wrap modulo 2**64, as uint64's)."""
    x = (x ^ _shifted(x, 30)) * _signed(MIX_1)
    x = (x ^ _shifted(x, 27)) * _signed(MIX_2)
    return x ^ _shifted(x, 31)


def _uniform01(ids: torch.Tensor, dim: int, key: int, stream: int) -> torch.Tensor:
    golden = int(GOLDEN)
    base = _mix(ids ^ _signed(key)) + _signed(stream * golden)
    steps = torch.tensor([_signed(k * golden) for k in range(1, dim + 1)], dtype=torch.int64, device=ids.device)
    bits = _mix(base[:, None] + steps[None, :])
    return _shifted(bits, 11).to(torch.float64) * (1.0 / 2**53)


def first_rows(spec: TableSpec, ids: torch.Tensor) -> torch.Tensor:
    """The first values of the rows of ``ids`` (int64 [n]) as ``api/embedding.initial_rows`` makes
    them, in torch's ops (float32 [n, dim]): what an exported table answers for an id it does not
    hold, as the PS does."""
    if spec.initializer == "zeros":
        return torch.zeros(ids.shape[0], spec.dim, dtype=torch.float32, device=ids.device)
    key = table_seed(spec)
    u = _uniform01(ids, spec.dim, key, 0)
    if spec.initializer == "uniform":
        return ((2.0 * u - 1.0) * spec.scale).to(torch.float32)
    v = _uniform01(ids, spec.dim, key, 1)
    normal = torch.sqrt(-2.0 * torch.log1p(-u)) * torch.cos(2.0 * np.pi * v)
    return (normal * spec.scale).to(torch.float32)


# The rows of a table's distinct ids (sorted), (len(ids), dim): the worker's pull.
Rows = Callable[[IdArray, bool], np.ndarray]  # the rows of distinct ids; whether a training step asks


class Embedding(nn.Module):
    """``(..., ids int64) -> (..., dim)``: the rows of ``ids`` in table ``table``."""

    def __init__(self, table: str, dim: int, initializer: str = "uniform", scale: float = 0.05, seed: int = 0,
                 local_rows: int = LOCAL_ROWS, held: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.spec = TableSpec(table, dim, initializer, scale, seed)  # checked: EmbeddingError says what is wrong
        if isinstance(local_rows, bool) or not isinstance(local_rows, int) or local_rows < 1:
            raise ValueError(f"embedding table {table!r}: local_rows {local_rows!r} must be an integer >= 1")
        if isinstance(held, bool) or not isinstance(held, int) or held < 0:
            raise ValueError(f"embedding table {table!r}: held {held!r} must be an integer >= 0")
        self.local_rows, self.held = local_rows, held
        self.served = tables_are_served() and not held
        self._rows: Rows | None = None
        self._taken: list[tuple[IdArray, torch.Tensor]] = []
        if self.served:
            return
        if held:
            self.register_buffer("ids", torch.zeros(held, dtype=torch.int64))
            self.rows = nn.Parameter(torch.zeros(held, self.spec.dim))
        else:
            first = initial_rows(self.spec, np.arange(local_rows, dtype=np.int64))
            self.rows = nn.Parameter(torch.from_numpy(np.ascontiguousarray(first, dtype=np.float32)))

    def serve(self, rows: Rows | None) -> None:
        """Served: where the rows of a call's ids come from (None: their first values)."""
        self._rows = rows

    @property
    def source(self) -> Rows | None:
        return self._rows

    def taken(self) -> list[tuple[IdArray, torch.Tensor]]:
        """Served: the ids and the rows tensor of every call since the last :meth:`clear` (each
        rows tensor's ``grad`` is its ids' gradients after ``backward``)."""
        return list(self._taken)

    def clear(self) -> None:
        self._taken.clear()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        flat = ids.reshape(-1)
        dim = self.spec.dim
        if self.served:
            distinct, where = torch.unique(flat, sorted=True, return_inverse=True)
            wanted = distinct.cpu().numpy()
            training = torch.is_grad_enabled()  # evaluation and prediction run without: the PS makes no row
            found = initial_rows(self.spec, wanted) if self._rows is None else self._rows(wanted, training)
            rows = torch.from_numpy(np.array(found, dtype=np.float32)).to(ids.device)
            if training:
                rows.requires_grad_(True)
                self._taken.append((wanted, rows))
            return rows[where].reshape(*ids.shape, dim)
        if self.held:
            held_ids = self.get_buffer("ids")
            positions = torch.clamp(torch.searchsorted(held_ids, flat), max=self.held - 1)
            hit = held_ids[positions] == flat
            looked_up = torch.where(hit[:, None], self.rows[positions], first_rows(self.spec, flat).to(self.rows.dtype))
            return looked_up.reshape(*ids.shape, dim)
        return self.rows[torch.remainder(ids, self.local_rows)]

    def holding(self, ids: IdArray, rows: np.ndarray) -> Embedding:
        """A module of this table holding ``rows`` of ``ids`` (sorted): an export's stand-in."""
        if not ids.size:  # a table no minibatch touched: one row of zeros, for no id at all
            ids, rows = np.zeros(1, np.int64), np.zeros((1, self.spec.dim), np.float32)
        s = self.spec
        twin = Embedding(s.name, s.dim, s.initializer, s.scale, s.seed, self.local_rows, held=int(ids.size))
        with torch.no_grad():
            twin.get_buffer("ids").copy_(torch.from_numpy(np.asarray(ids, dtype=np.int64)))
            twin.rows.copy_(torch.from_numpy(np.asarray(rows, dtype=np.float32)))
        return twin

    def extra_repr(self) -> str:
        where = "served" if self.served else f"held={self.held}" if self.held else f"local_rows={self.local_rows}"
        return f"table={self.spec.name!r}, dim={self.spec.dim}, {where}"
