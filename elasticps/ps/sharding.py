"""Which PS shard holds a dense variable: a stable hash of its name, the same in every process.

Callers: the PS client (to split pushes and route pulls) and tests. Python's ``hash()`` is salted per
process, so sha256 it is.
"""

from __future__ import annotations

import hashlib


def shard_of(name: str, num_shards: int) -> int:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % num_shards
