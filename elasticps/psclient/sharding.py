"""Where a model's tensors live on the PS shards: placement by size, big tensors split into row slices.

Callers: ``PSClient`` (``psclient/client.py``), which splits every push by a :class:`Placement` and joins
every pull back with a :class:`Joined`; ``worker/checkpoint_export.py``, which joins the slices of
checkpoints (:func:`parse_slice`); the fake trainer (``tools/fake_trainer.py``) and benchmarks,
which ask where a tensor went. The PS knows nothing of it: a slice is an ordinary variable there.

:func:`place` is a pure function of the model's tensors (name, shape, dtype; the variables and the
state tensors together) and the number of shards, so every process of a job (workers, restarted
workers, observers, the export) computes the same placement from the same model:

1. The tensors are taken largest first (bytes, then name: the order the caller lists them in does
   not matter).
2. A tensor larger than ``split_bytes`` (``spec.training.splitBytes``, 4 MiB by default; 0: never
   split), with at least two rows, is cut along axis 0 into contiguous row slices, one on each of
   the ``min(num_shards, rows)`` least-loaded shards (all of them for any real model); the slices
   are of equal rows within one, the extra rows going to the least-loaded of those shards, and run
   in shard order. With one shard nothing is split.
3. Any other tensor goes whole to the least-loaded shard (the lowest index on a tie).

A slice is held under the name ``<name>#rows<start>:<stop>`` (rows ``start`` to ``stop - 1`` of
``name``). Keras variable paths never contain ``#``; :func:`place` refuses a name holding the mark,
so a slice's name cannot collide with a real tensor's. Optimizers on the PS are element-wise (each
element's update reads only that element's gradient and slots), so a slice trains exactly as the
rows of the whole variable would; a sync round's state mean is element-wise too.

The split is invisible above the client: pushes are split into views of the caller's arrays (row
slices of a C-contiguous array are contiguous, so no copy), and pulled slices are copied into one
buffer per split tensor, allocated once (:class:`Joined`), which pulls hand out whole.

A PS checkpoint holds its shard's tensors under the names above. One written under another
placement (before placement by size, with another ``splitBytes`` or another number of shards)
holds names this placement puts elsewhere: the client's first pull refuses it with a message
naming the tensors (:class:`Misplaced`), instead of training a model assembled wrongly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from elasticps.api.spec import DEFAULT_SPLIT_BYTES

__all__ = ["DEFAULT_SPLIT_BYTES", "Joined", "Misplaced", "Piece", "Placed", "Placement", "TensorInfo", "place"]
SLICE_MARK = "#rows"
_SLICE = re.compile(r"(?P<name>.+)#rows(?P<start>\d+):(?P<stop>\d+)")


class Misplaced(ValueError):
    """A shard holds tensors the placement does not put there (a model placed by another rule)."""


def slice_name(name: str, start: int, stop: int) -> str:
    """The name rows ``start`` to ``stop - 1`` of tensor ``name`` are held under."""
    return f"{name}{SLICE_MARK}{start}:{stop}"


def parse_slice(held: str) -> tuple[str, int, int] | None:
    """``(name, start, stop)`` of a slice's name, None for a whole tensor's."""
    found = _SLICE.fullmatch(held)
    if found is None:
        return None
    return found["name"], int(found["start"]), int(found["stop"])


@dataclass(frozen=True)
class TensorInfo:
    """What placement needs of a tensor: its name, shape and dtype, and whether it is model state."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[np.generic]
    state: bool = False

    @classmethod
    def of(cls, name: str, array: np.ndarray, state: bool = False) -> TensorInfo:
        return cls(name, tuple(int(d) for d in array.shape), np.dtype(array.dtype), state)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Piece:
    """A whole tensor (``start`` None) or rows ``start:stop`` of it, held by ``shard`` as ``held``."""

    held: str
    shard: int
    start: int | None = None
    stop: int | None = None


@dataclass(frozen=True)
class Placed:
    tensor: TensorInfo
    pieces: tuple[Piece, ...]

    @property
    def split(self) -> bool:
        return self.pieces[0].start is not None


