"""Training health from the reported losses (coordinator/health.py), and the queue that stops
handing out work when a job that asked to fail on it is unhealthy."""

from __future__ import annotations

import math

import pytest

from elasticps.coordinator.health import EXPLODED, FIRST_TASKS, FirstLoss, Health, HealthWatch
from elasticps.coordinator.requests import RequestError, check_report
from elasticps.coordinator.tasks.base import QueueSettings, Task, TaskKind, Wait
from elasticps.coordinator.tasks.queue import TaskQueue
from elasticps.proto import elasticps_pb2 as pb


def watch(losses: list[float], stall_records: int = 1000, records: int = 100) -> HealthWatch:
    w = HealthWatch(stall_records)
    for loss in losses:
        w.record(loss, records)
    return w


def test_a_falling_loss_is_healthy() -> None:
    verdict = watch([2.3, 2.2, 2.0, 1.9] + [1.0 - 0.05 * i for i in range(15)]).verdict()
    assert verdict.healthy and verdict.message == ""


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_loss_that_is_not_finite_is_diverged_at_once_and_stays(bad: float) -> None:
    w = watch([2.3, 2.2])
    w.record(bad, 100)
    assert w.verdict().health is Health.DIVERGED
    assert w.verdict().message == "the training loss was not finite in a task after 300 records"
    for _ in range(20):
        w.record(0.1, 100)  # trained on from weights that gave a NaN: still diverged
    assert w.verdict().health is Health.DIVERGED


def test_minibatches_whose_loss_was_not_finite_are_diverged() -> None:
    w = watch([2.3, 2.2])
    w.record(2.1, 100, nonfinite_steps=3)  # the worker left them out of the task's loss
    assert w.verdict().message == "the training loss was not finite in 3 minibatches of a task after 300 records"


def test_a_loss_ten_times_its_first_values_is_diverged() -> None:
    first = [1.0, 1.2, 0.8, 1.0]  # mean 1.0
    w = watch(first + [5.0] * 3)
    assert w.verdict().healthy  # recent mean (1.0*4 + 15) / 7 < 10
    w = watch(first + [EXPLODED * 1.0 + 40.0])  # the latest 5: mean 10.8 >= 10 x 1.0
    verdict = w.verdict()
    assert verdict.health is Health.DIVERGED
    assert verdict.message == "the training loss grew from 1 (first 4 tasks) to 10.8 (latest 5) after 500 records"


def test_a_loss_at_its_first_values_after_the_stretch_is_stalled() -> None:
    chance = [2.3026, 2.3031, 2.3020, 2.3027]
    # The stretch is the job's first 1,000 records.
    w = watch(chance + [2.3025] * 5)  # 900 records: not judged yet
    assert w.verdict().healthy
    w.record(2.3029, 100)
    verdict = w.verdict()  # 1,000 records
    assert verdict.health is Health.STALLED
    assert verdict.message == ("the training loss has not fallen in 1000 records: 2.303 (latest 8 tasks) "
                               "against 2.303 (first 4 tasks)")
    for loss in [2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.7, 0.6]:  # it learns after all
        w.record(loss, 100)
    assert w.verdict().healthy


def test_a_run_that_blew_up_in_its_first_tasks_and_settled_at_chance_is_stalled() -> None:
    # Async at lr 0.5 (2026-11-28): the first tasks' mean losses 3.58, 2.76, ... lie above chance;
    # the loss then sits at 2.33 for the rest of the job. The initial model's loss, 2.30 (the
    # first minibatch of the tasks begun at version 0), is what it never fell below.
    w = HealthWatch(1400)
    w.record(3.58, 100, first_loss=FirstLoss(2.3021, 0))
    w.record(2.76, 100, first_loss=FirstLoss(2.3035, 0))
    w.record(2.41, 100, first_loss=FirstLoss(2.62, 37))  # begun later: not the initial model's
    w.record(2.35, 100, first_loss=FirstLoss(2.36, 80))
    for _ in range(10):
        w.record(2.33, 100, first_loss=FirstLoss(2.33, 200))
    verdict = w.verdict()  # 1,400 records into the job: one stretch
    assert verdict.health is Health.STALLED
    assert verdict.message == ("the training loss has not fallen in 1400 records: 2.33 (latest 8 tasks) "
                               "against 2.303 (the model at version 0)")
    # Without the initial model's loss the same run passes for learning (2.33 < 2.775).
    assert watch([3.58, 2.76, 2.41, 2.35] + [2.33] * 10).verdict().healthy


