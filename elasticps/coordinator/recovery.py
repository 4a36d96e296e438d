"""After a PS restart: which version every shard and the task ledger roll back to. Pure.

The coordinator (``watching.py``) asks every shard what it holds (``shards.py``) when one restarted
or when PS 0 itself starts, and this module decides. Sync training keeps the shards at one version,
and every ``checkpointSteps``-th round each shard checkpoints that version and the coordinator
writes its ledger at it (``journal.py``), so the newest version found in all of them describes one
model: the shards' weights and the tasks whose every minibatch it contains. Rolling everything back
to it loses only what came after, and those tasks are trained again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from elasticps.coordinator.shards import ShardView


@dataclass(frozen=True)
class Rollback:
    version: int  # every shard and the ledger go back to this version


@dataclass(frozen=True)
class CarryOn:
    version: int  # no common checkpoint: rounds go on from here
    lost: tuple[int, ...]  # shards that hold no model (restarted without a checkpoint)


def decide(views: Sequence[ShardView], journals: Collection[int]) -> Rollback | CarryOn:
    """Roll back to the newest version every shard has a checkpoint of and the ledger was saved at;
    without one, carry on from the newest version a shard holds (a shard that lost its model is
    given the workers' copy of it)."""
    common = set(journals)
    for view in views:
        common &= set(view.checkpoints)
    if common:
        return Rollback(max(common))
    held = [view.version for view in views if view.initialized]
    if not held:
        return CarryOn(0, ())  # a new job: the first worker initialises every shard
    return CarryOn(max(held), tuple(i for i, view in enumerate(views) if not view.initialized))


def needs_recovery(known_boots: Sequence[int | None], views: Sequence[ShardView]) -> bool:
    """Whether a shard restarted since the coordinator last looked (its boot number changed)."""
    return any(known is not None and known != view.boot for known, view in zip(known_boots, views))


def rollback_message(newest: int, version: int, records_again: int) -> str:
    """What a rollback undid, for the job's status. ``records_again`` is the ledger's count of
    records done before it less after it; when PS 0 itself restarted, its ledger before the
    rollback is the one it started with, so the count says nothing and is left out."""
    again = f"{records_again} records to train again" if records_again > 0 else "the tasks after it are trained again"
    return (
        f"a PS shard restarted from its checkpoint: every shard and the task ledger went back from "
        f"model version {newest} to {version}; {again}"
    )
