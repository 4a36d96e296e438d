"""Export tasks in the task queue: handed after training and the final evaluation on a settled
model, to one worker, requeued when it dies or fails, and the job finished only after it."""

from __future__ import annotations

import json

from queue_kit import Clock, make_queue

from elasticps.coordinator.tasks.base import ExportFailure, Finished, Task, TaskKind, Wait
from elasticps.coordinator.tasks.queue import TaskQueue


DEFAULTS: dict[str, object] = {"num_records": 40, "records_per_task": 10, "num_epochs": 1, "export": True}


def queue(**settings: object) -> tuple[TaskQueue, Clock]:
    return make_queue(DEFAULTS, **settings)


def train_all(q: TaskQueue, worker: str = "w0", version: int = 4) -> None:
    """Hands out and reports every training task (and nothing else)."""
    while True:
        got = q.get(worker, version)
        assert isinstance(got, Task) and got.kind is TaskKind.TRAINING, got
        q.report(worker, got.id, True, loss_sum=1.0)
        if q.training_done:
            return


def test_no_output_no_export_task() -> None:
    q, _ = queue(export=False)
    train_all(q)
    assert q.get("w0", 4, settled=4) is Finished.FINISHED
    assert q.progress().export_version == -1


def test_final_export_after_training_and_final_evaluation_on_a_settled_model() -> None:
    q, _ = queue(validation_records=20)
    train_all(q)
    assert not q.awaiting_final_export  # the final evaluation comes first
    evaluations = [q.get("w0", 4), q.get("w1", 4)]
    assert all(isinstance(t, Task) and t.kind is TaskKind.EVALUATION for t in evaluations)
    assert q.get("w2", 4, settled=4) is Wait.WAIT  # evaluation still running: no export yet
    for worker, task in zip(("w0", "w1"), evaluations):
        assert isinstance(task, Task)
        q.report(worker, task.id, True, metric_sums={"accuracy": 9.0})
    assert q.awaiting_final_export and not q.finished
    assert q.get("w0", 4, settled=None) is Wait.WAIT  # the shards disagree: wait
    export = q.get("w0", 4, settled=4)
    assert isinstance(export, Task) and export.kind is TaskKind.EXPORT and export.final
    assert export.model_version == 4
    assert not q.awaiting_final_export
    assert q.get("w1", 4, settled=4) is Wait.WAIT  # one export, one worker
    assert not q.finished
    assert q.report("w0", export.id, True, model_version=4)
    assert q.finished
    assert q.get("w1", 4, settled=4) is Finished.FINISHED
    progress = q.progress()
    assert (progress.export_version, progress.export_final) == (4, True)


def test_final_export_without_validation_data() -> None:
    q, _ = queue()
    train_all(q)
    assert q.awaiting_final_export
    export = q.get("w0", 4, settled=4)
    assert isinstance(export, Task) and export.kind is TaskKind.EXPORT
    assert q.report("w0", export.id, True, model_version=4) and q.finished


def test_export_of_a_dead_worker_goes_to_another() -> None:
    q, clock = queue(task_timeout=10.0)
    train_all(q)
    export = q.get("w0", 4, settled=4)
    assert isinstance(export, Task)
    clock.now += 5
    q.heartbeat("w1")
    assert q.get("w1", 4, settled=4) is Wait.WAIT  # w0 still beats within the timeout
    clock.now += 6  # w0 silent past the timeout (killed mid-export)
    again = q.get("w1", 4, settled=4)
    assert isinstance(again, Task) and again.id == export.id and again.final and again.model_version == 4
    assert not q.report("w0", export.id, True)  # a late report of the dead worker is refused
    assert not q.finished
    assert q.report("w1", again.id, True, model_version=4) and q.finished
    assert q.progress().tasks_requeued == 1


def test_failed_export_is_requeued_and_a_restarted_worker_loses_it() -> None:
    q, _ = queue()
    train_all(q)
    export = q.get("w0", 4, settled=4)
    assert isinstance(export, Task)
    assert q.report("w0", export.id, False)  # failed (disk full, ...): back to the queue
    again = q.get("w1", 4)  # requeued: handed without asking the shards again
    assert isinstance(again, Task) and again.id == export.id
    restarted = q.get("w1", 4)  # w1 asks again while holding it: it restarted, the task goes back
    assert isinstance(restarted, Task) and restarted.id == export.id
    assert not q.finished
    q.leave("w1")  # left mid-export: back again
    last = q.get("w2", 4)
    assert isinstance(last, Task) and last.id == export.id
    assert q.report("w2", last.id, True, model_version=4) and q.finished


