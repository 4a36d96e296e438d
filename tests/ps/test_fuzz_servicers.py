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
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from bench import malformed
from bench.malformed import (
    COORD_CASES, COORDINATOR, F32, GARBAGE, I64, INVALID, OK, OPTIMIZERS, PRECONDITION, PS_SERVICE, T, Target,
    model_head, push_head, stream, t,
)  # fmt: skip
from elasticps import identity
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.coordinator.engine import Coordinator as Engine
from elasticps.coordinator.rounds import Rounds
from elasticps.coordinator.servicer import CoordinatorServicer
from elasticps.coordinator.servicer import add_to_server as add_coordinator
from elasticps.coordinator.shards import LedgerView, Shards, ShardView, TaskAdvance
from elasticps.coordinator.tasks.base import MAX_COUNT, QueueSettings
from elasticps.coordinator.tasks.queue import TaskQueue
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import PSClient, PushRequest
from elasticps.ps.servicer import ParameterServerServicer
from elasticps.ps.servicer import add_to_server as add_ps
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc import edges, frames
from elasticps.rpc.channels import create_channel
from elasticps.rpc.limits import ServerLimits

MODES = {"sync": UpdateRule.SYNC, "async": UpdateRule.ASYNC}


def model() -> dict[str, np.ndarray]:
    return {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "b": np.full(3, 0.5, np.float32)}


def state() -> dict[str, np.ndarray]:
    return {"bn/mean": np.zeros(3, np.float32)}


TARGET = Target("w", "b", "bn/mean", model()["w"], model()["b"], state()["bn/mean"])
PS_CASES = malformed.ps_cases(TARGET)


def good_grads(scale: float = 1.0) -> list[malformed.T]:
    return malformed.good_grads(TARGET, scale)


def whole_model(m: dict[str, np.ndarray] | None = None, s: dict[str, np.ndarray] | None = None) -> list[T]:
    return malformed.whole_model(TARGET, m, s)


def grads(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"w": np.full((4, 3), scale, np.float32), "b": np.full(3, scale, np.float32)}


W, B = model()["w"], model()["b"]


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
    servicer: ParameterServerServicer | None = None

    def call(self, method: str, request: Iterable[bytes] | bytes) -> tuple[grpc.StatusCode, list[bytes]]:
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
def make_shard(grpc_servers: Callable[..., int]) -> Iterator[Callable[..., Shard]]:
    channels: list[grpc.Channel] = []

    def make(mode: str, optimizer: str, limits: ServerLimits = ServerLimits()) -> Shard:
        store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=MODES[mode])))
        servicer = ParameterServerServicer(store, limits=limits)
        address = f"127.0.0.1:{grpc_servers(lambda s: add_ps(servicer, s))}"
        channel = create_channel(address)
        channels.append(channel)
        shard = Shard(store, address, channel, servicer)
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
        assert shard.call("PushModel", stream(model_head(), []))[0] is OK  # a shard the placement left empty
        assert shard.call("PushModel", stream(model_head(), []))[0] is OK
        assert shard.call("PushModel", stream(model_head(), whole_model()))[0] is OK  # the real model replaces it
        assert set(shard.pulled()[1]) == {"w", "b", "bn/mean"}
        assert shard.call("PushModel", stream(model_head(), []))[0] is PRECONDITION
    finally:
        shard.channel.close()


# ---- calls that wait: held open, they starve nothing ---------------------------------------------

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED
CANCELLED = grpc.StatusCode.CANCELLED
IDENT: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
PS_PATH = f"/{frames.PS_SERVICE.full_name}/"


class Held:
    """Calls a peer opens and keeps open: push streams that send their first frames and then stop
    (until released), and pulls that wait for a newer version. Each on its own connection's channel."""

    def __init__(self, address: str) -> None:
        self.channel = create_channel(address)
        self.released = threading.Event()
        self.calls: list[grpc.Future] = []

    def stream(self, method: str, sent: Sequence[bytes], then: Sequence[bytes] = ()) -> grpc.Future:
        """``sent`` now; ``then`` once released (a stream left half-sent until then)."""

        def requests() -> Iterator[bytes]:
            yield from sent
            self.released.wait(60)
            yield from then

        call = self.channel.stream_unary(PS_PATH + method, IDENT, IDENT).future(requests(), timeout=60)
        self.calls.append(call)
        return call

    def poll(self, version: int, wait_ms: int = 10_000) -> grpc.Future:
        request = pb.PullRequest(worker="poll", version=version, wait_ms=wait_ms).SerializeToString()
        call = self.channel.unary_stream(PS_PATH + "PullDense", IDENT, IDENT)(request, timeout=60)
        self.calls.append(call)
        return call

    def close(self) -> None:
        self.released.set()
        for call in self.calls:
            call.cancel()
        self.channel.close()


