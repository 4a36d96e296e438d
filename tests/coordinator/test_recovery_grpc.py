"""The coordinator rolls every shard and the ledger back after a shard restart: two real stores
checkpointing on disk, PS 0 reached in-process and shard 1 through a link whose process can be
replaced, the coordinator served over gRPC and a worker using the real CoordinatorClient."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from elasticps.api.optimizer import OptimizerConfig
from elasticps.coordinator.client import CoordinatorClient
from elasticps.coordinator.engine import Coordinator
from elasticps.coordinator.journal import Journals
from elasticps.coordinator.rounds import Rounds
from elasticps.coordinator.servicer import CoordinatorServicer
from elasticps.coordinator.servicer import add_to_server as add_coordinator
from elasticps.coordinator.shards import LedgerView, Shards, ShardView, TaskAdvance
from elasticps.coordinator.tasks.base import QueueSettings
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.main import LocalShard
from elasticps.ps.store import ParameterStore, StoreSettings

from replaceable_shard import Replaceable

SGD = OptimizerConfig("sgd", {"learning_rate": 0.1})
STEPS = 20


def settings(shard: int, tmp_path: Path) -> StoreSettings:
    return StoreSettings(shard=shard, checkpoint_dir=tmp_path, checkpoint_steps=STEPS, keep_checkpoint_max=3)


def weights(store: ParameterStore) -> dict[str, np.ndarray]:
    with store.reading() as (_, _, variables):
        return {n: v.copy() for n, v in variables.items()}


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_shard_restored_from_an_older_checkpoint_rolls_every_shard_and_the_ledger_back(
    grpc_servers: Callable[..., int], tmp_path: Path
) -> None:
    stores = [ParameterStore(settings(i, tmp_path)) for i in range(2)]
    for i, store in enumerate(stores):
        store.initialize({f"w{i}": np.zeros(2, dtype=np.float32)}, SGD)
    links = [LocalShard(stores[0]), Replaceable(stores[1])]
    shards = Shards(links)
    journals = Journals(tmp_path / "coordinator", keep=6)
    engine = Coordinator(
        QueueSettings(num_records=100, records_per_task=1, num_epochs=1, task_timeout=600.0),
        version_fn=lambda: stores[0].version,
        rounds=Rounds(grads_to_wait=1),
        shards=shards,
        journals=journals,
        checkpoint_steps=STEPS,
    )
    servicer = CoordinatorServicer(engine)
    port = grpc_servers(lambda s: add_coordinator(servicer, s))
    worker = CoordinatorClient(f"127.0.0.1:{port}", worker="w", deadline_s=20.0, timeout_s=20.0)
    try:
        engine.start()
        wait_for(lambda: engine.ready)
        done_at: dict[int, int] = {}  # version -> records done when the round making it committed
        held_at: dict[int, list[dict[str, np.ndarray]]] = {}
        current = [stores[1]]

        def one_round(incarnation: int) -> pb.Task:
            task = worker.get_task()
            assert task.type == pb.TASK_TYPE_TRAINING
            version = stores[0].version
            for i, store in enumerate([stores[0], current[0]]):
                grad = {f"w{i}": np.full(2, float(version % 7) - 3.0, dtype=np.float32)}
                assert store.push(grad, version, worker="w", incarnation=incarnation).accepted
            reply = worker.join_round(version, 5000)
            assert (reply.outcome, reply.version) == (pb.JOIN_OUTCOME_COMMITTED, version + 1)
            done_at[version + 1] = worker.status().records_done
            held_at[version + 1] = [weights(stores[0]), weights(current[0])]
            for store in stores:
                store.flush_checkpoints()
            worker.report(pb.TaskResult(task_id=task.id, success=True, records=task.end - task.start))
            return task

        for _ in range(45):
            one_round(0)
        assert [s.version for s in stores] == [45, 45]
        assert stores[0].checkpoint_versions() == stores[1].checkpoint_versions() == [40, 20]
        assert journals.versions() == [40, 20]
        assert worker.status().records_done == 45
        assert done_at[40] == 39  # the task whose round made version 40 was not reported yet

        # Shard 1's process is replaced: it starts from its newest checkpoint (40), with a new boot.
        restarted = ParameterStore(settings(1, tmp_path))
        assert restarted.restore()
        assert restarted.version == 40 and restarted.boot != stores[1].boot
        links[1].link = LocalShard(restarted)
        current[0] = restarted
        wait_for(lambda: engine.rollbacks == 1)

        for store in (stores[0], restarted):
            assert (store.version, store.incarnation) == (40, 1)
        for store, held in zip((stores[0], restarted), held_at[40]):  # the weights of version 40
            for name, value in held.items():
                np.testing.assert_array_equal(weights(store)[name], value, err_msg=name)
        status = worker.status()
        assert list(status.shard_versions) == [40, 40]
        assert status.records_done == done_at[40]
        assert status.shard_problem == ""

        # Gradients of the old incarnation are refused; training goes on under the new one, and
        # every record is trained (the ones after version 40 again).
        assert not stores[0].push({"w0": np.ones(2, dtype=np.float32)}, 40, worker="w", incarnation=0).accepted
        while True:
            task = worker.get_task()
            if task.type == pb.TASK_TYPE_FINISHED:
                break
            assert task.type == pb.TASK_TYPE_TRAINING
            version = stores[0].version
            for i, store in enumerate([stores[0], restarted]):
                grad = {f"w{i}": np.full(2, float(version % 7) - 3.0, dtype=np.float32)}
                assert store.push(grad, version, worker="w", incarnation=1).accepted
            assert worker.join_round(version, 5000).outcome == pb.JOIN_OUTCOME_COMMITTED
            worker.report(pb.TaskResult(task_id=task.id, success=True, records=task.end - task.start))
        status = worker.status()
        assert status.finished and status.records_done == 100
        assert [s.version for s in (stores[0], restarted)] == [40 + 100 - done_at[40]] * 2
    finally:
        engine.stop()
        worker.close()
        shards.close()


class Refusing:
    """A shard that lists a checkpoint it then cannot load (a file spoilt after it was verified)."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.asked = 0

    def commit(self, round_: int, workers: Sequence[str], dry_run: bool, tasks: Sequence[TaskAdvance] = (),
               restorable: int = 0) -> int:  # fmt: skip
        return round_

    def read_ledger(self) -> LedgerView:
        return LedgerView(0, False, ())

    def describe(self) -> ShardView:
        return ShardView(True, self.version, 1, 0, (20,))

    def roll_back(self, version: int, incarnation: int) -> ShardView:
        from elasticps.coordinator.shards import ShardRefused

        self.asked += 1
        raise ShardRefused(1, f"checkpoint ckpt-{version:012d}.eps: sha256 checksum mismatch (file corrupt)")


