"""Hostile and malformed input against real PS and coordinator servers over real gRPC (issue 13).

Every case sends one bad call and asserts its status code; a PS case then pulls the model and
compares its bytes (and the shard's optimizer state) with what they were before; a coordinator
case then asks ``GetJobStatus`` and checks every counter is finite, non-negative and bounded, and
that a good report is still taken. The cases are counted by ``test_the_number_of_cases``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.coordinator.requests import MAX_REJECTED
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

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION

GARBAGE = [b"\xff" * 11, b"\x0a\xff\xff\xff\xff\x0f", b"\x08"]  # none parses as any message

OPTIMIZERS: dict[str, pb.OptimizerConfig] = {
    "sgd": pb.OptimizerConfig(name="sgd", params={"learning_rate": 0.1}),
    "momentum": pb.OptimizerConfig(name="sgd", params={"learning_rate": 0.1, "momentum": 0.9, "nesterov": 1.0}),
    "adam": pb.OptimizerConfig(name="adam", params={"learning_rate": 0.01, "amsgrad": 1.0}),
    "adagrad": pb.OptimizerConfig(name="adagrad", params={"learning_rate": 0.1}),
    "rmsprop": pb.OptimizerConfig(name="rmsprop", params={"learning_rate": 0.1, "momentum": 0.5, "centered": 1.0}),
}
MODES = {"sync": UpdateRule.SYNC, "async": UpdateRule.ASYNC}


def model() -> dict[str, np.ndarray]:
    return {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "b": np.full(3, 0.5, np.float32)}


def state() -> dict[str, np.ndarray]:
    return {"bn/mean": np.zeros(3, np.float32)}


def grads(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"w": np.full((4, 3), scale, np.float32), "b": np.full(3, scale, np.float32)}


# ---- hand-built streams --------------------------------------------------------------------------


@dataclass(frozen=True)
class T:
    """One tensor as a peer claims it: metadata and the bytes it sends."""

    name: str
    dtype: int
    shape: Sequence[int]
    data: bytes
    state: bool = False


def t(name: str, value: np.ndarray, *, state: bool = False) -> T:
    wire = {np.float32: pb.DTYPE_FLOAT32, np.float64: pb.DTYPE_FLOAT64, np.int32: pb.DTYPE_INT32}
    return T(name, wire[value.dtype.type], list(value.shape), value.tobytes(), state)


def stream(head: pb.Frame, tensors: Sequence[T], split: int = 0) -> list[bytes]:
    """The serialized frames: head and metadata, then the payload (cut after ``split`` bytes)."""
    first = pb.Frame()
    first.CopyFrom(head)
    for tensor in tensors:
        first.tensors.add(name=tensor.name, dtype=tensor.dtype, shape=list(tensor.shape), state=tensor.state)  # type: ignore[arg-type]
    payload = b"".join(tensor.data for tensor in tensors)
    if not split:
        first.payload = payload
        return [first.SerializeToString()]
    first.payload = payload[:split]
    return [first.SerializeToString(), pb.Frame(payload=payload[split:]).SerializeToString()]


def push_head(version: int = 0, lr: float = 0.0, worker: str = "fuzz", minibatch: str = "") -> pb.Frame:
    return pb.Frame(push=pb.PushHead(worker=worker, version=version, learning_rate=lr, minibatch=minibatch))


def model_head(config: pb.OptimizerConfig | None = None, version: int = 0) -> pb.Frame:
    return pb.Frame(model=pb.ModelHead(initialized=True, version=version, optimizer=config or OPTIMIZERS["sgd"]))


def good_grads(scale: float = 1.0, with_state: bool = True) -> list[T]:
    g = grads(scale)
    out = [t("w", g["w"]), t("b", g["b"])]
    return out + [t("bn/mean", np.ones(3, np.float32), state=True)] if with_state else out


def whole_model(m: dict[str, np.ndarray] | None = None, s: dict[str, np.ndarray] | None = None) -> list[T]:
    m = model() if m is None else m
    s = state() if s is None else s
    return [t(n, v) for n, v in m.items()] + [t(n, v, state=True) for n, v in s.items()]


F32 = pb.DTYPE_FLOAT32
W, B = model()["w"], model()["b"]


@dataclass(frozen=True)
class PSCase:
    """A call to a PS holding ``model()``: the method, its request (frames or a message's bytes),
    the expected code; ``then_commit``: sync, the round is then dry-run and committed, each
    expected to be refused (the gradient was staged, its update is not finite)."""

    method: str
    request: list[bytes] | bytes
    code: grpc.StatusCode
    then_commit: bool = False
    modes: tuple[str, ...] = ("sync", "async")


PS_CASES: dict[str, PSCase] = {
    # ---- gradients: wrong dtypes, shapes, sizes, names, values
    "grad: float64 for a float32 variable": PSCase(
        "PushGradients", stream(push_head(), [t("w", W.astype(np.float64)), t("b", B)]), INVALID
    ),
    "grad: int32 for a float32 variable": PSCase(
        "PushGradients", stream(push_head(), [t("w", W.astype(np.int32)), t("b", B)]), INVALID
    ),
    "grad: unknown dtype enum": PSCase("PushGradients", stream(push_head(), [T("w", 99, [4, 3], W.tobytes())]), INVALID),
    "grad: transposed shape": PSCase("PushGradients", stream(push_head(), [t("w", W.T.copy()), t("b", B)]), INVALID),
    "grad: scalar for a vector": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), t("b", np.float32(1.0) * np.ones((), np.float32))]), INVALID
    ),
    "grad: negative dimension": PSCase("PushGradients", stream(push_head(), [T("w", F32, [-4, -3], W.tobytes())]), INVALID),
    "grad: huge claimed shape": PSCase("PushGradients", stream(push_head(), [T("w", F32, [2**40, 2**30], b"")]), INVALID),
    "grad: truncated payload": PSCase(
        "PushGradients", stream(push_head(), [T("w", F32, [4, 3], W.tobytes()[:-5]), t("b", B)]), INVALID
    ),
    "grad: truncated second frame": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), T("b", F32, [3], B.tobytes()[:7])], split=20), INVALID
    ),
    "grad: extra bytes": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), T("b", F32, [3], B.tobytes() + b"\0" * 4)]), INVALID
    ),
    "grad: unknown name": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), t("b", B), t("nope", B)]), INVALID
    ),
    "grad: a variable missing": PSCase("PushGradients", stream(push_head(), [t("w", W)]), INVALID),
    "grad: no tensors": PSCase("PushGradients", stream(push_head(), []), INVALID),
    "grad: a name twice": PSCase("PushGradients", stream(push_head(), [t("w", W), t("b", B), t("b", B)]), INVALID),
    "grad: an empty name": PSCase("PushGradients", stream(push_head(), [t("", W), t("b", B)]), INVALID),
    "grad: NaN": PSCase("PushGradients", stream(push_head(), [t("w", W * np.nan), t("b", B)]), INVALID),
    "grad: +Inf": PSCase("PushGradients", stream(push_head(), [t("w", W), t("b", B * np.inf)]), INVALID),
    "grad: -Inf": PSCase("PushGradients", stream(push_head(), [t("w", W - np.inf), t("b", B)]), INVALID),
    "grad: both a variable and state": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), t("b", B), t("b", B, state=True)]), INVALID
    ),
    "state: NaN": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), t("b", B), t("bn/mean", B * np.nan, state=True)]), INVALID
    ),
    "state: Inf": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), t("b", B), t("bn/mean", B * np.inf, state=True)]), INVALID
    ),
    "state: unknown name": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), t("b", B), t("bn/var", B, state=True)]), INVALID
    ),
    "state: wrong shape": PSCase(
        "PushGradients", stream(push_head(), [t("w", W), t("b", B), t("bn/mean", W, state=True)]), INVALID
    ),
    "state: wrong dtype": PSCase(
        "PushGradients",
        stream(push_head(), [t("w", W), t("b", B), t("bn/mean", B.astype(np.float64), state=True)]),
        INVALID,
    ),
    # ---- push heads
    "head: none": PSCase("PushGradients", stream(pb.Frame(), good_grads()), INVALID),
    "head: a model head": PSCase("PushGradients", stream(model_head(), good_grads()), INVALID),
    "head: negative version": PSCase("PushGradients", stream(push_head(version=-1), good_grads()), INVALID),
    "head: version -2**63": PSCase("PushGradients", stream(push_head(version=-(2**63)), good_grads()), INVALID),
    "head: NaN learning rate": PSCase("PushGradients", stream(push_head(lr=math.nan), good_grads()), INVALID),
    "head: Inf learning rate": PSCase("PushGradients", stream(push_head(lr=math.inf), good_grads()), INVALID),
    "head: negative learning rate": PSCase("PushGradients", stream(push_head(lr=-0.1), good_grads()), INVALID),
    "head: learning rate 1e30": PSCase("PushGradients", stream(push_head(lr=1e30), good_grads()), INVALID),
    "head: learning rate 1e5": PSCase("PushGradients", stream(push_head(lr=1e5), good_grads()), INVALID),
    "head: a 2000-character worker": PSCase("PushGradients", stream(push_head(worker="w" * 2000), good_grads()), INVALID),
    "head: a 2000-character minibatch": PSCase(
        "PushGradients", stream(push_head(minibatch="m" * 2000), good_grads()), INVALID
    ),
    # ---- streams that are not streams
    "stream: empty": PSCase("PushGradients", [], INVALID),
    "stream: a head after the first frame": PSCase(
        "PushGradients", stream(push_head(), good_grads(), split=8)[:1] + [push_head().SerializeToString()], INVALID
    ),
    "model stream: empty": PSCase("PushModel", [], INVALID),
    # ---- PushModel on an initialised shard
    "model: the same model again": PSCase("PushModel", stream(model_head(), whole_model()), OK),
    "model: the same model, another optimizer config": PSCase(
        "PushModel", stream(model_head(OPTIMIZERS["adam"]), whole_model()), OK
    ),
    "model: empty": PSCase("PushModel", stream(model_head(), []), PRECONDITION),
    "model: other shapes": PSCase(
        "PushModel", stream(model_head(), whole_model({"w": W.T.copy(), "b": B})), PRECONDITION
    ),
    "model: another dtype": PSCase(
        "PushModel", stream(model_head(), whole_model({"w": W.astype(np.float64), "b": B})), PRECONDITION
    ),
    "model: a variable more": PSCase(
        "PushModel", stream(model_head(), whole_model({**model(), "extra": B})), PRECONDITION
    ),
    "model: a variable less": PSCase("PushModel", stream(model_head(), whole_model({"w": W})), PRECONDITION),
    "model: other state": PSCase(
        "PushModel", stream(model_head(), whole_model(s={"bn/var": np.ones(3, np.float32)})), PRECONDITION
    ),
    "model: NaN initial value": PSCase(
        "PushModel", stream(model_head(), whole_model({"w": W * np.nan, "b": B})), INVALID
    ),
    "model: an integer variable": PSCase(
        "PushModel", stream(model_head(), whole_model({"w": W.astype(np.int32), "b": B})), INVALID
    ),
    "model: negative version": PSCase("PushModel", stream(model_head(version=-1), whole_model()), INVALID),
    "model: learning rate 1e30": PSCase(
        "PushModel", stream(model_head(pb.OptimizerConfig(name="sgd", params={"learning_rate": 1e30})), whole_model()),
        INVALID,
    ),
    "model: unknown optimizer": PSCase(
        "PushModel", stream(model_head(pb.OptimizerConfig(name="lion")), whole_model()), INVALID
    ),
    "model: a push head": PSCase("PushModel", stream(push_head(), whole_model()), INVALID),
    # ---- unary calls with odd fields
    "commit: a round ahead": PSCase("CommitRound", pb.CommitRequest(round=5, workers=["fuzz"]).SerializeToString(),
                                    PRECONDITION, modes=("sync",)),  # fmt: skip
    "commit: a worker twice": PSCase(
        "CommitRound", pb.CommitRequest(round=1, workers=["a", "a"]).SerializeToString(), PRECONDITION, modes=("sync",)
    ),
    "commit: async has no rounds": PSCase(
        "CommitRound", pb.CommitRequest(round=0, workers=["a"]).SerializeToString(), PRECONDITION, modes=("async",)
    ),
    "restore: no checkpoint": PSCase("RestoreShard", pb.RestoreRequest(version=3).SerializeToString(), PRECONDITION),
    "pull: negative wait": PSCase(
        "PullDense", pb.PullRequest(worker="w", version=0, wait_ms=-5).SerializeToString(), OK
    ),
}
for _i, _bytes in enumerate(GARBAGE):
    for _method in ("PullDense", "CommitRound", "DescribeShard", "RestoreShard"):
        PS_CASES[f"garbage {_i}: {_method}"] = PSCase(_method, _bytes, INVALID)
    for _method in ("PushGradients", "PushModel"):
        PS_CASES[f"garbage {_i}: {_method}"] = PSCase(_method, [_bytes], INVALID)

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
        path = f"/{frames.PS_SERVICE.full_name}/{method}"
        ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
        try:
            if method in ("PushGradients", "PushModel"):
                assert isinstance(request, list)
                reply = self.channel.stream_unary(path, ident, ident)(iter(request), timeout=30)
                return OK, [reply]
            assert isinstance(request, bytes)
            if method == "PullDense":
                return OK, list(self.channel.unary_stream(path, ident, ident)(request, timeout=30))
            return OK, [self.channel.unary_unary(path, ident, ident)(request, timeout=30)]
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            return err.code(), []

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

I64 = 2**63 - 1
COORDINATOR = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name


@dataclass(frozen=True)
class CoordCase:
    method: str
    request: bytes
    code: grpc.StatusCode
    sync: bool = False  # against a coordinator with rounds (JoinRound's fields)
    task: bool = False  # ``request`` is a TaskResult whose task_id is filled in with a held task
    repeat: int = 1


def report(**fields: object) -> bytes:
    return pb.TaskResult(**{"worker": "w1", "success": True, **fields}).SerializeToString()  # type: ignore[arg-type]


COORD_CASES: dict[str, CoordCase] = {
    "report: rejected INT64_MAX twice": CoordCase("ReportTask", report(rejected=I64, records=10), INVALID, task=True,
                                                  repeat=2),  # fmt: skip
    "report: rejected past the per-task bound": CoordCase(
        "ReportTask", report(rejected=MAX_REJECTED + 1, records=10), INVALID, task=True
    ),
    "report: negative rejected": CoordCase("ReportTask", report(rejected=-(10**18), records=10), INVALID, task=True),
    "report: records -1": CoordCase("ReportTask", report(records=-1), INVALID, task=True),
    "report: records INT64_MAX": CoordCase("ReportTask", report(records=I64), INVALID, task=True),
    "report: records other than the task's": CoordCase("ReportTask", report(records=11), INVALID, task=True),
    "report: NaN loss_sum": CoordCase("ReportTask", report(records=10, loss_sum=math.nan), INVALID, task=True),
    "report: Inf loss_sum": CoordCase("ReportTask", report(records=10, loss_sum=math.inf), INVALID, task=True),
    "report: -Inf loss_sum": CoordCase("ReportTask", report(records=10, loss_sum=-math.inf), INVALID, task=True),
    "report: loss_sum 1e308": CoordCase("ReportTask", report(records=10, loss_sum=1e308), INVALID, task=True),
    "report: metric_sums 1e308": CoordCase(
        "ReportTask", report(records=10, metric_sums={"acc": 1e308}), INVALID, task=True
    ),
    "report: metric_sums NaN": CoordCase("ReportTask", report(records=10, metric_sums={"acc": math.nan}), INVALID,
                                         task=True),  # fmt: skip
    "report: metric_sums -Inf": CoordCase(
        "ReportTask", report(records=10, metric_sums={"acc": -math.inf}), INVALID, task=True
    ),
    "report: 1000 metrics": CoordCase(
        "ReportTask", report(records=10, metric_sums={f"m{i}": 1.0 for i in range(1000)}), INVALID, task=True
    ),
    "report: an unnamed metric": CoordCase("ReportTask", report(records=10, metric_sums={"": 1.0}), INVALID, task=True),
    "report: negative model_version": CoordCase("ReportTask", report(records=10, model_version=-1), INVALID, task=True),
    "report: negative task_id": CoordCase("ReportTask", report(task_id=-1), INVALID),
    "report: no worker": CoordCase("ReportTask", pb.TaskResult(task_id=1).SerializeToString(), INVALID),
    "report: a 10000-character worker": CoordCase(
        "ReportTask", pb.TaskResult(worker="w" * 10000, task_id=1).SerializeToString(), INVALID
    ),
    "report: a 1 MB error (kept, cut)": CoordCase(
        "ReportTask", report(success=False, records=10, error="e" * 1_000_000), OK, task=True
    ),
    "report: an unknown task": CoordCase("ReportTask", report(task_id=10**12, rejected=5), OK),
    "get task: no worker": CoordCase("GetTask", pb.GetTaskRequest().SerializeToString(), INVALID),
    "get task: a 10000-character worker": CoordCase(
        "GetTask", pb.GetTaskRequest(worker="w" * 10000).SerializeToString(), INVALID
    ),
    "heartbeat: no worker": CoordCase("Heartbeat", pb.HeartbeatRequest().SerializeToString(), INVALID),
    "heartbeat: leaving, no worker": CoordCase(
        "Heartbeat", pb.HeartbeatRequest(leaving=True).SerializeToString(), INVALID
    ),
    "heartbeat: a 10000-character worker": CoordCase(
        "Heartbeat", pb.HeartbeatRequest(worker="w" * 10000).SerializeToString(), INVALID
    ),
    "join: async has no rounds": CoordCase("JoinRound", pb.JoinRequest(worker="w1").SerializeToString(), PRECONDITION),
    "join: no worker": CoordCase("JoinRound", pb.JoinRequest(version=0).SerializeToString(), INVALID, sync=True),
    "join: a 10000-character worker": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w" * 10000).SerializeToString(), INVALID, sync=True
    ),
    "join: negative version": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w1", version=-1).SerializeToString(), INVALID, sync=True
    ),
    "join: negative wait_ms": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w1", wait_ms=-1).SerializeToString(), INVALID, sync=True
    ),
    "join: wait_ms -2**31": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w1", wait_ms=-(2**31)).SerializeToString(), INVALID, sync=True
    ),
}
for _i, _bytes in enumerate(GARBAGE):
    for _method in ("GetTask", "ReportTask", "Heartbeat", "JoinRound", "GetJobStatus"):
        COORD_CASES[f"garbage {_i}: {_method}"] = CoordCase(_method, _bytes, INVALID)


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
        ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
        try:
            return OK, self.channel.unary_unary(f"/{COORDINATOR}/{method}", ident, ident)(request, timeout=30)
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            return err.code(), b""

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
