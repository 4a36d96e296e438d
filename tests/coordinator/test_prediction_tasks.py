"""Prediction tasks in the task queue: cut after training, the final evaluation and the final
export, on the settled model; at once for a job that only predicts; requeued when their worker
fails, restarts or goes silent; each counted once; the job finished only when every one is."""

from __future__ import annotations

import json

import pytest

from queue_kit import Clock, make_queue

from elasticps.coordinator.tasks.base import Finished, Task, TaskKind, Wait
from elasticps.coordinator.tasks.queue import TaskQueue


DEFAULTS: dict[str, object] = {
    "num_records": 40, "records_per_task": 10, "num_epochs": 1, "export": True, "prediction_records": 25,
}


def queue(**settings: object) -> tuple[TaskQueue, Clock]:
    return make_queue(DEFAULTS, **settings)


def take(q: TaskQueue, kind: TaskKind, worker: str = "w0", version: int = 4, settled: int | None = 4) -> Task:
    got = q.get(worker, version, settled)
    assert isinstance(got, Task) and got.kind is kind, got
    return got


def train_all(q: TaskQueue, worker: str = "w0", version: int = 4) -> None:
    while not q.training_done:
        task = take(q, TaskKind.TRAINING, worker, version, settled=None)
        q.report(worker, task.id, True, loss_sum=1.0)


def predict_all(q: TaskQueue, worker: str = "w0", version: int = 4) -> list[Task]:
    done = []
    while not q.prediction_done:
        task = take(q, TaskKind.PREDICTION, worker, version)
        assert q.report(worker, task.id, True)
        done.append(task)
    return done


def test_prediction_comes_after_training_the_final_evaluation_and_the_final_export() -> None:
    q, _ = queue(validation_records=10)
    assert q.progress().prediction_records == 25 and q.progress().records_predicted == 0
    train_all(q)
    evaluation = take(q, TaskKind.EVALUATION)
    assert q.get("w1", 4, settled=4) is Wait.WAIT  # the final evaluation runs: nothing else yet
    q.report("w0", evaluation.id, True, metric_sums={"accuracy": 9.0})
    export = take(q, TaskKind.EXPORT, "w0")
    assert q.get("w1", 4, settled=4) is Wait.WAIT  # the export is written before any prediction
    assert not q.awaiting_settled
    q.report("w0", export.id, True, model_version=4)
    assert q.awaiting_settled  # the prediction tasks need the settled version
    assert q.get("w1", 4, settled=None) is Wait.WAIT  # the shards disagree: wait
    first = take(q, TaskKind.PREDICTION, "w1")
    assert (first.start, first.end, first.model_version) == (0, 10, 4)  # the exported version, in record order
    assert not q.awaiting_settled
    rest = [take(q, TaskKind.PREDICTION, w) for w in ("w0", "w2")]
    assert [(t.start, t.end) for t in rest] == [(10, 20), (20, 25)]
    assert q.get("w3", 4) is Wait.WAIT and not q.finished
    for worker, task in zip(("w1", "w0", "w2"), [first, *rest]):
        assert q.report(worker, task.id, True)
    assert q.finished and q.get("w0", 4) is Finished.FINISHED
    assert q.progress().records_predicted == 25


def test_prediction_without_an_output_follows_the_final_evaluation() -> None:
    q, _ = queue(export=False)
    train_all(q)
    assert q.awaiting_settled
    assert q.get("w0", 4, settled=None) is Wait.WAIT
    assert [t.model_version for t in predict_all(q)] == [4, 4, 4]
    assert q.finished


def test_not_finished_until_every_prediction_task_is_reported() -> None:
    q, _ = queue(export=False)
    train_all(q)
    tasks = [take(q, TaskKind.PREDICTION, f"w{i}") for i in range(3)]
    for i, task in enumerate(tasks[:2]):
        q.report(f"w{i}", task.id, True)
        assert not q.finished
    q.report("w2", tasks[2].id, True)
    assert q.finished


def test_a_failed_or_lost_prediction_task_is_handed_out_again_and_counted_once() -> None:
    q, clock = queue(export=False, task_timeout=10.0)
    train_all(q)
    failed = take(q, TaskKind.PREDICTION, "w0")
    assert q.report("w0", failed.id, False)  # failed: back to the queue, first
    again = take(q, TaskKind.PREDICTION, "w1")
    assert again == failed
    restarted = take(q, TaskKind.PREDICTION, "w2")
    assert take(q, TaskKind.PREDICTION, "w2") == restarted  # w2 asked again holding it: it restarted
    silent = take(q, TaskKind.PREDICTION, "w3")
    clock.now += 11  # w3 says nothing past the timeout
    q.heartbeat("w1")
    q.heartbeat("w2")
    q.requeue_silent()
    assert take(q, TaskKind.PREDICTION, "w4") == silent
    assert q.report("w3", silent.id, True) is False  # the silent worker's late report is not its any more
    for worker, task in (("w1", again), ("w2", restarted), ("w4", silent)):
        assert q.report(worker, task.id, True)
    assert q.finished and q.progress().records_predicted == 25
    assert q.tasks_requeued == 3


def test_a_job_that_only_predicts_cuts_its_tasks_at_once() -> None:
    q, _ = queue(num_records=0, export=True, validation_records=0, evaluation_steps=5)
    assert not q.awaiting_settled  # no shard version is needed: the model comes from a file
    tasks = predict_all(q, version=0)
    assert [(t.start, t.end, t.model_version) for t in tasks] == [(0, 10, 0), (10, 20, 0), (20, 25, 0)]
    assert q.finished and q.get("w0", 0) is Finished.FINISHED
    progress = q.progress()
    assert (progress.records_done, progress.records_total, progress.export_version) == (0, 0, -1)
    assert progress.epoch_records == ()  # no epoch was started


def test_nothing_to_train_and_nothing_to_predict_is_refused() -> None:
    with pytest.raises(ValueError, match="no records"):
        queue(num_records=0, prediction_records=0)


def test_a_restored_queue_predicts_what_was_not_reported() -> None:
    q, _ = queue(export=False)
    train_all(q)
    first, second = take(q, TaskKind.PREDICTION), take(q, TaskKind.PREDICTION, "w1")
    q.report("w0", first.id, True)
    saved = json.loads(json.dumps(q.state()))  # second is in flight when PS 0 restarts
    restored, _ = queue(export=False)
    restored.restore(saved)
    assert restored.progress().records_predicted == 10
    left = predict_all(restored, version=4)
    assert sorted((t.start, t.model_version) for t in left) == [(10, 4), (20, 4)]
    assert second.start in {t.start for t in left}
    assert restored.finished


def test_a_ledger_saved_before_predictions_existed_restores() -> None:
    q, _ = queue(export=False)
    train_all(q)
    saved = q.state()
    del saved["prediction_version"], saved["predicted"]
    restored, _ = queue(export=False)
    restored.restore(saved)
    assert restored.training_done and len(predict_all(restored)) == 3