def code_of(call: grpc.Future) -> grpc.StatusCode:
    """The status a held call ended with (waits for its end)."""
    try:
        call.exception(timeout=60)
    except grpc.FutureCancelledError:
        return CANCELLED
    assert isinstance(call, grpc.Call)
    return call.code()


def until(what: Callable[[], bool], timeout_s: float = 30.0) -> None:
    give_up_at = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < give_up_at, "the server never got there"
        time.sleep(0.01)


@pytest.fixture
def held() -> Iterator[Callable[[str], Held]]:
    opened: list[Held] = []

    def open_(address: str) -> Held:
        opened.append(Held(address))
        return opened[-1]

    yield open_
    for h in opened:
        h.close()


def half_sent_push(version: int = 1) -> list[bytes]:
    """The first frame of a good push, its payload cut short: the rest never comes."""
    return stream(push_head(version=version), good_grads(), split=8)[:1]


def push_and_commit(shard: Shard, version: int, mode: str) -> None:
    code, _ = shard.call("PushGradients", stream(push_head(version=version), good_grads()))
    assert code is OK
    if mode == "sync":
        commit(shard, version, dry_run=True, expect=OK)
        commit(shard, version, dry_run=False, expect=OK)


@pytest.mark.parametrize("mode", MODES)
def test_120_half_sent_push_streams_held_open_starve_no_pull_or_push(
    make_shard: Callable[..., Shard], held: Callable[[str], Held], mode: str
) -> None:
    shard, reference = make_shard(mode, "adam"), make_shard(mode, "adam")
    assert shard.servicer is not None
    peer = held(shard.address)
    calls = [peer.stream("PushGradients", half_sent_push()) for _ in range(100)]
    calls += [peer.stream("PushModel", stream(model_head(), whole_model(), split=8)[:1]) for _ in range(20)]
    until(lambda: shard.servicer.in_flight()[0] == 120)  # type: ignore[union-attr]
    assert shard.pulled() == reference.pulled()  # a full pull, served
    push_and_commit(shard, 1, mode)  # a push, taken
    push_and_commit(reference, 1, mode)
    for call in calls:
        call.cancel()
    assert [code_of(call) for call in calls] == [CANCELLED] * 120
    until(lambda: shard.servicer.in_flight() == (0, 0))  # type: ignore[union-attr]
    assert shard.pulled() == reference.pulled()
    assert shard.everything() == reference.everything()


@pytest.mark.parametrize("mode", MODES)
def test_150_long_polls_held_starve_no_pull_or_push_and_all_answer_the_next_version(
    make_shard: Callable[..., Shard], held: Callable[[str], Held], mode: str
) -> None:
    shard, reference = make_shard(mode, "sgd"), make_shard(mode, "sgd")
    assert shard.servicer is not None
    peer = held(shard.address)
    polls = [peer.poll(version=1) for _ in range(150)]
    until(lambda: shard.servicer.in_flight()[1] == 150)  # type: ignore[union-attr]
    assert shard.pulled() == reference.pulled()
    push_and_commit(shard, 1, mode)  # version 2: every waiting pull answers it
    push_and_commit(reference, 1, mode)
    answers = [frames.decode(list(poll)) for poll in polls]
    assert {a.first.model.version for a in answers} == {2}
    new = reference.pulled()[1]
    assert all({n: v.tobytes() for n, v in {**a.tensors, **a.state}.items()} == new for a in answers)
    until(lambda: shard.servicer.in_flight() == (0, 0))  # type: ignore[union-attr]
    assert shard.everything() == reference.everything()


