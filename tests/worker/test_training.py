"""The worker's loop (``worker/training.py``) against fakes: tasks in, reports out, in every mode."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.proto import elasticps_pb2 as pb
from elasticps.worker import training
from worker_fakes import (
    WAIT_TASK,
    ArrayReader,
    FakePS,
    FakeTrainer,
    evaluation_task,
    make_worker,
    training_task,
)

MODES = [
    pytest.param(TrainingMode(), id="sync"),
    pytest.param(TrainingMode(rule=UpdateRule.ASYNC), id="async"),
    pytest.param(TrainingMode(rule=UpdateRule.ASYNC, pull_every=3), id="ssp3"),
]


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training, "WAIT_S", 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_a_job_runs_until_the_coordinator_says_finished(mode: TrainingMode) -> None:
    tasks = [WAIT_TASK, training_task(1, 0, 10), WAIT_TASK, training_task(2, 10, 32), evaluation_task(3, 0, 8)]
    rig = make_worker(mode, tasks)
    rig.worker.run()

    assert rig.coordinator.handed == len(tasks)  # then FINISHED, and the worker stopped asking
    assert [(r.task_id, r.success) for r in rig.coordinator.reports] == [(1, True), (2, True), (3, True)]
    assert rig.trainer.built
    assert rig.worker.counters.steps == 3 + 6  # minibatches of 4 over 10 and 22 records
    assert rig.metric("elasticps_worker_steps_total") == 9
    assert rig.metric("elasticps_worker_records_total") == 32
    kinds = rig.ps.kinds()
    for at, kind in enumerate(kinds):
        if kind == "report":  # a task is reported once its gradients landed
            assert kinds[:at].count("landed") == kinds[:at].count("push_async")


@pytest.mark.parametrize("mode", MODES)
def test_reports_carry_the_records_the_loss_sum_and_the_metric_sums(mode: TrainingMode) -> None:
    rig = make_worker(mode, [training_task(1, 0, 10), training_task(2, 10, 32), evaluation_task(3, 4, 12)])
    rig.worker.run()
    labels = ArrayReader().labels
    train1, train2, evaluation = rig.coordinator.reports
    assert (train1.records, train2.records, evaluation.records) == (10, 22, 8)
    # A minibatch's loss is the mean of its labels, weighted by its size: the sum of the labels.
    assert train1.loss_sum == pytest.approx(labels[0:10].sum())
    assert train2.loss_sum == pytest.approx(labels[10:32].sum())
    assert dict(evaluation.metric_sums) == pytest.approx({"loss": labels[4:12].sum(), "count": 8.0})
    assert all(r.rejected == 0 for r in rig.coordinator.reports)
    # The first minibatch's loss (minibatches of 4: the mean of its labels) and the version pulled.
    assert train1.first_loss == pytest.approx(labels[0:4].mean())
    assert train2.first_loss == pytest.approx(labels[10:14].mean())
    assert train1.first_loss_version == 0 and train2.first_loss_version >= 0
    assert not evaluation.HasField("first_loss")


def test_a_sync_task_reports_its_own_rejections() -> None:
    ps = FakePS(UpdateRule.SYNC)
    rig = make_worker(TrainingMode(), [training_task(1, 0, 8), training_task(2, 8, 16)], ps=ps)
    ps.before_push = ps.others_update  # the first push of the job is stale
    rig.worker.run()
    assert [r.rejected for r in rig.coordinator.reports] == [1, 0]
    assert rig.worker.counters.rejected == 1
    assert rig.metric("elasticps_worker_rejected_gradients_total") == 1
    assert rig.worker.counters.steps == 4  # a retrained minibatch is one step


def test_a_failing_task_is_reported_failed_then_raised() -> None:
    trainer = FakeTrainer()
    trainer.fail_on_record = 4
    rig = make_worker(TrainingMode(), [training_task(1, 0, 8), training_task(2, 8, 16)], trainer=trainer)
    with pytest.raises(RuntimeError, match="boom"):
        rig.worker.run()
    (report,) = rig.coordinator.reports
    assert (report.task_id, report.success, report.error) == (1, False, "RuntimeError: boom")
    assert rig.coordinator.handed == 1  # the worker stops at the failure


class StopAskedTrainer(FakeTrainer):
    """Sets the stop event after its second minibatch, without raising: as when the SIGTERM
    handler's raise lands inside a finaliser, where Python prints it and drops it."""

    def __init__(self, stopping: threading.Event) -> None:
        super().__init__()
        self.stopping = stopping
        self.yielded = 0

    def batches(self, features: np.ndarray, labels: np.ndarray, mode: str) -> Iterator[tuple[Any, Any]]:
        for batch in super().batches(features, labels, mode):
            yield batch
            self.yielded += 1
            if self.yielded == 2:
                self.stopping.set()