class Placement:
    """Every tensor of a model and where its pieces live; built by :func:`place` (or by hand)."""

    def __init__(self, num_shards: int, placed: Iterable[Placed]) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.num_shards = num_shards
        self.tensors: dict[str, Placed] = {}
        self._held: dict[str, tuple[Placed, int]] = {}  # held name -> its tensor and piece index
        self._counts = [[0, 0] for _ in range(num_shards)]  # per shard: variable pieces, state pieces
        for entry in placed:
            name = entry.tensor.name
            if name in self.tensors:
                raise ValueError(f"tensor {name!r} is placed twice")
            self.tensors[name] = entry
            for index, piece in enumerate(entry.pieces):
                if not 0 <= piece.shard < num_shards:
                    raise ValueError(f"tensor {name!r}: shard {piece.shard} is not one of {num_shards}")
                if piece.held in self._held:
                    raise ValueError(f"two pieces held as {piece.held!r}")
                self._held[piece.held] = (entry, index)
                self._counts[piece.shard][int(entry.tensor.state)] += 1

    def shards_of(self, name: str) -> tuple[int, ...]:
        """The shards holding tensor ``name`` (one, or every shard a slice of it is on)."""
        return tuple(piece.shard for piece in self.tensors[name].pieces)

    def held_on(self, shard: int) -> list[str]:
        """The names shard ``shard`` holds, in placement order."""
        return [p.held for entry in self.tensors.values() for p in entry.pieces if p.shard == shard]

    def shard_bytes(self) -> list[int]:
        """The bytes each shard holds."""
        loads = [0] * self.num_shards
        for entry in self.tensors.values():
            row = _row_bytes(entry.tensor)
            for piece in entry.pieces:
                if piece.start is None or piece.stop is None:
                    loads[piece.shard] += entry.tensor.nbytes
                else:
                    loads[piece.shard] += (piece.stop - piece.start) * row
        return loads

    def split(self, tensors: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """One dict per shard (empty ones included), keyed by held names: whole tensors as given,
        split ones as row views of them. Tensors the placement does not know are refused."""
        parts: list[dict[str, np.ndarray]] = [{} for _ in range(self.num_shards)]
        for name, value in tensors.items():
            entry = self.tensors.get(name)
            if entry is None:
                raise ValueError(f"tensor {name!r} is not in the model the PS client placed")
            if not entry.split:
                parts[entry.pieces[0].shard][name] = value
                continue
            if tuple(value.shape) != entry.tensor.shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(value.shape)}, placed as {entry.tensor.shape}")
            for piece in entry.pieces:
                parts[piece.shard][piece.held] = value[piece.start : piece.stop]
        return parts

    def locate(self, held: str) -> tuple[Placed, int] | None:
        """The tensor a held name belongs to and the index of its piece; None when not placed."""
        return self._held.get(held)

    def counts(self, shard: int) -> tuple[int, int]:
        """How many variable pieces and state pieces shard ``shard`` holds."""
        variables, state = self._counts[shard]
        return variables, state


def _row_bytes(tensor: TensorInfo) -> int:
    return tensor.nbytes // tensor.shape[0] if tensor.shape and tensor.shape[0] else 0


def _least_loaded(loads: Sequence[int]) -> list[int]:
    return sorted(range(len(loads)), key=lambda shard: (loads[shard], shard))