def test_the_initial_loss_is_the_lowest_versions_reported_in_any_order() -> None:
    w = HealthWatch(1000)
    w.record(3.0, 100, first_loss=FirstLoss(0.4, 500))  # a replaced worker's, reported first
    w.record(3.0, 100, first_loss=FirstLoss(2.30, 0))  # the job's first model, reported later
    w.record(3.0, 100, first_loss=FirstLoss(0.3, 900))
    w.record(3.0, 100)
    for _ in range(10):
        w.record(2.2, 100)  # below the initial model's 2.30 (not below 0.4 or 0.3): learning
    assert w.verdict().healthy
    for _ in range(8):
        w.record(2.31, 100)  # back above it
    verdict = w.verdict()
    assert verdict.health is Health.STALLED and verdict.message.endswith("against 2.3 (the model at version 0)")


def test_a_healthy_run_whose_initial_loss_is_above_its_first_tasks_compares_with_those() -> None:
    # A resumed job: its lowest version is the checkpoint's, its loss already low; the first
    # tasks' mean (the lower) stays the reference, as before.
    w = HealthWatch(1000)
    for _ in range(FIRST_TASKS):
        w.record(0.50, 100, first_loss=FirstLoss(0.52, 4000))
    for _ in range(10):
        w.record(0.49, 100, first_loss=FirstLoss(0.49, 4100))
    assert w.verdict().healthy


def test_a_loss_that_fell_by_more_than_the_margin_is_not_stalled() -> None:
    # CTR-like: slow, but below the first values by 2 %.
    assert watch([0.50] * FIRST_TASKS + [0.49] * 20).verdict().healthy


def test_stall_records_zero_never_judges_a_stall() -> None:
    assert watch([2.3] * 50, stall_records=0).verdict().healthy
    assert watch([2.3] * 5 + [math.nan], stall_records=0).verdict().health is Health.DIVERGED


def test_a_report_says_how_many_minibatches_had_no_finite_loss() -> None:
    check_report(pb.TaskResult(worker="w", task_id=1, records=10, nonfinite_steps=3))
    with pytest.raises(RequestError, match="nonfinite_steps must be >= 0"):
        check_report(pb.TaskResult(worker="w", task_id=1, records=10, nonfinite_steps=-1))


def settings(**kw: object) -> QueueSettings:
    base: dict[str, object] = {"num_records": 1000, "records_per_task": 100, "num_epochs": 2}
    return QueueSettings(**{**base, **kw})  # type: ignore[arg-type]


def train_one(q: TaskQueue, loss: float) -> Task:
    task = q.get("w", 0)
    assert isinstance(task, Task) and task.kind is TaskKind.TRAINING
    assert q.report("w", task.id, True, loss_sum=loss * task.records)
    return task


def test_the_queue_reports_the_verdict_and_trains_on_without_fail_unhealthy() -> None:
    q = TaskQueue(settings(stall_records=500), clock=lambda: 0.0)
    for _ in range(9):
        train_one(q, 2.3)
    assert q.progress().health.health is Health.STALLED
    assert isinstance(q.get("w", 0), Task)  # warns only


def test_fail_unhealthy_stops_the_queue_so_nothing_is_exported() -> None:
    q = TaskQueue(settings(stall_records=500, fail_unhealthy=True, export=True), clock=lambda: 0.0)
    train_one(q, 2.3)
    task = q.get("w", 0)
    assert isinstance(task, Task)
    assert q.report("w", task.id, True, loss_sum=2.3 * task.records, nonfinite_steps=1)
    assert q.halted and q.progress().health.health is Health.DIVERGED
    assert q.get("w", 0) is Wait.WAIT and not q.finished


def test_a_restored_ledger_is_judged_only_for_divergence() -> None:
    q = TaskQueue(settings(stall_records=300), clock=lambda: 0.0)
    for _ in range(3):
        train_one(q, 2.3)
    restored = TaskQueue(settings(stall_records=300), clock=lambda: 0.0)
    restored.restore(q.state())
    for _ in range(10):
        train_one(restored, 2.3)
    assert restored.progress().health.healthy  # its first values are no job's first values
    train_one(restored, math.inf)
    assert restored.progress().health.health is Health.DIVERGED