@pytest.mark.parametrize("mode", MODES)
def test_a_stop_whose_raise_was_dropped_stops_at_the_next_minibatch(mode: TrainingMode) -> None:
    stopping = threading.Event()
    trainer = StopAskedTrainer(stopping)
    rig = make_worker(mode, [training_task(1, 0, 16), training_task(2, 16, 32)], trainer=trainer, stopping=stopping)
    with pytest.raises(training.Stopped):
        rig.worker.run()
    assert rig.worker.counters.steps == 2  # not one minibatch more
    (report,) = rig.coordinator.reports  # the task is handed back now, not after a timeout
    assert (report.task_id, report.success) == (1, False)
    assert report.error.startswith("Stopped")
    assert (rig.coordinator.handed, rig.coordinator.left) == (1, 1)


def test_a_stop_asked_between_tasks_asks_for_no_other_task() -> None:
    stopping = threading.Event()
    rig = make_worker(TrainingMode(), [training_task(1, 0, 8), training_task(2, 8, 16)], stopping=stopping)
    original = rig.coordinator.report

    def report(result: pb.TaskResult) -> None:
        original(result)
        stopping.set()  # asked while the first task's success was being reported

    rig.coordinator.report = report  # type: ignore[method-assign]
    with pytest.raises(training.Stopped):
        rig.worker.run()
    assert [(r.task_id, r.success) for r in rig.coordinator.reports] == [(1, True)]
    assert rig.coordinator.handed == 1


def test_a_failure_that_cannot_be_reported_is_still_raised() -> None:
    trainer = FakeTrainer()
    trainer.fail_on_record = 0
    rig = make_worker(TrainingMode(), [training_task(1, 0, 8)], trainer=trainer)
    rig.coordinator.fail_reports = True
    with pytest.raises(RuntimeError, match="boom"):  # the task's error, not the report's
        rig.worker.run()


def test_an_evaluation_task_without_validation_data_is_reported_failed() -> None:
    rig = make_worker(TrainingMode(), [evaluation_task(1, 0, 8)], validation=False)
    with pytest.raises(RuntimeError, match="no validation data"):
        rig.worker.run()
    assert [(r.task_id, r.success) for r in rig.coordinator.reports] == [(1, False)]


@pytest.mark.parametrize("mode", MODES)
def test_evaluation_settles_the_last_push_and_pulls_first(mode: TrainingMode) -> None:
    ps = FakePS(mode.rule)
    rig = make_worker(mode, [training_task(1, 0, 8), evaluation_task(2, 0, 8)], ps=ps)
    original = rig.coordinator.get_task

    def get_task() -> pb.Task:  # another worker's update lands before the evaluation is handed out
        task = original()
        if task.type == pb.TASK_TYPE_EVALUATION:
            ps.others_update()
        return task

    rig.coordinator.get_task = get_task  # type: ignore[method-assign]
    rig.worker.run()
    (evaluated,) = rig.trainer.evaluated
    for name, value in ps.model().items():  # the PS's model, with this worker's pushes and the other's update
        np.testing.assert_allclose(evaluated[name], value)
    kinds = ps.kinds()
    before = kinds[: kinds.index("evaluate")]
    assert before[-1] == "pull"
    assert before.count("landed") == before.count("push_async")  # every push landed before the pull


def test_the_first_worker_initialises_the_ps_with_its_model() -> None:
    rig = make_worker(TrainingMode(), [])
    rig.worker.run()
    assert rig.ps.kinds() == ["warm_up", "pull", "push_model", "pull", "leave"]
    assert all(shard.initialized for shard in rig.ps.shards)
    assert rig.worker.counters.pulls == 1


@pytest.mark.parametrize("mode", MODES)
def test_the_step_is_warmed_up_on_one_minibatch_before_the_first_pull(mode: TrainingMode) -> None:
    # A trainer's first step takes seconds (TensorFlow traces it): run before the first pull, it
    # never makes the first gradient stale (under async, by every push of the others meanwhile).
    trainer = FakeTrainer()
    rig = make_worker(mode, [training_task(1, 0, 8)], trainer=trainer)
    rig.worker.run()
    kinds = rig.ps.kinds()
    assert kinds[0] == "warm_up" and kinds.count("warm_up") == 1
    assert kinds.index("warm_up") < kinds.index("pull") < kinds.index("gradients")
    assert trainer.warmed_up == [32]  # min(minibatch size 64, the 32 training records)
    assert [first for first, _ in trainer.computed] == [0, 4]  # the task's minibatches, trained once each
    # The warm-up put the state back: the job ends with the statistics of a worker without one.
    class Cold(FakeTrainer):
        def warm_up(self, features: np.ndarray, labels: np.ndarray | None) -> None:
            pass

    cold = Cold()
    make_worker(mode, [training_task(1, 0, 8)], trainer=cold).worker.run()
    for name, value in cold.statistics.items():
        np.testing.assert_array_equal(trainer.statistics[name], value, err_msg=name)