def test_past_the_limits_a_call_is_resource_exhausted_and_the_rest_is_served(
    make_shard: Callable[..., Shard], held: Callable[[str], Held]
) -> None:
    shard = make_shard("async", "adam", ServerLimits(max_push_streams=4, max_long_polls=3))
    assert shard.servicer is not None
    before, everything = shard.pulled(), shard.everything()
    peer = held(shard.address)
    streams = [peer.stream("PushGradients", half_sent_push()) for _ in range(4)]
    polls = [peer.poll(version=1) for _ in range(3)]
    until(lambda: shard.servicer.in_flight() == (4, 3))  # type: ignore[union-attr]
    assert shard.call("PushGradients", stream(push_head(version=1), good_grads()))[0] is EXHAUSTED
    assert shard.call("PushModel", stream(model_head(), whole_model()))[0] is EXHAUSTED
    assert code_of(peer.poll(version=1)) is EXHAUSTED
    assert shard.pulled() == before and shard.everything() == everything  # pulls that do not wait: served
    for call in streams + polls:
        call.cancel()
    until(lambda: shard.servicer.in_flight() == (0, 0))  # type: ignore[union-attr]
    assert shard.pulled() == before and shard.everything() == everything
    assert shard.call("PushGradients", stream(push_head(version=1), good_grads()))[0] is OK


@pytest.mark.parametrize("mode", MODES)
def test_a_stalled_stream_is_cut_off_at_its_deadline_and_nothing_is_applied(
    make_shard: Callable[..., Shard], held: Callable[[str], Held], mode: str
) -> None:
    shard = make_shard(mode, "momentum", ServerLimits(stream_idle_s=0.3))
    assert shard.servicer is not None
    before, everything = shard.pulled(), shard.everything()
    peer = held(shard.address)
    rest = stream(push_head(version=1), good_grads(), split=8)[1:]
    stalled = peer.stream("PushGradients", half_sent_push(), then=rest)
    assert code_of(stalled) is DEADLINE  # cut off by the server: the client never finished
    until(lambda: shard.servicer.in_flight() == (0, 0))  # type: ignore[union-attr]
    assert shard.pulled() == before and shard.everything() == everything and shard.store.version == 1


def test_a_stream_that_drips_past_its_whole_deadline_is_cut_off(
    make_shard: Callable[..., Shard], held: Callable[[str], Held]
) -> None:
    shard = make_shard("async", "sgd", ServerLimits(stream_idle_s=30, stream_deadline_s=0.5))
    before, everything = shard.pulled(), shard.everything()
    first, rest = stream(push_head(version=1), good_grads(), split=1)
    payload = pb.Frame.FromString(rest).payload

    def dripping() -> Iterator[bytes]:
        yield first
        for i in range(len(payload)):  # a byte a tenth of a second: never idle, never done in time
            time.sleep(0.1)
            yield pb.Frame(payload=payload[i : i + 1]).SerializeToString()

    code, _ = shard.call("PushGradients", dripping())
    assert code is DEADLINE
    assert shard.pulled() == before and shard.everything() == everything


HUGE = [64 << 20]  # 256 MiB of float32 declared; only the head is ever sent
OVERSIZED: dict[str, tuple[str, list[bytes], grpc.StatusCode]] = {
    "push: an unknown variable of 256 MiB": ("PushGradients", stream(push_head(version=1), [T("nope", F32, HUGE, b"")]),
                                             INVALID),  # fmt: skip
    "push: a known variable claiming 256 MiB": ("PushGradients", stream(push_head(version=1), [T("w", F32, HUGE, b""),
                                                t("b", B)]), INVALID),  # fmt: skip
    "push: an unknown state tensor of 256 MiB": ("PushGradients", stream(push_head(version=1), [
        t("w", W), t("b", B), T("bn/var", F32, HUGE, b"", state=True)]), INVALID),  # fmt: skip
    "model: a bigger model on an initialised shard": ("PushModel", stream(model_head(), whole_model({
        "w": W, "b": B, "big": np.zeros(0, np.float32)}) + [T("huge", F32, HUGE, b"")]), PRECONDITION),  # fmt: skip
}


@pytest.mark.parametrize("case", list(OVERSIZED))
def test_an_oversized_stream_is_refused_at_its_head_while_still_open(
    make_shard: Callable[..., Shard], held: Callable[[str], Held], case: str
) -> None:
    shard = make_shard("async", "adam")
    before, everything = shard.pulled(), shard.everything()
    method, sent, expected = OVERSIZED[case]
    call = held(shard.address).stream(method, sent)  # the head only: the payload would follow if taken
    assert code_of(call) is expected
    assert shard.pulled() == before and shard.everything() == everything


