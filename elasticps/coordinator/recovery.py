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


@dataclass(frozen=True)
class Stuck:
    reason: str  # no version every shard and the ledger can go on from: the job fails with this


def decide(views: Sequence[ShardView], journals: Collection[int]) -> Rollback | CarryOn | Stuck:
    """Roll back to the newest version every shard has a checkpoint of that reads back whole
    (``ShardView.checkpoints``: verified by the shard) and the ledger was saved at; without one,
    carry on from the version the shards hold (a shard that lost its model is given the workers'
    copy of it). Shards that hold models of different versions with no common checkpoint cannot
    go on together: Stuck, naming each shard's version, checkpoints and unreadable files."""
    common = restorable(views, journals)
    if common > 0:
        return Rollback(common)
    held = [view.version for view in views if view.initialized]
    if not held:
        return CarryOn(0, ())  # a new job: the first worker initialises every shard
    if len(set(held)) > 1:
        return Stuck(stuck_reason(views, journals))
    return CarryOn(max(held), tuple(i for i, view in enumerate(views) if not view.initialized))


def restorable(views: Sequence[ShardView], journals: Collection[int]) -> int:
    """The newest version every shard has a checkpoint of that reads back whole and the ledger was
    saved at (0: none): what a rollback would go to, and what retention keeps."""
    common = set(journals)
    for view in views:
        common &= set(view.checkpoints)
    return max(common, default=0)


def stuck_reason(views: Sequence[ShardView], journals: Collection[int]) -> str:
    shards = []
    for i, view in enumerate(views):
        held = f"at version {view.version}" if view.initialized else "without a model"
        said = f"PS {i} {held}, checkpoints {_versions(view.checkpoints)}"
        if view.unreadable:
            said += f", unreadable: {'; '.join(view.unreadable)}"
        shards.append(said)
    return (
        f"no checkpoint version that every PS shard and the task ledger can restore: {'; '.join(shards)}; "
        f"the ledger saved at {_versions(journals)}"
    )


def _versions(versions: Collection[int]) -> str:
    return "[" + ", ".join(str(v) for v in sorted(versions, reverse=True)) + "]" if versions else "none"


def needs_recovery(known_boots: Sequence[int | None], views: Sequence[ShardView]) -> bool:
    """Whether a shard restarted since the coordinator last looked (its boot number changed)."""
    return any(known is not None and known != view.boot for known, view in zip(known_boots, views))


def rollback_message(newest: int, version: int, records_again: int) -> str:
    """What a rollback undid, for the job's status. ``records_again`` is the ledger's count of
    records done before it less after it; when PS 0 itself restarted, its ledger before the
    rollback is the one it started with, so the count says nothing and is left out."""
    if newest == version:  # every shard checkpointed where it stopped (a job stopped as a whole)
        return (
            f"the PS shards restarted from their checkpoints: every shard and the task ledger resume at model "
            f"version {version}; nothing is trained again"
        )
    again = f"{records_again} records to train again" if records_again > 0 else "the tasks after it are trained again"
    return (
        f"a PS shard restarted from its checkpoint: every shard and the task ledger went back from "
        f"model version {newest} to {version}; {again}"
    )
