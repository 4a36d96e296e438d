"""Hostile and malformed input against real PS and coordinator servers over real gRPC (issue 13).

Every case sends one bad call and asserts its status code; a PS case then pulls the model and
compares its bytes (and the shard's optimizer state) with what they were before; a coordinator
case then asks ``GetJobStatus`` and checks every counter is finite, non-negative and bounded, and
that a good report is still taken. The cases are counted by ``test_the_number_of_cases``. They
are built in ``bench/malformed.py``, which the soak's fuzzer (``bench/soak.py``) sends too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from bench import malformed
from bench.malformed import (
    COORD_CASES, COORDINATOR, GARBAGE, I64, INVALID, OK, OPTIMIZERS, PRECONDITION, PS_SERVICE, Target, model_head,
    push_head, stream, t,
)  # fmt: skip
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.coordinator.rounds import Rounds
from elasticps.coordinator.servicer import CoordinatorServicer
from elasticps.coordinator.servicer import add_to_server as add_coordinator
from elasticps.coordinator.shards import Shards, ShardView
from elasticps.coordinator.tasks import MAX_COUNT, QueueSettings, TaskQueue
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.servicer import ParameterServerServicer
from elasticps.ps.servicer import add_to_server as add_ps
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc import edges, frames
from elasticps.rpc.channels import create_channel

MODES = {"sync": UpdateRule.SYNC, "async": UpdateRule.ASYNC}


def model() -> dict[str, np.ndarray]:
    return {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "b": np.full(3, 0.5, np.float32)}


def state() -> dict[str, np.ndarray]:
    return {"bn/mean": np.zeros(3, np.float32)}


TARGET = Target("w", "b", "bn/mean", model()["w"], model()["b"], state()["bn/mean"])
PS_CASES = malformed.ps_cases(TARGET)


def good_grads(scale: float = 1.0) -> list[malformed.T]:
    return malformed.good_grads(TARGET, scale)


def whole_model() -> list[malformed.T]:
    return malformed.whole_model(TARGET)


# A finite gradient whose update overflows, in every optimizer and mode: refused as a whole.
OVERFLOW: dict[str, tuple[float, float]] = {"3e38 at lr 10": (3e38, 10.0), "1e35 at lr 1e4": (1e35, 1e4),
                                            "float32 max at lr 1e4": (3.4e38, 1e4)}  # fmt: skip

PS_IDS = [(name, mode) for name, case in PS_CASES.items() for mode in case.modes]
OVERFLOW_IDS = [(g, o, m) for g in OVERFLOW for o in OPTIMIZERS for m in MODES]


# ---- the PS under test ---------------------------------------------------------------------------


@dataclass
class Shard:
    store: ParameterStore
    address: str
    channel: grpc.Channel

    def call(self, method: str, request: list[bytes] | bytes) -> tuple[grpc.StatusCode, list[bytes]]:
        return malformed.call(self.channel, PS_SERVICE, method, request)

    def pulled(self) -> tuple[bytes, dict[str, bytes]]:
        """The model as a pull sends it (head version and every tensor's bytes)."""
        code, replies = self.call("PullDense", pb.PullRequest(worker="check", version=-1).SerializeToString())
        assert code is OK
        decoded = frames.decode(replies)
        tensors = {n: v.tobytes() for n, v in {**decoded.tensors, **decoded.state}.items()}
        return decoded.first.model.SerializeToString(), tensors

    def everything(self) -> dict[str, bytes]:
        """Every array of the shard (variables, state, optimizer slots and steps), as bytes."""
        return {k: np.ascontiguousarray(v).tobytes() for k, v in self.store.snapshot().arrays.items()}


@pytest.fixture
def make_shard(grpc_servers: Callable[..., int]) -> Iterator[Callable[[str, str], Shard]]:
    channels: list[grpc.Channel] = []

    def make(mode: str, optimizer: str) -> Shard:
        store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=MODES[mode])))
        servicer = ParameterServerServicer(store)
        address = f"127.0.0.1:{grpc_servers(lambda s: add_ps(servicer, s))}"
        channel = create_channel(address)
        channels.append(channel)
        shard = Shard(store, address, channel)
        code, _ = shard.call("PushModel", stream(model_head(OPTIMIZERS[optimizer]), whole_model()))
        assert code is OK
        # One good update first, so the optimizer's slots and steps hold something to keep.
        code, _ = shard.call("PushGradients", stream(push_head(), good_grads(0.5)))
        assert code is OK
        if mode == "sync":
            commit(shard, 0, dry_run=True, expect=OK)
            commit(shard, 0, dry_run=False, expect=OK)
        assert store.version == 1
        return shard

    yield make
    for channel in channels:
        channel.close()


def commit(shard: Shard, round_: int, dry_run: bool, expect: grpc.StatusCode) -> None:
    request = pb.CommitRequest(round=round_, workers=["fuzz"], dry_run=dry_run).SerializeToString()
    code, _ = shard.call("CommitRound", request)
    assert code is expect


