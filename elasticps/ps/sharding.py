"""Which PS shard holds a tensor: the pluggable rule the PS client splits pushes and pulls by.

Callers: ``PSClient`` (``ps/client.py``) owns one :class:`Sharder` for its lifetime, :class:`ByName`
unless it is given another; tests. A sharder is a pure mapping from names to shard indices, the same
in every process of a job: a worker and a restarted worker must agree on where each variable lives,
or pulls and pushes would miss the shards that hold it.

:func:`shard_of` is the default rule: the first 8 bytes of sha256 of the name, big-endian, modulo
the number of shards. Python's ``hash()`` is salted per process, so it cannot serve. Embedding rows
(``id mod N``) will get their own rule beside this one; the dense variables keep theirs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Protocol, TypeVar

T = TypeVar("T")


def shard_of(name: str, num_shards: int) -> int:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % num_shards


class Sharder(Protocol):
    """Places named tensors on ``num_shards`` shards; deterministic across processes."""

    @property
    def num_shards(self) -> int: ...

    def shard(self, name: str) -> int:
        """The shard (``0 <= shard < num_shards``) that holds ``name``."""
        ...

    def split(self, tensors: Mapping[str, T]) -> list[dict[str, T]]:
        """One dict per shard (``num_shards`` of them, empty ones included); every tensor in
        exactly one of them, the one :meth:`shard` names."""
        ...


def split_by(sharder: Sharder, tensors: Mapping[str, T]) -> list[dict[str, T]]:
    """:meth:`Sharder.split` for any sharder, from its :meth:`Sharder.shard` (insertion order kept)."""
    parts: list[dict[str, T]] = [{} for _ in range(sharder.num_shards)]
    for name, value in tensors.items():
        parts[sharder.shard(name)][name] = value
    return parts


class ByName:
    """The default sharder: :func:`shard_of` of the name, cached (a model's names repeat every step)."""

    def __init__(self, num_shards: int) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self._num_shards = num_shards
        self._cache: dict[str, int] = {}

    @property
    def num_shards(self) -> int:
        return self._num_shards

    def shard(self, name: str) -> int:
        # Races between client threads only compute the same value twice: a dict store is atomic.
        found = self._cache.get(name)
        if found is None:
            found = self._cache[name] = shard_of(name, self._num_shards)
        return found

    def split(self, tensors: Mapping[str, T]) -> list[dict[str, T]]:
        return split_by(self, tensors)
