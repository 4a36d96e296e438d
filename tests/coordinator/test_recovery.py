"""After a PS restart (``coordinator/recovery.py``), pure: which version every shard and the ledger
roll back to, and when the coordinator must look."""

from __future__ import annotations

from elasticps.coordinator.recovery import (
    CarryOn, Rollback, Stuck, decide, needs_recovery, restorable, rollback_message,
)  # fmt: skip
from elasticps.coordinator.shards import ShardView


def view(version: int, checkpoints: tuple[int, ...] = (), initialized: bool = True, boot: int = 1) -> ShardView:
    return ShardView(initialized, version, boot, 0, checkpoints)


def test_rolls_back_to_the_newest_version_every_shard_and_the_ledger_hold() -> None:
    views = [view(45, (40, 20)), view(40, (40, 20))]
    assert decide(views, [40, 20]) == Rollback(40)


def test_a_version_missing_in_one_shard_is_skipped() -> None:
    # Shard 1 died before its checkpoint of 40 was on disk.
    views = [view(45, (40, 20)), view(20, (20,))]
    assert decide(views, [40, 20]) == Rollback(20)


def test_a_version_the_ledger_was_not_saved_at_is_skipped() -> None:
    views = [view(65, (60, 40, 20)), view(60, (60, 40, 20))]
    assert decide(views, [40, 20]) == Rollback(40)


def test_checkpoints_in_any_order_still_give_the_newest_common_one() -> None:
    assert decide([view(9, (3, 9, 6)), view(9, (6, 3, 9))], [3, 9, 6]) == Rollback(9)


def test_shards_at_other_versions_without_a_common_checkpoint_are_stuck_and_say_why() -> None:
    # Found 5 of issue 35: PS 1's disk filled after version 40; killed at 221, it came back at 40,
    # which nothing else holds. Carrying on at 221 had every round aborted for good.
    views = [view(221, (220, 200, 180)), ShardView(True, 40, 1, 0, (40,), unreadable=("/c/ps-1/ckpt-000000000060.eps: truncated",))]
    decision = decide(views, [220, 200, 180])
    assert isinstance(decision, Stuck)
    assert decision.reason == (
        "no checkpoint version that every PS shard and the task ledger can restore: PS 0 at version 221, "
        "checkpoints [220, 200, 180]; PS 1 at version 40, checkpoints [40], unreadable: "
        "/c/ps-1/ckpt-000000000060.eps: truncated; the ledger saved at [220, 200, 180]"
    )
    assert isinstance(decide([view(45, (40,)), view(7, (20,))], [40, 20]), Stuck)


def test_an_unreadable_newest_checkpoint_is_not_a_common_version() -> None:
    # Found 4: PS 1's 300 truncated and 280 flipped; it lists only what reads back (260).
    views = [view(300, (300, 280, 260)), view(260, (260,))]
    assert decide(views, [300, 280, 260]) == Rollback(260)


def test_without_ledgers_there_is_no_rollback() -> None:
    assert decide([view(45, (40, 20)), view(45, (40, 20))], []) == CarryOn(45, ())
    assert isinstance(decide([view(45, (40, 20)), view(40, (40, 20))], []), Stuck)


def test_a_fresh_job_loses_nothing() -> None:
    fresh = [view(0, initialized=False), view(0, initialized=False)]
    assert decide(fresh, []) == CarryOn(0, ())


def test_a_shard_that_lost_its_model_is_named() -> None:
    views = [view(12), view(0, initialized=False), view(12)]
    assert decide(views, []) == CarryOn(12, (1,))


def test_needs_recovery_only_when_a_known_boot_changed() -> None:
    views = [view(1, boot=7), view(1, boot=8)]
    assert not needs_recovery([None, None], views)  # never looked: the first recovery's business
    assert not needs_recovery([7, 8], views)
    assert not needs_recovery([7, None], views)
    assert needs_recovery([7, 9], views)


def test_the_rollback_message_counts_the_records_undone() -> None:
    assert rollback_message(646, 600, 2944) == (
        "a PS shard restarted from its checkpoint: every shard and the task ledger went back from model "
        "version 646 to 600; 2944 records to train again"
    )


def test_the_rollback_message_of_a_job_that_stopped_where_it_checkpointed_says_nothing_is_lost() -> None:
    assert rollback_message(172, 172, 0) == (
        "the PS shards restarted from their checkpoints: every shard and the task ledger resume at model "
        "version 172; nothing is trained again"
    )


def test_the_rollback_message_leaves_out_a_count_from_a_restarted_ledger() -> None:
    # PS 0 restarted: its ledger before the rollback is the one it booted with, behind the checkpoint's.
    for records_again in (0, -4096):
        message = rollback_message(646, 600, records_again)
        assert message.endswith("went back from model version 646 to 600; the tasks after it are trained again")
        assert "-" not in message and "0 records" not in message


def test_the_restorable_version_is_the_newest_every_shard_and_the_ledger_hold() -> None:
    # What each commit tells the shards to keep: a shard whose disk filled at 40 holds the job there.
    views = [view(110, (110, 100, 90, 40)), view(110, (40, 30))]
    assert restorable(views, [110, 100, 90, 40]) == 40
    assert restorable(views, [110, 100]) == 0
    assert restorable([view(5)], [10]) == 0