def assert_all_finite(shard: Shard) -> None:
    for key, value in shard.store.snapshot().arrays.items():
        if value.dtype.kind == "f":
            assert np.isfinite(value).all(), key


@pytest.mark.parametrize(("case", "mode"), PS_IDS, ids=[f"{c}-{m}" for c, m in PS_IDS])
def test_a_bad_ps_call_is_refused_and_the_model_is_unchanged(
    make_shard: Callable[[str, str], Shard], case: str, mode: str
) -> None:
    shard = make_shard(mode, "adam")
    before, everything = shard.pulled(), shard.everything()
    spec = PS_CASES[case]
    code, _ = shard.call(spec.method, spec.request)
    assert code is spec.code
    assert shard.pulled() == before
    assert shard.everything() == everything
    assert_all_finite(shard)
    # The shard still serves: a good push is taken.
    code, _ = shard.call("PushGradients", stream(push_head(version=1), good_grads()))
    assert code is OK


@pytest.mark.parametrize(("gradient", "optimizer", "mode"), OVERFLOW_IDS, ids=["-".join(i) for i in OVERFLOW_IDS])
def test_a_finite_push_whose_update_is_not_finite_is_refused_as_a_whole(
    make_shard: Callable[[str, str], Shard], gradient: str, optimizer: str, mode: str
) -> None:
    shard = make_shard(mode, optimizer)
    before, everything = shard.pulled(), shard.everything()
    value, lr = OVERFLOW[gradient]
    # "b" overflows, "w" (first in the stream) would not: nothing of the push may be applied.
    tensors = [t("w", np.full((4, 3), 1e-3, np.float32)), t("b", np.full(3, value, np.float32)),
               t("bn/mean", np.full(3, 7.0, np.float32), state=True)]  # fmt: skip
    code, _ = shard.call("PushGradients", stream(push_head(version=1, lr=lr), tensors))
    if mode == "async":
        assert code is INVALID
    else:  # staged; the round's dry run computes it and refuses, so no shard applies it
        assert code is OK
        commit(shard, 1, dry_run=True, expect=PRECONDITION)
        commit(shard, 1, dry_run=False, expect=PRECONDITION)
    assert shard.pulled() == before
    assert shard.everything() == everything
    assert shard.store.version == 1
    assert_all_finite(shard)
    code, _ = shard.call("PushGradients", stream(push_head(version=1), good_grads()))
    assert code is OK
    if mode == "sync":
        commit(shard, 1, dry_run=True, expect=OK)
        commit(shard, 1, dry_run=False, expect=OK)
    assert shard.store.version == 2
    assert_all_finite(shard)


def test_an_empty_first_model_never_takes_the_place_of_the_real_one(make_shard: Callable[[str, str], Shard],
                                                                       grpc_servers: Callable[..., int]) -> None:  # fmt: skip
    store = ParameterStore(StoreSettings(shard=0))
    servicer = ParameterServerServicer(store)
    shard = Shard(store, "", create_channel(f"127.0.0.1:{grpc_servers(lambda s: add_ps(servicer, s))}"))
    try:
        assert shard.call("PushModel", stream(model_head(), []))[0] is OK  # a shard the sharder left empty
        assert shard.call("PushModel", stream(model_head(), []))[0] is OK
        assert shard.call("PushModel", stream(model_head(), whole_model()))[0] is OK  # the real model replaces it
        assert set(shard.pulled()[1]) == {"w", "b", "bn/mean"}
        assert shard.call("PushModel", stream(model_head(), []))[0] is PRECONDITION
    finally:
        shard.channel.close()


# ---- the coordinator under test ------------------------------------------------------------------


class StillShard:
    """A shard link that never moves (the sync coordinator is never made ready here)."""

    def commit(self, round_: int, workers: Sequence[str], dry_run: bool) -> int:
        return round_

    def describe(self) -> ShardView:
        return ShardView(True, 0, 1)

    def roll_back(self, version: int, incarnation: int) -> ShardView:
        return ShardView(True, version, 1, incarnation)


@dataclass
class Coordinator:
    channel: grpc.Channel
    versions: list[int] = field(default_factory=lambda: [0])

    def call(self, method: str, request: bytes) -> tuple[grpc.StatusCode, bytes]:
        code, replies = malformed.call(self.channel, COORDINATOR, method, request)
        return code, replies[0] if replies else b""

    def status(self) -> pb.JobStatus:
        code, reply = self.call("GetJobStatus", pb.JobStatusRequest().SerializeToString())
        assert code is OK
        return pb.JobStatus.FromString(reply)

    def task(self, worker: str = "w1") -> pb.Task:
        code, reply = self.call("GetTask", pb.GetTaskRequest(worker=worker).SerializeToString())
        assert code is OK
        return pb.Task.FromString(reply)