def test_a_first_model_over_max_model_bytes_is_refused_at_its_head(
    grpc_servers: Callable[..., int], held: Callable[[str], Held]
) -> None:
    store = ParameterStore(StoreSettings(shard=0))
    servicer = ParameterServerServicer(store, limits=ServerLimits(max_model_bytes=1024))
    address = f"127.0.0.1:{grpc_servers(lambda s: add_ps(servicer, s))}"
    big = whole_model({"w": np.zeros((16, 16), np.float32), "b": B})  # 1,036 bytes with b and the state
    call = held(address).stream("PushModel", stream(model_head(), big, split=8)[:1])
    assert code_of(call) is INVALID
    assert not store.initialized
    shard = Shard(store, address, create_channel(address), servicer)
    try:
        assert shard.call("PushModel", stream(model_head(), whole_model()))[0] is OK  # a model under the cap
    finally:
        shard.channel.close()


def test_the_ps_client_retries_a_resource_exhausted_push_until_a_slot_is_free(
    make_shard: Callable[..., Shard], held: Callable[[str], Held]
) -> None:
    shard = make_shard("async", "sgd", ServerLimits(max_push_streams=2, stream_idle_s=1.0))
    assert shard.servicer is not None
    peer = held(shard.address)
    stalled = [peer.stream("PushGradients", half_sent_push()) for _ in range(2)]
    until(lambda: shard.servicer.in_flight()[0] == 2)  # type: ignore[union-attr]
    client = PSClient([shard.address], worker="w1", deadline_s=60)
    try:
        pushed = client.push(PushRequest(grads(), versions=[1], state={"bn/mean": np.ones(3, np.float32)})).result()
    finally:
        client.close()
    assert pushed.all_accepted and pushed.versions == [2]
    assert [code_of(call) for call in stalled] == [DEADLINE, DEADLINE]


# ---- the coordinator under test ------------------------------------------------------------------


class StillShard:
    """A shard link that never moves (the sync coordinator is never made ready here)."""

    def commit(self, round_: int, workers: Sequence[str], dry_run: bool, tasks: Sequence[TaskAdvance] = (),
               restorable: int = 0) -> int:  # fmt: skip
        return round_

    def read_ledger(self) -> LedgerView:
        return LedgerView(0, False, ())

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
        servicer = CoordinatorServicer(Engine(settings, version_fn=lambda: 0, rounds=rounds, shards=shards))
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


def test_150_waiting_joins_starve_no_coordinator_call_and_one_more_is_resource_exhausted(
    grpc_servers: Callable[..., int]
) -> None:
    settings = QueueSettings(num_records=40, records_per_task=10, num_epochs=2)
    engine = Engine(settings, version_fn=lambda: 0, rounds=Rounds(grads_to_wait=1000), shards=Shards([StillShard()]))
    servicer = CoordinatorServicer(engine, ServerLimits(max_long_polls=150))
    address = f"127.0.0.1:{grpc_servers(lambda s: add_coordinator(servicer, s))}"
    c, joiners = Coordinator(create_channel(address)), create_channel(address)
    engine.start()
    try:
        until(lambda: c.call("GetTask", pb.GetTaskRequest(worker="w1").SerializeToString())[0] is OK)
        join = joiners.unary_unary(f"/{COORDINATOR}/JoinRound", IDENT, IDENT)
        # A round of 1000, and w1 took a task and never joins: the round cannot close, every join waits.
        joins = [join.future(pb.JoinRequest(worker=f"j{i}", version=0, wait_ms=10_000).SerializeToString(), timeout=60)
                 for i in range(150)]  # fmt: skip
        until(lambda: servicer.waiting_joins == 150)
        one_more = join.future(pb.JoinRequest(worker="j150", version=0, wait_ms=10_000).SerializeToString(), timeout=60)
        assert code_of(one_more) is EXHAUSTED
        task = c.task("w2")
        assert c.call("Heartbeat", pb.HeartbeatRequest(worker="w2").SerializeToString())[0] is OK
        code, _ = c.call("ReportTask", pb.TaskResult(worker="w2", task_id=task.id, success=True, records=10,
                                                     loss_sum=20.0).SerializeToString())  # fmt: skip
        assert code is OK
        status = c.status()
        assert_sane(status)
        assert status.records_done == 10
        engine.stop()  # the waiting joins answer PENDING at once
        replies = [pb.JoinReply.FromString(j.result(timeout=60)) for j in joins]
        assert {r.outcome for r in replies} == {pb.JOIN_OUTCOME_PENDING}
        assert servicer.waiting_joins == 0
    finally:
        engine.stop()
        joiners.close()
        c.channel.close()


