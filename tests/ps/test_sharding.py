"""shard_of: a stable hash of the variable name (sha256, the same in every process), mod N; ByName,
the default Sharder built on it."""

from __future__ import annotations

import collections
import hashlib
import subprocess
import sys

import pytest

from elasticps.ps.sharding import ByName, Sharder, shard_of


def independent(name: str, num_shards: int) -> int:
    """The documented rule, computed here on its own: first 8 bytes of sha256, big-endian, mod N."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % num_shards


# Computed once (hashlib, outside the package) and written down: a change of the hash would move
# every variable of a checkpointed job to another shard.
EXPECTED = {
    ("dense/kernel:0", 2): 0,
    ("dense/kernel:0", 3): 2,
    ("dense/kernel:0", 5): 3,
    ("dense/bias:0", 2): 1,
    ("dense/bias:0", 3): 1,
    ("dense/bias:0", 5): 3,
    ("embedding/embeddings:0", 2): 1,
    ("embedding/embeddings:0", 3): 0,
    ("embedding/embeddings:0", 5): 2,
    ("conv2d/kernel:0", 5): 1,
}


@pytest.mark.parametrize(("name", "num_shards"), list(EXPECTED))
def test_hard_coded_values(name: str, num_shards: int) -> None:
    assert shard_of(name, num_shards) == EXPECTED[(name, num_shards)]
    assert independent(name, num_shards) == EXPECTED[(name, num_shards)]


def test_matches_sha256_rule_for_many_names() -> None:
    for i in range(200):
        name = f"layer_{i}/kernel:0"
        for n in (1, 2, 3, 4, 7, 16):
            assert shard_of(name, n) == independent(name, n)


def test_one_shard_holds_everything() -> None:
    assert {shard_of(f"v{i}", 1) for i in range(50)} == {0}


def test_in_range_and_spread_over_shards() -> None:
    names = [f"model/layer_{i}/kernel:0" for i in range(100)]
    for n in (2, 3, 4, 8):
        counts = collections.Counter(shard_of(name, n) for name in names)
        assert set(counts) == set(range(n))  # every shard gets variables, none outside [0, n)
        assert min(counts.values()) >= 100 // n // 3, (n, counts)


def test_non_ascii_names_use_utf8() -> None:
    assert shard_of("gewicht/ä", 7) == independent("gewicht/ä", 7)


def test_stable_across_processes() -> None:
    """Python's hash() is salted per process; shard_of must not be."""
    code = "from elasticps.ps.sharding import shard_of; print([shard_of(f'v{i}', 5) for i in range(30)])"
    here = str([shard_of(f"v{i}", 5) for i in range(30)])
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout.strip()
        assert out == here


@pytest.mark.parametrize("bad", [0, -1])
def test_needs_at_least_one_shard(bad: int) -> None:
    with pytest.raises(ValueError, match="num_shards"):
        shard_of("w", bad)


# ---- ByName, the default Sharder --------------------------------------------------------------


def test_by_name_is_a_sharder_that_follows_shard_of() -> None:
    sharder: Sharder = ByName(3)
    assert sharder.num_shards == 3
    for i in range(100):
        name = f"layer_{i}/kernel:0"
        assert sharder.shard(name) == shard_of(name, 3)
        assert sharder.shard(name) == shard_of(name, 3)  # the cached answer is the same


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5])
def test_by_name_split_covers_every_tensor_once_on_its_shard(num_shards: int) -> None:
    tensors = {f"model/layer_{i}/{kind}:0": i for i in range(40) for kind in ("kernel", "bias")}
    parts = ByName(num_shards).split(tensors)
    assert len(parts) == num_shards  # empty shards included
    seen = [name for part in parts for name in part]
    assert sorted(seen) == sorted(tensors)  # every tensor once
    for shard, part in enumerate(parts):
        for name, value in part.items():
            assert shard_of(name, num_shards) == shard
            assert value == tensors[name]


def test_by_name_split_is_stable_across_instances_and_orders() -> None:
    tensors = {f"v{i}": i for i in range(30)}
    reversed_order = dict(reversed(list(tensors.items())))
    first = ByName(4).split(tensors)
    again = ByName(4).split(reversed_order)
    assert [sorted(p) for p in first] == [sorted(p) for p in again]
    # Within a shard, the caller's order is kept.
    assert [list(p) for p in first] == [sorted(p, key=lambda n: int(n[1:])) for p in first]


@pytest.mark.parametrize("bad", [0, -1])
def test_by_name_needs_at_least_one_shard(bad: int) -> None:
    with pytest.raises(ValueError, match="num_shards"):
        ByName(bad)