def test_a_restore_refused_again_and_again_fails_the_job_instead_of_being_asked_forever(tmp_path: Path) -> None:
    # Found 4 of issue 35: the coordinator asked a shard to restore a file it could not read 350
    # times in 3 minutes, the job frozen. Now the third refusal in a row gives up, with the reason.
    journals = Journals(tmp_path / "coordinator", keep=6)
    journals.write(20, {"incarnation": 0})
    links = [Refusing(30), Refusing(25)]
    engine = Coordinator(
        QueueSettings(num_records=100, records_per_task=1, num_epochs=1),
        version_fn=lambda: 25, rounds=Rounds(grads_to_wait=1), shards=Shards(links),
        journals=journals, checkpoint_steps=STEPS, recovery_deadline_s=5.0,
    )  # fmt: skip
    engine.start()
    try:
        wait_for(lambda: bool(engine.status().unrecoverable), 30.0)
        status = engine.status()
        assert status.unrecoverable.startswith("recovery failed 3 times in a row: ")
        assert "sha256 checksum mismatch" in status.unrecoverable
        assert not engine.ready  # no task is handed out on shards that cannot agree
        asked = sum(link.asked for link in links)
        assert asked == 3 * len(links)  # every shard asked, three times
        time.sleep(1.5)
        assert sum(link.asked for link in links) == asked  # and nothing is asked of them any more
    finally:
        engine.stop()