def test_the_worker_repushes_its_model_to_a_shard_that_lost_it_between_tasks() -> None:
    ps = FakePS(UpdateRule.ASYNC)
    rig = make_worker(TrainingMode(rule=UpdateRule.ASYNC), [training_task(1, 0, 8), training_task(2, 8, 16)], ps=ps)
    original = rig.coordinator.get_task

    def get_task() -> pb.Task:
        task = original()
        if task.id == 2:
            ps.lose_model(1)
        return task

    rig.coordinator.get_task = get_task  # type: ignore[method-assign]
    rig.worker.run()
    assert rig.worker.counters.reinitialised == 1
    assert [event[1] for event in ps.events if event[0] == "push_model"] == [[0, 1], [1]]
    assert [r.success for r in rig.coordinator.reports] == [True, True]


def test_the_worker_beats_while_it_works() -> None:
    rig = make_worker(TrainingMode(), [WAIT_TASK] * 3 + [training_task(1, 0, 8)])
    original = rig.coordinator.get_task

    def slow_get_task() -> pb.Task:
        time.sleep(0.03)
        return original()

    rig.coordinator.get_task = slow_get_task  # type: ignore[method-assign]
    rig.worker.run()
    assert rig.coordinator.heartbeats > 0


def test_the_loop_and_the_steps_import_no_tensorflow() -> None:
    code = (
        "import sys, elasticps.worker.training, elasticps.worker.steps, elasticps.worker.local_model;"
        "sys.exit('tensorflow' in sys.modules or 'keras' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_worker_says_goodbye_once_when_the_job_is_finished() -> None:
    rig = make_worker(TrainingMode(), [training_task(1, 0, 8)])
    rig.worker.run()
    assert rig.coordinator.left == 1
    assert rig.ps.kinds()[-2:] == ["report", "leave"]  # after its last report


def test_the_worker_says_goodbye_when_it_fails_too() -> None:
    trainer = FakeTrainer()
    trainer.fail_on_record = 4
    rig = make_worker(TrainingMode(), [training_task(1, 0, 8)], trainer=trainer)
    with pytest.raises(RuntimeError, match="boom"):
        rig.worker.run()
    assert rig.coordinator.left == 1


def test_a_goodbye_that_fails_is_not_an_error() -> None:
    rig = make_worker(TrainingMode(), [training_task(1, 0, 8)])
    rig.coordinator.fail_leave = True
    rig.worker.run()  # returns normally
    assert rig.coordinator.left == 1
    assert [r.success for r in rig.coordinator.reports] == [True]


def test_every_sync_minibatch_is_committed_once_in_its_own_round() -> None:
    rig = make_worker(TrainingMode(), [training_task(1, 0, 10), training_task(2, 10, 16)])
    rig.worker.run()
    commits = [event for event in rig.ps.events if event[0] == "commit"]
    assert [event[1] for event in commits] == [0, 1, 2, 3, 4]  # 3 + 2 minibatches, one round each
    assert [shard.version for shard in rig.ps.shards] == [5, 5]
    assert len(set(rig.ps.minibatches)) == 5


def test_each_sync_join_names_its_task_and_the_records_it_brings_in() -> None:
    rig = make_worker(TrainingMode(), [training_task(1, 0, 10), training_task(2, 10, 16)])
    rig.worker.run()
    # Minibatches of 4: task 1's 4, 8, 10 records; task 2's 4, 6.
    assert rig.coordinator.joined_tasks == [(1, 4), (1, 8), (1, 10), (2, 4), (2, 6)]
    assert [name.rsplit("/", 1)[1] for name in rig.ps.minibatches] == ["e0"] * 5  # each names its epoch


def test_a_task_whose_join_is_void_is_left_unreported_and_the_next_one_trained() -> None:
    rig = make_worker(TrainingMode(), [training_task(1, 0, 10), training_task(2, 10, 16)])
    rig.coordinator.answers = [pb.JOIN_OUTCOME_COMMITTED, pb.JOIN_OUTCOME_VOID]  # task 1 went back meanwhile
    rig.worker.run()
    assert [report.task_id for report in rig.coordinator.reports] == [2]
    assert rig.coordinator.joined_tasks == [(1, 4), (1, 8), (2, 4), (2, 6)]
    assert rig.worker.counters.rejected == 0
