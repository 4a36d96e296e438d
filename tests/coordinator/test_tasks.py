"""The task queue (todo / doing / done per epoch) with a fake clock: coverage, failures, evaluation."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from queue_kit import Clock, make_queue

from elasticps.coordinator.tasks.base import Finished, QueueSettings, Task, TaskKind, Wait
from elasticps.coordinator.tasks.queue import TaskQueue


DEFAULTS: dict[str, object] = {"num_records": 100, "records_per_task": 10, "num_epochs": 1}


def queue(**settings: object) -> tuple[TaskQueue, Clock]:
    return make_queue(DEFAULTS, **settings)


def get_task(q: TaskQueue, worker: str, version: int = 0) -> Task:
    got = q.get(worker, version)
    assert isinstance(got, Task), got
    return got


def assert_exact_cover(ranges: list[tuple[int, int]], num_records: int) -> None:
    """The ranges tile [0, num_records) exactly: no gap, no overlap."""
    ordered = sorted(ranges)
    assert sum(end - start for start, end in ordered) == num_records
    position = 0
    for start, end in ordered:
        assert start == position, ordered
        assert end > start
        position = end
    assert position == num_records


# ---- coverage -------------------------------------------------------------------------------------


def test_every_record_is_trained_exactly_num_epochs_times_one_worker() -> None:
    q, _ = queue(num_records=1003, records_per_task=64, num_epochs=3)
    done: dict[int, list[tuple[int, int]]] = defaultdict(list)
    while True:
        got = q.get("w0", 0)
        if got is Finished.FINISHED:
            break
        assert isinstance(got, Task)
        assert got.kind is TaskKind.TRAINING
        assert q.report("w0", got.id, True, loss_sum=2.0 * got.records)
        done[got.epoch].append((got.start, got.end))
    assert sorted(done) == [0, 1, 2]
    for epoch_ranges in done.values():
        assert len(epoch_ranges) == 16  # ceil(1003 / 64)
        assert_exact_cover(epoch_ranges, 1003)
    progress = q.progress()
    assert progress.finished
    assert progress.epoch_records == (1003, 1003, 1003)
    assert progress.records_done == progress.records_total == 3009
    assert progress.loss == 2.0
    assert progress.tasks_requeued == 0


def test_epochs_are_cut_one_after_another() -> None:
    q, _ = queue(num_records=30, records_per_task=10, num_epochs=2)
    first = [get_task(q, f"w{i}") for i in range(3)]
    assert [t.epoch for t in first] == [0, 0, 0]
    assert q.progress().epoch == 0
    fourth = get_task(q, "w3")  # epoch 0's todo is empty: epoch 1's tasks are cut
    assert fourth.epoch == 1
    assert q.progress().epoch == 1


@pytest.mark.parametrize("seed", range(6))
def test_coverage_survives_failures_restarts_and_silent_workers(seed: int) -> None:
    """Random workers that succeed, fail, restart (ask again while holding) or go silent."""
    rng = random.Random(seed)
    num_records, epochs, timeout = 257, 3, 30.0
    q, clock = queue(num_records=num_records, records_per_task=16, num_epochs=epochs, task_timeout=timeout)
    workers = [f"w{i}" for i in range(4)]
    holding: dict[str, Task] = {}
    done: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for _ in range(20_000):
        clock.now += 1.0
        worker = rng.choice(workers)
        action = rng.random()
        if worker in holding and action < 0.6:
            task = holding.pop(worker)
            success = rng.random() < 0.8
            accepted = q.report(worker, task.id, success, loss_sum=1.0)
            if accepted and success:
                done[task.epoch].append((task.start, task.end))
        elif worker in holding and action < 0.7:
            holding.pop(worker)  # silent: lost its task, beats no more; the clock moves on
            clock.now += timeout + 1
        else:
            holding.pop(worker, None)  # asks again: whatever it held is requeued
            got = q.get(worker, 0)
            if isinstance(got, Task):
                holding[worker] = got
            elif got is Finished.FINISHED and not holding:
                break
    else:
        pytest.fail("the job never finished")
    assert q.finished
    assert sorted(done) == list(range(epochs))
    for epoch in range(epochs):
        assert_exact_cover(done[epoch], num_records)
    assert q.progress().epoch_records == (num_records,) * epochs
    assert q.tasks_requeued > 0


# ---- failure rules ---------------------------------------------------------------------------------


def test_worker_asking_again_while_holding_gets_its_task_back() -> None:
    q, _ = queue()
    held = get_task(q, "w1")
    get_task(q, "w2")
    again = get_task(q, "w1")
    assert again == held
    assert q.tasks_requeued == 1
    assert q.report("w1", held.id, True)
    assert q.progress().records_done == 10


def test_silent_workers_task_is_requeued_after_the_timeout_and_not_before() -> None:
    q, clock = queue(task_timeout=10.0)
    held = get_task(q, "silent")
    clock.now += 10.0  # exactly the timeout: not yet
    other = get_task(q, "w2")
    assert other != held
    assert q.tasks_requeued == 0
    assert q.report("w2", other.id, True)
    clock.now += 0.5  # now silent for 10.5 s > 10 s
    taken_over = get_task(q, "w2")
    assert taken_over == held
    assert q.tasks_requeued == 1
    # The silent worker's late report no longer counts; the new holder's does, once.
    assert q.report("silent", held.id, True) is False
    assert q.report("w2", held.id, True) is True
    assert q.progress().records_done == 20


def test_heartbeats_keep_a_task() -> None:
    q, clock = queue(task_timeout=10.0)
    held = get_task(q, "slow")
    for _ in range(5):
        clock.now += 8.0
        q.heartbeat("slow")
        task = get_task(q, "w2")
        assert task != held
        assert q.report("w2", task.id, True)
    assert q.tasks_requeued == 0
    assert q.report("slow", held.id, True)


def test_requeue_silent_without_anyone_asking() -> None:
    q, clock = queue(task_timeout=5.0)
    held = get_task(q, "w1")
    clock.now += 6.0
    q.requeue_silent()
    assert q.progress().tasks_requeued == 1
    assert get_task(q, "w2") == held


def test_failed_report_requeues_the_task() -> None:
    q, _ = queue()
    task = get_task(q, "w1")
    assert q.report("w1", task.id, False, rejected=3) is True
    assert q.tasks_requeued == 1
    assert q.gradients_rejected == 3
    assert q.progress().records_done == 0
    assert get_task(q, "w2") == task


def test_reports_of_other_workers_or_unknown_tasks_are_ignored() -> None:
    q, _ = queue()
    task = get_task(q, "w1")
    assert q.report("w2", task.id, True) is False
    assert q.report("w1", 9999, True) is False
    assert q.progress().records_done == 0
    assert q.report("w1", task.id, True) is True
    assert q.report("w1", task.id, True) is False  # twice: counted once
    assert q.progress().records_done == 10


def test_loss_is_the_mean_per_record_loss_of_the_latest_tasks() -> None:
    q, _ = queue(num_records=200, records_per_task=10)
    assert q.progress().loss != q.progress().loss  # NaN before any report
    for i in range(10):
        task = get_task(q, "w")
        q.report("w", task.id, True, loss_sum=float(i) * task.records)
    assert q.progress().loss == sum(range(2, 10)) / 8  # the last 8 tasks


def test_no_records_is_refused() -> None:
    with pytest.raises(ValueError):
        TaskQueue(QueueSettings(num_records=0, records_per_task=10, num_epochs=1), Clock())


# ---- WAIT and FINISHED ----------------------------------------------------------------------------


def test_wait_while_others_hold_the_last_tasks_then_finished() -> None:
    q, _ = queue(num_records=20, records_per_task=10)
    a = get_task(q, "w1")
    b = get_task(q, "w2")
    assert q.get("w3", 0) is Wait.WAIT
    assert q.report("w1", a.id, True)
    assert q.get("w3", 0) is Wait.WAIT
    assert not q.finished
    assert q.report("w2", b.id, False)  # failed: w3 takes it over
    taken = get_task(q, "w3")
    assert taken == b
    assert q.get("w1", 0) is Wait.WAIT
    assert q.report("w3", b.id, True)
    assert q.finished
    assert q.get("w1", 0) is Finished.FINISHED
    assert q.get("w2", 0) is Finished.FINISHED


# ---- evaluation ------------------------------------------------------------------------------------


def test_evaluation_starts_when_the_version_crosses_evaluation_steps() -> None:
    q, _ = queue(num_records=200, records_per_task=10, validation_records=25, evaluation_steps=5)
    for version in (0, 3, 4):
        task = get_task(q, "w1", version)
        assert task.kind is TaskKind.TRAINING
        q.report("w1", task.id, True)
    evaluations = [get_task(q, "w1", 5), get_task(q, "w2", 5), get_task(q, "w3", 6)]
    assert [t.kind for t in evaluations] == [TaskKind.EVALUATION] * 3
    assert [(t.start, t.end) for t in evaluations] == [(0, 10), (10, 20), (20, 25)]
    assert {t.model_version for t in evaluations} == {5}
    # Evaluation tasks go first; with all three handed out, training continues.
    assert get_task(q, "w4", 6).kind is TaskKind.TRAINING
    accuracy = {"w1": 0.5, "w2": 0.7, "w3": 0.9}
    for worker, task in zip(("w1", "w2", "w3"), evaluations):
        assert q.report(worker, task.id, True, metric_sums={"accuracy": accuracy[worker] * task.records, "loss": 2.0 * task.records})
        if worker != "w3":
            assert q.progress().metrics == {}  # only complete evaluations count
    progress = q.progress()
    assert progress.metrics == {"accuracy": (0.5 * 10 + 0.7 * 10 + 0.9 * 5) / 25, "loss": 2.0}
    assert progress.metrics["accuracy"] == pytest.approx(0.66)
    assert progress.metrics_version == 5
    # No new evaluation until the next multiple of 5.
    assert get_task(q, "w1", 9).kind is TaskKind.TRAINING
    assert get_task(q, "w2", 10).kind is TaskKind.EVALUATION


def test_a_jump_over_several_multiples_starts_one_evaluation() -> None:
    q, _ = queue(num_records=200, records_per_task=10, validation_records=10, evaluation_steps=5)
    get_task(q, "w1", 0)
    evaluation = get_task(q, "w2", 17)
    assert (evaluation.kind, evaluation.model_version) == (TaskKind.EVALUATION, 17)
    assert get_task(q, "w3", 17).kind is TaskKind.TRAINING
    q.report("w2", evaluation.id, True, metric_sums={"accuracy": 8.0})
    assert q.progress().metrics == {"accuracy": 0.8}
    assert get_task(q, "w2", 19).kind is TaskKind.TRAINING
    assert get_task(q, "w4", 20).kind is TaskKind.EVALUATION


def test_failed_evaluation_task_is_requeued_before_training() -> None:
    q, _ = queue(num_records=200, records_per_task=10, validation_records=10, evaluation_steps=5)
    evaluation = get_task(q, "w1", 5)
    assert evaluation.kind is TaskKind.EVALUATION
    q.report("w1", evaluation.id, False)
    assert get_task(q, "w2", 5) == evaluation


def test_final_evaluation_after_training_and_finished_only_after_it() -> None:
    q, _ = queue(num_records=30, records_per_task=10, validation_records=15)
    training = [get_task(q, w, 3) for w in ("w1", "w2", "w3")]
    assert all(t.kind is TaskKind.TRAINING for t in training)
    assert q.get("w4", 3) is Wait.WAIT  # training tasks held by others; no evaluation yet
    for worker, task in zip(("w1", "w2", "w3"), training):
        q.report(worker, task.id, True)
    assert q.training_done
    assert not q.finished
    first = get_task(q, "w1", 3)
    second = get_task(q, "w2", 3)
    assert (first.kind, second.kind) == (TaskKind.EVALUATION, TaskKind.EVALUATION)
    assert [(first.start, first.end), (second.start, second.end)] == [(0, 10), (10, 15)]
    assert first.model_version == second.model_version == 3
    assert q.get("w3", 3) is Wait.WAIT
    q.report("w1", first.id, True, metric_sums={"accuracy": 9.0})
    assert not q.finished
    assert q.get("w3", 3) is Wait.WAIT
    q.report("w2", second.id, True, metric_sums={"accuracy": 3.0})
    assert q.finished
    progress = q.progress()
    assert progress.finished
    assert progress.metrics == {"accuracy": 12.0 / 15}
    assert progress.metrics_version == 3
    assert q.get("w3", 3) is Finished.FINISHED


def test_without_validation_data_finished_right_after_training() -> None:
    q, _ = queue(num_records=10, records_per_task=10, evaluation_steps=1)
    task = get_task(q, "w1", 5)
    assert task.kind is TaskKind.TRAINING
    q.report("w1", task.id, True)
    assert q.finished
    assert q.get("w1", 7) is Finished.FINISHED
    assert q.progress().metrics == {}


def test_no_second_evaluation_of_a_model_already_evaluated() -> None:
    q, _ = queue(num_records=10, records_per_task=10, validation_records=10, evaluation_steps=4)
    task = get_task(q, "w1", 0)
    q.report("w1", task.id, True)  # training done at version 0; the model then reaches version 4
    evaluation = get_task(q, "w1", 4)  # the periodic evaluation of version 4
    assert (evaluation.kind, evaluation.model_version) == (TaskKind.EVALUATION, 4)
    q.report("w1", evaluation.id, True, metric_sums={"accuracy": 7.0})
    assert q.get("w1", 4) is Finished.FINISHED  # the final evaluation would see the same model
    assert q.progress().metrics == {"accuracy": 0.7}


def test_ledger_survives_a_restart() -> None:
    q, clock = queue(num_records=100, records_per_task=10, num_epochs=2)
    done = []
    for _ in range(3):
        done.append(get_task(q, "w1"))
        assert q.report("w1", done[-1].id, True)
    lost = get_task(q, "w2")  # in flight when PS 0 dies: not done, handed out again
    restarted = TaskQueue(QueueSettings(num_records=100, records_per_task=10, num_epochs=2), clock)
    restarted.restore(q.state())
    assert restarted.progress().epoch_records == (30,)  # the second epoch has not started
    ranges = [(t.start, t.end) for t in done]
    while True:
        got = restarted.get("w1", 0)
        if not isinstance(got, Task):
            break
        assert got.id > lost.id  # ids continue: a late report of a lost task matches nothing
        if got.epoch == 0:
            ranges.append((got.start, got.end))
        restarted.report("w1", got.id, True)
    assert_exact_cover(ranges, 100)
    assert restarted.finished and restarted.progress().epoch_records == (100, 100)


def test_a_ledger_saved_with_an_entry_for_every_epoch_is_still_read() -> None:
    q, clock = queue(num_records=100, records_per_task=10, num_epochs=3)
    task = get_task(q, "w1")
    assert q.report("w1", task.id, True)
    state = q.state()
    state["done"] = state["done"] + [[]] * (3 - len(state["done"]))  # the older, eager format
    restarted = TaskQueue(QueueSettings(num_records=100, records_per_task=10, num_epochs=3), clock)
    restarted.restore(state)
    assert restarted.progress().epoch_records == (10,)


def test_many_epochs_allocate_nothing_per_epoch_up_front() -> None:
    # numEpochs 1e12 used to end in a MemoryError here (a ledger entry per epoch, made eagerly).
    epochs = 10**12
    q, _ = queue(num_records=100, records_per_task=50, num_epochs=epochs)
    task = get_task(q, "w1")
    assert q.report("w1", task.id, True)
    progress = q.progress()
    assert (progress.epoch, progress.records_done, progress.records_total) == (0, 50, 100 * epochs)
    assert progress.epoch_records == (50,)
    assert len(q.state()["done"]) == 1
    assert not q.training_done


def test_ledger_of_other_settings_is_refused() -> None:
    q, clock = queue(num_records=100, records_per_task=10)
    other = TaskQueue(QueueSettings(num_records=100, records_per_task=20, num_epochs=1), clock)
    with pytest.raises(ValueError, match="saved for"):
        other.restore(q.state())


# ---- membership: what sync rounds count ------------------------------------------------------------


def test_live_workers_are_those_heard_from_within_the_task_timeout() -> None:
    q, clock = queue(task_timeout=10.0)
    get_task(q, "asks")  # a task request counts
    q.heartbeat("beats")
    assert q.live_workers() == {"asks", "beats"}
    clock.now += 6
    q.report("reports", 999, True)  # even a report of an unknown task counts as heard from
    clock.now += 4  # exactly the timeout since "asks" and "beats": still live
    assert q.live_workers() == {"asks", "beats", "reports"}
    clock.now += 0.5
    assert q.live_workers() == {"reports"}
    q.heartbeat("beats")
    assert q.live_workers() == {"reports", "beats"}


def test_a_leaving_worker_is_no_longer_live_and_its_task_goes_back_at_once() -> None:
    q, _ = queue(num_records=20, records_per_task=10)
    task = get_task(q, "a")
    get_task(q, "b")
    q.leave("a")
    assert q.live_workers() == {"b"}
    assert q.take_requeued_workers() == {"a"}
    assert q.tasks_requeued == 1
    again = get_task(q, "c")
    assert (again.start, again.end) == (task.start, task.end)
    q.leave("b")
    q.leave("never-seen")  # nothing to do
    assert q.live_workers() == {"c"}


def test_a_worker_that_leaves_without_a_task_requeues_nothing() -> None:
    q, _ = queue()
    q.heartbeat("a")
    q.leave("a")
    assert q.live_workers() == set()
    assert q.take_requeued_workers() == set()
    assert q.tasks_requeued == 0


def test_take_requeued_workers_names_each_requeue_once() -> None:
    q, clock = queue(task_timeout=10.0)
    failing = get_task(q, "fails")
    get_task(q, "silent")
    get_task(q, "restarts")
    assert q.take_requeued_workers() == set()
    q.report("fails", failing.id, False)
    get_task(q, "restarts")  # asks while holding a task: it restarted
    assert q.take_requeued_workers() == {"fails", "restarts"}
    assert q.take_requeued_workers() == set()
    q.heartbeat("fails")
    q.heartbeat("restarts")
    clock.now += 11
    q.heartbeat("fails")
    q.heartbeat("restarts")
    q.requeue_silent()
    assert q.take_requeued_workers() == {"silent"}


def test_everyone_live_can_train_while_tasks_are_left() -> None:
    q, _ = queue(num_records=30, records_per_task=10, num_epochs=2)
    get_task(q, "a")
    q.heartbeat("idle")
    assert q.can_train() == {"a", "idle"}


def test_in_the_last_epoch_with_nothing_left_only_holders_of_training_tasks_can_train() -> None:
    q, clock = queue(num_records=20, records_per_task=10, num_epochs=1, validation_records=10, task_timeout=10.0)
    first, second = get_task(q, "a"), get_task(q, "b")
    q.heartbeat("idle")
    assert q.can_train() == {"a", "b"}  # todo is empty, no epoch left: idle has no work
    q.report("a", first.id, True)
    assert q.can_train() == {"b"}
    clock.now += 11  # b fell silent: not live, cannot join a round any more
    q.heartbeat("a")
    assert q.can_train() == set()
    q.requeue_silent()  # b's task goes back: everyone live may take it
    assert q.can_train() == {"a"}
    q.report("a", get_task(q, "a").id, True)
    evaluation = get_task(q, "a")
    assert evaluation.kind is TaskKind.EVALUATION
    assert q.can_train() == set()  # an evaluation task is no training work


# ---- records applied by sync rounds (issue 35, Found 7) -------------------------------------------


def test_a_task_that_goes_back_after_rounds_applied_part_of_it_is_handed_out_from_there() -> None:
    q, clock = queue(num_records=40, records_per_task=10, task_timeout=10.0)
    held = get_task(q, "w1")
    q.applied("w1", held.id, 4)  # two rounds took its first two minibatches of 2
    assert q.progress().records_done == 4
    clock.now += 11  # w1 fell silent
    q.requeue_silent()
    assert not q.holds("w1", held.id)  # its next join hears the task is void
    rest = get_task(q, "w2")
    assert (rest.start, rest.end, rest.key, rest.epoch) == (held.start + 4, held.end, held.start, 0)
    assert rest.id > held.id
    q.applied("w1", held.id, 8)  # a late word on the void task counts nothing
    q.applied("w2", rest.id, 6)
    assert q.report("w2", rest.id, True)
    assert q.progress().records_done == 10  # 4 + 6: every record once
    assert q.state()["done"] == [[held.start]] and q.state()["partial"] == [[]]


def test_a_task_whose_every_record_was_applied_is_done_when_it_goes_back() -> None:
    q, _ = queue(num_records=10, records_per_task=10)
    held = get_task(q, "w1")
    q.applied("w1", held.id, 10)
    q.leave("w1")  # stopped before it could report
    assert q.training_done and q.progress().epoch_records == (10,)
    assert q.get("w2", 0) is Finished.FINISHED  # no validation data: nothing more to hand out


def test_applied_records_never_go_back_nor_past_the_task() -> None:
    q, _ = queue(num_records=10, records_per_task=10)
    held = get_task(q, "w1")
    q.applied("w1", held.id, 6)
    q.applied("w1", held.id, 2)  # an older round's word, heard late
    q.applied("w1", held.id, 10**12)
    assert q.progress().records_done == 10
    q.applied("w2", held.id, 4)  # not w2's task
    assert q.progress().records_done == 10


def test_a_restored_ledger_hands_out_a_partly_applied_task_from_its_first_record_not_applied() -> None:
    q, clock = queue(num_records=30, records_per_task=10)
    a, b = get_task(q, "w1"), get_task(q, "w2")
    q.applied("w1", a.id, 4)  # saved with the checkpoint of this round's version
    q.applied("w2", b.id, 10)  # every record of b applied, its report lost with PS 0
    state = q.state()
    restarted = TaskQueue(QueueSettings(num_records=30, records_per_task=10, num_epochs=1), clock)
    restarted.restore(state)
    assert restarted.progress().epoch_records == (14,)
    handed = []
    while isinstance(got := restarted.get("w3", 0), Task):
        handed.append((got.start, got.end, got.key))
        restarted.report("w3", got.id, True)
    assert sorted(handed) == sorted([(a.start + 4, a.end, a.start), *[(t, t + 10, t) for t in {0, 10, 20} - {a.start, b.start}]])
    assert restarted.finished and restarted.progress().epoch_records == (30,)


def test_a_ledger_whose_partial_task_lies_outside_it_is_refused() -> None:
    q, clock = queue(num_records=30, records_per_task=10)
    get_task(q, "w1")
    state = q.state()
    state["partial"] = [[[0, 11]]]
    with pytest.raises(ValueError, match="outside it"):
        TaskQueue(QueueSettings(num_records=30, records_per_task=10, num_epochs=1), clock).restore(state)


def test_a_ledger_rebuilt_from_a_shards_copy_hands_out_only_what_was_not_applied() -> None:
    q, _ = queue(num_records=30, records_per_task=10, num_epochs=2)
    # Epoch 0 done but for task 10 (4 records applied); epoch 1 begun with task 20 half applied.
    records = q.rebuild([(0, 0, 10, 3), (0, 10, 14, 5), (0, 20, 30, 4), (1, 20, 25, 9)])
    assert records == 29 and q.progress().epoch_records == (24, 5)
    handed = []
    while isinstance(got := q.get("w1", 0), Task):
        assert got.id > 9  # ids go on past every one the shard saw
        handed.append((got.epoch, got.start, got.end))
        q.report("w1", got.id, True)
    assert sorted(handed) == [(0, 14, 20), (1, 0, 10), (1, 10, 20), (1, 25, 30)]
    assert q.finished and q.progress().epoch_records == (30, 30)


@pytest.mark.parametrize(("advances", "why"), [
    ([(2, 0, 5, 1)], "epoch 2"), ([(0, 5, 8, 1)], "does not cut"), ([(0, 0, 11, 1)], "outside it"),
])  # fmt: skip
def test_a_shards_copy_that_does_not_fit_the_data_is_refused(advances: list[tuple[int, int, int, int]], why: str) -> None:
    q, _ = queue(num_records=30, records_per_task=10, num_epochs=2)
    with pytest.raises(ValueError, match=why):
        q.rebuild(advances)


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "aborted"])
def test_a_task_that_goes_back_while_a_round_commits_it_waits_for_the_rounds_outcome(committed: bool) -> None:
    q, clock = queue(num_records=10, records_per_task=10, task_timeout=10.0)
    held = get_task(q, "w1")
    q.applied("w1", held.id, 2)
    assert q.advance("w1", held.id, 4) == (0, 0, 4)  # a round bringing it to 4 is being committed
    clock.now += 11
    q.requeue_silent()  # w1 fell silent meanwhile: its task goes back, but not yet
    assert not q.holds("w1", held.id) and not q.report("w1", held.id, True)
    assert q.get("w2", 0) is Wait.WAIT  # nothing handed out while the round's outcome is open
    q.round_settled(committed)
    rest = get_task(q, "w2")
    assert (rest.start, rest.end) == ((4, 10) if committed else (2, 10))
    assert q.progress().records_done == (4 if committed else 2)
