"""Which rows an embedding table keeps (``spec.training.embeddingPolicy``, issue 38). Pure.

A production CTR stream brings new ids without end; a PS that keeps a row for every id it ever saw
grows until it is killed. A table's policy bounds it, on each PS shard:

* ``admitAfter=k``: an id gets a row once it was asked for ``k`` times (counted by a count-min
  sketch of ``filterWidth`` counters per hash, 2 hashes: bounded memory, an id may be admitted a
  little early, never late); until then a pull reads its first values (the row it will start
  from, ``api/embedding.initial_rows``) and a push's gradient for it is dropped, both counted;
* ``ttl=n``: a row not used (pulled to train or updated) in the table's last ``n`` updates on its
  shard (one per push applied, async; one per round, sync) is evicted;
* ``maxRows=c``: a shard holds at most ``c`` rows of the table: making more first evicts down to
  nine tenths of ``c``, the least recently used rows (``evict=lru``, the default) or the least
  often updated (``evict=lfu``), never a row the request asks for.

An evicted row leaves the PS's memory and its next checkpoint; asked again, it is made anew
(from its first values, admitted again at once: its count stays in the filter).

The text: ``;``-separated clauses, each ``[<table>:]<key>=<value>,...``; a clause without a table
is every table's default, a table's own clause overrides single keys of it. E.g.
``admitAfter=2,ttl=100000;user_id:maxRows=5000000,evict=lfu``. Empty: every row kept, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Mapping

__all__ = ["Eviction", "RowPolicies", "RowPolicy", "RowPolicyError", "row_policy_problem"]

MAX_ADMIT_AFTER = 255  # the filter's counters are bytes
MAX_FILTER_WIDTH = 1 << 30
_TABLE = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")  # as a table's name (api/embedding.py)


class RowPolicyError(ValueError):
    """A policy text that does not parse; the message says which part and why."""


class Eviction(str, Enum):
    LRU = "lru"  # the least recently used rows go first (made, pulled to train, updated)
    LFU = "lfu"  # the least often updated rows go first


@dataclass(frozen=True)
class RowPolicy:
    admit_after: int = 1  # 1: every id at once (no filter)
    ttl: int = 0  # 0: rows never expire
    max_rows: int = 0  # 0: no cap
    evict: Eviction = Eviction.LRU
    filter_width: int = 1 << 22

    @property
    def bounded(self) -> bool:
        """Whether rows ever go (a TTL or a cap)."""
        return self.ttl > 0 or self.max_rows > 0


_KEYS = {"admitAfter": "admit_after", "ttl": "ttl", "maxRows": "max_rows", "evict": "evict",
         "filterWidth": "filter_width"}  # fmt: skip


@dataclass(frozen=True)
class RowPolicies:
    default: RowPolicy = field(default_factory=RowPolicy)
    tables: Mapping[str, RowPolicy] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, table: str) -> RowPolicy:
        return self.tables.get(table, self.default)

    @classmethod
    def parse(cls, text: str) -> RowPolicies:
        default: dict[str, object] = {}
        own: dict[str, dict[str, object]] = {}
        for clause in (c.strip() for c in text.split(";")):
            if not clause:
                continue
            table, settings = clause.split(":", 1) if ":" in clause.split("=", 1)[0] else ("", clause)
            table = table.strip()
            if table and not _TABLE.match(table):
                raise RowPolicyError(f"{clause!r}: {table!r} is no table name")
            into = own.setdefault(table, {}) if table else default
            if table == "" and default:
                raise RowPolicyError(f"{clause!r}: a second clause for every table (name a table, or join them with ',')")
            for item in (i.strip() for i in settings.split(",")):
                key, eq, value = item.partition("=")
                if not eq or key not in _KEYS:
                    raise RowPolicyError(f"{clause!r}: {item!r} is not one of {', '.join(f'{k}=...' for k in _KEYS)}")
                name = _KEYS[key]
                if name in into:
                    raise RowPolicyError(f"{clause!r}: {key} is given twice")
                into[name] = _value(clause, key, value.strip())
        base = RowPolicy(**default)  # type: ignore[arg-type]
        tables = {name: replace(base, **settings) for name, settings in own.items()}  # type: ignore[arg-type]
        return cls(base, MappingProxyType(tables))


def _value(clause: str, key: str, text: str) -> object:
    if key == "evict":
        try:
            return Eviction(text)
        except ValueError:
            raise RowPolicyError(f"{clause!r}: evict={text!r}, expected lru or lfu") from None
    if not text.isdigit():
        raise RowPolicyError(f"{clause!r}: {key}={text!r} is not a whole number >= 0")
    number = int(text)
    if key == "admitAfter" and not 1 <= number <= MAX_ADMIT_AFTER:
        raise RowPolicyError(f"{clause!r}: admitAfter must be in [1, {MAX_ADMIT_AFTER}], got {number}")
    if key == "filterWidth" and not 1024 <= number <= MAX_FILTER_WIDTH:
        raise RowPolicyError(f"{clause!r}: filterWidth must be in [1024, {MAX_FILTER_WIDTH}], got {number}")
    if key == "maxRows" and 0 < number < 16:
        raise RowPolicyError(f"{clause!r}: maxRows must be 0 (no cap) or at least 16, got {number}")
    return number


def row_policy_problem(text: str) -> str | None:
    """Why ``text`` is not a row policy (one line), or None: the spec field's check."""
    try:
        RowPolicies.parse(text)
    except RowPolicyError as err:
        return str(err)
    return None