def place(tensors: Iterable[TensorInfo], num_shards: int, split_bytes: int = DEFAULT_SPLIT_BYTES) -> Placement:
    """The placement of a model's tensors on ``num_shards`` shards (the module's docstring has the rule)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if split_bytes < 0:
        raise ValueError(f"split_bytes must be >= 0, got {split_bytes}")
    ordered = sorted(tensors, key=lambda t: (-t.nbytes, t.name))
    loads = [0] * num_shards
    placed: list[Placed] = []
    for tensor in ordered:
        if SLICE_MARK in tensor.name:
            raise ValueError(f"tensor {tensor.name!r}: {SLICE_MARK!r} in a name is kept for row slices")
        rows = tensor.shape[0] if tensor.shape else 0
        if split_bytes and num_shards > 1 and tensor.nbytes > split_bytes and rows >= 2:
            placed.append(_sliced(tensor, loads))
        else:
            shard = _least_loaded(loads)[0]
            loads[shard] += tensor.nbytes
            placed.append(Placed(tensor, (Piece(tensor.name, shard),)))
    return Placement(num_shards, placed)


def _sliced(tensor: TensorInfo, loads: list[int]) -> Placed:
    """``tensor`` cut into row slices over the least-loaded shards (``loads`` updated)."""
    rows = tensor.shape[0]
    chosen = _least_loaded(loads)[: min(len(loads), rows)]
    base, extra = divmod(rows, len(chosen))
    counts = {shard: base + (1 if rank < extra else 0) for rank, shard in enumerate(chosen)}
    pieces: list[Piece] = []
    start = 0
    row = _row_bytes(tensor)
    for shard in sorted(chosen):
        stop = start + counts[shard]
        pieces.append(Piece(slice_name(tensor.name, start, stop), shard, start, stop))
        loads[shard] += counts[shard] * row
        start = stop
    return Placed(tensor, tuple(pieces))


def tensor_infos(variables: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray] | None = None) -> list[TensorInfo]:
    """The placement's input for a model given as arrays (its variables and its state tensors)."""
    infos = [TensorInfo.of(name, value) for name, value in variables.items()]
    return infos + [TensorInfo.of(name, value, state=True) for name, value in (state or {}).items()]


class Joined:
    """The pulled model put back together: a buffer per split tensor, allocated once, that pulled
    slices are copied into (:meth:`take`, one shard at a time, from any thread: shards hold
    different rows), and handed out whole once every slice of it arrived (:meth:`whole`).

    A buffer handed out is overwritten by later pulls: a caller keeping a pulled tensor past the
    next pull copies it (the worker assigns it to its model at once)."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        self._buffers: dict[str, np.ndarray] = {}
        self._arrived: dict[str, list[bool]] = {}
        for name, entry in placement.tensors.items():
            if entry.split:
                self._buffers[name] = np.empty(entry.tensor.shape, entry.tensor.dtype)
                self._arrived[name] = [False] * len(entry.pieces)

    def take(
        self, shard: int, variables: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], set[str]]:
        """Shard ``shard``'s pulled model: its whole variables, its whole state tensors, and the
        split tensors a slice of which it brought (copied into their buffers). Raises
        :class:`Misplaced` when the shard holds what the placement does not put there, or lacks a
        variable it does (a state tensor may be missing: a model without it, an old checkpoint)."""
        whole: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] = ({}, {})
        touched: set[str] = set()
        strays: list[str] = []
        for kind, (arrays, out) in enumerate(((variables, whole[0]), (state, whole[1]))):
            for held, value in arrays.items():
                found = self.placement.locate(held)
                if found is None or found[0].pieces[found[1]].shard != shard or found[0].tensor.state != bool(kind):
                    strays.append(held)
                    continue
                entry, index = found
                if not entry.split:
                    out[held] = value
                    continue
                piece = entry.pieces[index]
                target = self._buffers[entry.tensor.name][piece.start : piece.stop]
                if value.shape != target.shape or value.dtype != target.dtype:
                    strays.append(held)
                    continue
                np.copyto(target, value)
                self._arrived[entry.tensor.name][index] = True
                touched.add(entry.tensor.name)
        expected, _ = self.placement.counts(shard)
        if strays or len(variables) != expected:
            missing = sorted(set(self.placement.held_on(shard)) - set(variables) - set(state))
            raise Misplaced(
                f"PS shard {shard} holds {sorted(strays)[:5]} that this model's placement does not put "
                f"there, and lacks {missing[:5]}: was its model (a checkpoint) placed by another rule, "
                f"another spec.training.splitBytes or another number of PS?"
            )
        return whole[0], whole[1], touched

    def whole(self, names: Iterable[str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The buffers of ``names`` whose every slice has arrived (variables, state tensors)."""
        variables: dict[str, np.ndarray] = {}
        state: dict[str, np.ndarray] = {}
        for name in names:
            if all(self._arrived[name]):
                entry = self.placement.tensors[name]
                (state if entry.tensor.state else variables)[name] = self._buffers[name]
        return variables, state
