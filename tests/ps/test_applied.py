"""A sync shard's copy of the task ledger (``ps/applied.py``): the furthest record each committed
round brought a task to, whole only while every round since version 0 was applied here."""

from __future__ import annotations

from elasticps.ps.applied import AppliedTasks, LedgerCopy, TaskProgress


def test_each_task_keeps_the_furthest_record_a_round_brought_it_to() -> None:
    applied = AppliedTasks()
    applied.installed(0)
    applied.committed(1, [TaskProgress(0, 0, 32, 7), TaskProgress(0, 320, 352, 8)])
    applied.committed(2, [TaskProgress(0, 0, 64, 7)])
    applied.committed(3, [TaskProgress(0, 0, 32, 7)])  # an older word (a commit retried): kept back
    applied.committed(4, [TaskProgress(1, 0, 32, 9)])
    assert applied.copy() == LedgerCopy(4, True, (
        TaskProgress(0, 0, 64, 7), TaskProgress(0, 320, 352, 8), TaskProgress(1, 0, 32, 9)))  # fmt: skip


def test_a_model_installed_past_version_0_makes_the_copy_partial() -> None:
    applied = AppliedTasks()
    applied.committed(1, [TaskProgress(0, 0, 32, 1)])
    applied.installed(40)  # restored from a checkpoint, or a worker's copy after a restart
    applied.committed(41, [TaskProgress(0, 64, 96, 2)])
    assert applied.copy() == LedgerCopy(41, False, (TaskProgress(0, 64, 96, 2),))
    applied.installed(0)  # a new model from the start: whole again
    assert applied.copy() == LedgerCopy(0, True, ())