def test_the_rejected_counter_saturates() -> None:
    queue = TaskQueue(QueueSettings(num_records=40, records_per_task=10, num_epochs=1), clock=lambda: 0.0)
    for _ in range(3):
        task = queue.get("w", 0)
        assert not isinstance(task, str)
        queue.report("w", task.id, True, rejected=I64)  # type: ignore[union-attr]
    assert queue.progress().gradients_rejected == MAX_COUNT


# ---- the same calls from a stranger (issue 35): a server with the job's key hears none of them -----------
KEY = bytes(range(32))


@pytest.fixture
def keyed_job(grpc_servers: Callable[..., int]) -> Iterator[Callable[[str], tuple[ParameterStore, Engine, str]]]:
    """``(store, engine, address)``: a shard holding the model (one update applied) and a
    coordinator on one server that has the job's key."""

    def make(mode: str) -> tuple[ParameterStore, Engine, str]:
        store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=MODES[mode])))
        store.initialize(model(), OptimizerConfig("adam", {"learning_rate": 0.01}), state=state())
        store.push(grads(0.5), 0, 0.0, "worker-0", "worker-0/0/0", state={"bn/mean": np.ones(3, np.float32)})
        if mode == "sync":
            store.commit(0, ["worker-0"])
        settings = QueueSettings(num_records=40, records_per_task=10, num_epochs=2)
        engine = Engine(settings, version_fn=lambda: store.version)

        def register(server):  # type: ignore[no-untyped-def]
            add_ps(ParameterServerServicer(store), server)
            add_coordinator(CoordinatorServicer(engine), server)

        return store, engine, f"127.0.0.1:{grpc_servers(register, verifier=identity.Verifier(KEY))}"

    return make


def arrays(store: ParameterStore) -> dict[str, bytes]:
    return {k: np.ascontiguousarray(v).tobytes() for k, v in store.snapshot().arrays.items()}


@pytest.mark.parametrize(("case", "mode"), PS_IDS, ids=[f"{c}-{m}" for c, m in PS_IDS])
def test_a_strangers_ps_call_is_unauthenticated_and_changes_nothing(
    keyed_job: Callable[[str], tuple[ParameterStore, Engine, str]], case: str, mode: str
) -> None:
    store, _, address = keyed_job(mode)
    before, version = arrays(store), store.version
    spec = PS_CASES[case]
    channel = create_channel(address, "")  # no token: a stranger who knows the port
    try:
        code, _ = malformed.call(channel, PS_SERVICE, spec.method, spec.request)
    finally:
        channel.close()
    assert code is grpc.StatusCode.UNAUTHENTICATED
    assert arrays(store) == before and store.version == version


@pytest.mark.parametrize("case", list(COORD_CASES))
def test_a_strangers_coordinator_call_is_unauthenticated_and_changes_nothing(
    keyed_job: Callable[[str], tuple[ParameterStore, Engine, str]], case: str
) -> None:
    _, engine, address = keyed_job("async")
    spec = COORD_CASES[case]
    forged = identity.token_for(bytes(range(1, 33)), "worker-0")  # another job's token
    channel = create_channel(address, forged)
    try:
        for _ in range(spec.repeat):
            code, _ = malformed.call(channel, COORDINATOR, spec.method, spec.request)
            assert code is grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    status = engine.status()
    assert (status.progress.records_done, status.progress.tasks_requeued, status.live_workers) == (0, 0, 0)


def test_the_number_of_cases(capsys: pytest.CaptureFixture[str]) -> None:
    waiting = 2 * len(MODES) + 1 + len(MODES) + 1 + len(OVERSIZED) + 1 + 1 + 1  # held calls, limits, deadlines, sizes
    strangers = len(PS_IDS) + len(COORD_CASES)
    n = len(PS_IDS) + len(OVERFLOW_IDS) + len(COORD_CASES) + waiting + 4 + strangers
    with capsys.disabled():
        print(f"\nfuzz cases: {n} ({len(PS_IDS)} PS calls, {len(OVERFLOW_IDS)} overflowing updates, "
              f"{len(COORD_CASES)} coordinator calls, {waiting} held, stalled or oversized calls, 4 more, "
              f"{strangers} of them again from a stranger)")  # fmt: skip
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