def test_an_export_the_output_refuses_every_attempt_fails_the_job() -> None:
    q, _ = queue(export_attempts=3)
    train_all(q)
    export = q.get("w0", 4, settled=4)
    assert isinstance(export, Task)
    assert q.report("w0", export.id, False, export_failed=True, error="OSError: no bucket 1")
    again = q.get("w1", 4)
    assert isinstance(again, Task) and again.id == export.id  # retried, on any worker
    q.report("w1", again.id, False, error="Stopped: stopped by signal SIGTERM")  # the worker's fault: not counted
    again = q.get("w0", 4)
    assert isinstance(again, Task) and again.id == export.id
    q.report("w0", again.id, False, export_failed=True, error="OSError: no bucket 2")
    assert q.progress().export_failure is None
    again = q.get("w0", 4)
    assert isinstance(again, Task) and again.id == export.id
    q.report("w0", again.id, False, export_failed=True, error="OSError: no bucket 3")
    assert q.progress().export_failure == ExportFailure(version=4, final=True, attempts=3, error="OSError: no bucket 3")
    assert q.get("w1", 4, settled=4) is Wait.WAIT  # nothing more is handed out: the job fails
    assert not q.finished


def test_a_periodic_export_refused_every_attempt_fails_the_job_too() -> None:
    q, _ = queue(num_records=100, export_steps=5, export_attempts=2)
    first = q.get("w0", 0)
    assert isinstance(first, Task)
    q.report("w0", first.id, True)
    for attempt in (1, 2):
        export = q.get("w0", 6)
        assert isinstance(export, Task) and export.kind is TaskKind.EXPORT and not export.final
        q.report("w0", export.id, False, export_failed=True, error=f"PermissionError: {attempt}")
    assert q.progress().export_failure == ExportFailure(version=6, final=False, attempts=2, error="PermissionError: 2")
    assert q.get("w0", 7) is Wait.WAIT


def test_export_failed_on_a_training_task_counts_nothing() -> None:
    q, _ = queue(export_attempts=1)
    task = q.get("w0", 0)
    assert isinstance(task, Task) and task.kind is TaskKind.TRAINING
    q.report("w0", task.id, False, export_failed=True, error="x")
    assert q.progress().export_failure is None


def test_periodic_exports_every_k_versions_one_at_a_time() -> None:
    q, _ = queue(num_records=100, export_steps=5)
    first = q.get("w0", 0)
    assert isinstance(first, Task) and first.kind is TaskKind.TRAINING
    q.report("w0", first.id, True)
    export = q.get("w0", 6)  # crossed 5: an export is handed before training tasks
    assert isinstance(export, Task) and export.kind is TaskKind.EXPORT and not export.final
    assert export.model_version == 6
    train = q.get("w1", 12)  # crossed 10 while the first export runs: none queued meanwhile
    assert isinstance(train, Task) and train.kind is TaskKind.TRAINING
    q.report("w0", export.id, True, model_version=7)  # the worker wrote the version it pulled
    assert (q.progress().export_version, q.progress().export_final) == (7, False)
    q.report("w1", train.id, True)
    second = q.get("w1", 16)
    assert isinstance(second, Task) and second.kind is TaskKind.EXPORT and second.model_version == 16
    assert q.get("w0", 17).kind is TaskKind.TRAINING  # type: ignore[union-attr]  # one export at a time


def test_periodic_exports_stop_with_training_and_the_final_one_wins() -> None:
    q, _ = queue(export_steps=2)
    train_all(q, version=1)
    assert q.get("w0", 9, settled=9).final  # type: ignore[union-attr]  # no periodic export after training


def test_export_progress_survives_a_restart_of_the_coordinator() -> None:
    q, _ = queue()
    train_all(q)
    export = q.get("w0", 4, settled=4)
    assert isinstance(export, Task)
    state = json.loads(json.dumps(q.state()))
    restarted, _ = queue()
    restarted.restore(state)
    assert restarted.awaiting_final_export  # the export in flight was lost with PS 0: handed again
    again = restarted.get("w1", 4, settled=4)
    assert isinstance(again, Task) and again.final and again.id > export.id
    restarted.report("w1", again.id, True, model_version=4)
    done = json.loads(json.dumps(restarted.state()))
    final, _ = queue()
    final.restore(done)
    assert final.finished and final.progress().export_version == 4


def test_a_ledger_saved_before_exports_existed_still_restores() -> None:
    q, _ = queue()
    state = q.state()
    for key in ("last_export_trigger", "final_export_done", "exported"):
        del state[key]
    fresh, _ = queue()
    fresh.restore(state)
    assert not fresh.finished