@pytest.fixture
def make_coordinator(grpc_servers: Callable[..., int]) -> Iterator[Callable[[bool], Coordinator]]:
    made: list[Coordinator] = []

    def make(sync: bool) -> Coordinator:
        settings = QueueSettings(num_records=40, records_per_task=10, num_epochs=2, validation_records=10,
                                 evaluation_steps=1)  # fmt: skip
        rounds, shards = (Rounds(), Shards([StillShard()])) if sync else (None, None)
        servicer = CoordinatorServicer(settings, version_fn=lambda: 0, rounds=rounds, shards=shards)
        address = f"127.0.0.1:{grpc_servers(lambda s: add_coordinator(servicer, s))}"
        coordinator = Coordinator(create_channel(address))
        made.append(coordinator)
        return coordinator

    yield make
    for coordinator in made:
        coordinator.channel.close()


def assert_sane(status: pb.JobStatus) -> None:
    for name in ("records_done", "records_total", "tasks_requeued", "gradients_rejected", "epoch", "live_workers",
                 "records_predicted", "prediction_records"):  # fmt: skip
        value = getattr(status, name)
        assert 0 <= value <= MAX_COUNT, (name, value)
    assert status.records_done <= status.records_total
    assert all(0 <= r <= status.records_total for r in status.epoch_records)
    assert math.isnan(status.loss) or abs(status.loss) <= 1e200  # NaN: no training task reported yet
    assert all(math.isfinite(v) and abs(v) <= 1e200 for v in status.metrics.values()), dict(status.metrics)


@pytest.mark.parametrize("case", list(COORD_CASES))
def test_a_bad_coordinator_call_is_refused_and_the_status_stays_sane(
    make_coordinator: Callable[[bool], Coordinator], case: str
) -> None:
    spec = COORD_CASES[case]
    c = make_coordinator(spec.sync)
    request = spec.request
    task = None
    if spec.task:
        task = c.task()
        result = pb.TaskResult.FromString(request)
        result.task_id = task.id
        request = result.SerializeToString()
    for _ in range(spec.repeat):
        code, _ = c.call(spec.method, request)
        assert code is spec.code
    if spec.sync:
        return  # never ready: its status asks nothing more of it
    assert_sane(c.status())
    # The coordinator goes on: the task (a failed report gave it back) is trained and reported.
    task = c.task("w2")
    code, _ = c.call("ReportTask", pb.TaskResult(worker="w2", task_id=task.id, success=True, records=task.end - task.start,
                                                 loss_sum=2.0 * (task.end - task.start)).SerializeToString())  # fmt: skip
    assert code is OK
    status = c.status()
    assert_sane(status)
    assert status.records_done >= 10


def test_the_rejected_counter_saturates() -> None:
    queue = TaskQueue(QueueSettings(num_records=40, records_per_task=10, num_epochs=1), clock=lambda: 0.0)
    for _ in range(3):
        task = queue.get("w", 0)
        assert not isinstance(task, str)
        queue.report("w", task.id, True, rejected=I64)  # type: ignore[union-attr]
    assert queue.progress().gradients_rejected == MAX_COUNT


def test_the_number_of_cases(capsys: pytest.CaptureFixture[str]) -> None:
    n = len(PS_IDS) + len(OVERFLOW_IDS) + len(COORD_CASES) + 4
    with capsys.disabled():
        print(f"\nfuzz cases: {n} ({len(PS_IDS)} PS calls, {len(OVERFLOW_IDS)} overflowing updates, "
              f"{len(COORD_CASES)} coordinator calls, 4 more)")  # fmt: skip
    assert n >= 200


def test_garbage_requests_log_one_line_per_method_not_a_traceback_each(
    make_shard: Callable[[str, str], Shard], make_coordinator: Callable[[bool], Coordinator],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setattr(edges, "UNDECODABLE_LOG", edges.RateLimitedLog(every_s=3600))
    shard, c = make_shard("async", "sgd"), make_coordinator(False)
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        for _ in range(5):
            assert shard.call("PullDense", GARBAGE[0])[0] is INVALID
            assert c.call("GetTask", GARBAGE[0])[0] is INVALID
            assert c.call("ReportTask", GARBAGE[1])[0] is INVALID
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted(r.getMessage().split(":")[0] for r in lines) == ["GetTask", "PullDense", "ReportTask"]
    assert not [r for r in caplog.records if r.exc_info or "deserializ" in r.getMessage()]


def test_the_rate_limited_log_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limited = edges.RateLimitedLog(every_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        assert limited.warn("m", "bad") and not limited.warn("m", "bad") and not limited.warn("m", "bad")
        assert limited.warn("other", "bad")
        now[0] = 11
        assert limited.warn("m", "bad")
    assert [r.getMessage() for r in caplog.records] == ["bad", "bad", "bad (2 more since the last such line)"]
