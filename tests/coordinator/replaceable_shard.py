"""A PS shard, in-process, whose process a test can replace under the coordinator (a restart)."""

from __future__ import annotations

from collections.abc import Sequence

from elasticps.coordinator.shards import LedgerView, ShardView, TaskAdvance
from elasticps.ps.main import LocalShard
from elasticps.ps.store import ParameterStore


class Replaceable:
    """A shard whose process can be replaced under the coordinator (a restart): the link to it swaps."""

    def __init__(self, store: ParameterStore) -> None:
        self.link = LocalShard(store)

    def commit(self, round_: int, workers: Sequence[str], dry_run: bool, tasks: Sequence[TaskAdvance] = (),
               restorable: int = 0) -> int:  # fmt: skip
        return self.link.commit(round_, workers, dry_run, tasks, restorable)

    def read_ledger(self) -> LedgerView:
        return self.link.read_ledger()

    def describe(self) -> ShardView:
        return self.link.describe()

    def roll_back(self, version: int, incarnation: int) -> ShardView:
        return self.link.roll_back(version, incarnation)
